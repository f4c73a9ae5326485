"""A sampling profiler over every thread of this process, for the `bound` figure.

The emulator runs the functions, moto's server and the Kubernetes API in threads of one process, and cProfile
sees only the thread that enabled it. This samples every thread's stack (`sys._current_frames`) at a fixed
interval and counts, per thread group (the thread's name without its number), the functions on the stack
(inclusive) and at its top (exclusive): where wall time goes, thread by thread, waiting included.
"""

from __future__ import annotations

import re
import sys
import threading
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import FrameType

__all__ = ["Sampler"]

_NUMBER = re.compile(r"[-_ ]?\d+|\(.*\)$")
_IDLE = ("wait", "select", "poll", "accept", "sleep", "acquire", "_wait_for_tstate_lock", "readinto", "recv_into")


def _group(thread: threading.Thread | None) -> str:
    name = thread.name if thread is not None else "?"
    return _NUMBER.sub("", name) or name


def _label(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    for marker in ("site-packages/", "gpu_autoscaler/", "functions/", "agent/", "tests/", "benchmarks/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{code.co_name}"


class Sampler:
    """`with Sampler() as s: ...`, then `s.report()`."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.samples: Counter[str] = Counter()
        """Thread group → samples taken of it."""
        self.inclusive: dict[str, Counter[str]] = {}
        self.exclusive: dict[str, Counter[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            threads = {t.ident: t for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                group = _group(threads.get(ident))
                self.samples[group] += 1
                top = _label(frame)
                self.exclusive.setdefault(group, Counter())[top] += 1
                seen: set[str] = set()
                walk: FrameType | None = frame
                while walk is not None:
                    label = _label(walk)
                    if label not in seen:
                        seen.add(label)
                        self.inclusive.setdefault(group, Counter())[label] += 1
                    walk = walk.f_back

    def busy(self, group: str) -> int:
        """Samples of a group not parked in a wait (a lock, a socket, a sleep)."""
        return sum(n for label, n in self.exclusive.get(group, {}).items() if not label.endswith(_IDLE))

    def report(self, top: int = 25, groups: int = 8) -> str:
        """Shares of each group's samples: the sampler is itself starved on a loaded machine, so its ticks are
        not evenly spaced and counts are not seconds."""
        lines = ["sampled stacks by thread group (busy = not parked in a wait), % of the group's samples:"]
        ranked = sorted(self.samples, key=lambda g: -self.busy(g))[:groups]
        for group in ranked:
            lines.append(f"  {group:<40} {self.samples[group]:7d} samples, busy {self.busy(group):7d}")
        for group in ranked:
            total = self.samples[group] / 100
            lines.append(f"\n== {group}: on the stack ==")
            lines += [f"  {n / total:5.1f} %  {label}" for label, n in self.inclusive[group].most_common(top)]
            lines.append(f"-- {group}: at the top of the stack --")
            lines += [f"  {n / total:5.1f} %  {label}" for label, n in self.exclusive[group].most_common(12)]
        return "\n".join(lines)

"""A tier's packing remembered by what was asked: the same tier, the same pods, the same plan, packed once.

`binpack.pack` is a pure function of its arrays (demand, requests, and the kinds' allocatable, prices,
feasibility and limits), and consolidation asks it the same question over and over: every candidate whose
pods do not all fit on the free room of the nodes that stay sends its leftovers to the same tier, and a
quiet cluster is searched again on every interval with the same nodes. On the Alibaba replay four calls
in five repeated an earlier one, and the packer was 40 % of the policy's time. The memo keys on the
arrays' exact bytes (with dtype and shape), so a hit is the very question asked before; the plan is kept
and handed out as copies, so no caller can change what a later one gets. It belongs to one `Solver`, and
is bounded like the solver's other caches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.domain.packing.kinds import Opened

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from gpu_autoscaler.domain.packing.kinds import Kinds

__all__ = ["PACK_MEMO_BYTES", "PACK_MEMO_LIMIT", "PackMemo", "pack_key"]

PACK_MEMO_LIMIT = 4096
"""Plans kept at most; past it the memo starts again empty."""
PACK_MEMO_BYTES = 32 * 1024 * 1024
"""The questions' and plans' bytes kept at most: a warm packer keeps its solver between invocations, and one
question of a 10,000-pod document is ~100 KB (its feasibility: classes × offerings), so the count alone would let
a Lambda's memory fill; past it the memo starts again empty, and a question larger than it is not kept."""

_Key = tuple[tuple[str, tuple[int, ...], bytes] | None, ...]


def pack_key(demand: np.ndarray, req: np.ndarray, kinds: Kinds) -> _Key:
    """Everything a packer reads, as exact bytes: equal keys only for equal questions."""
    return tuple(
        None if a is None else (a.dtype.str, a.shape, a.tobytes())
        for a in (demand, req, kinds.cap, kinds.price, kinds.feasible, kinds.limit)
    )


class PackMemo:
    """`packer(demand, req, kinds)`, computed once per distinct question and packer."""

    def __init__(self, limit: int = PACK_MEMO_LIMIT, max_bytes: int = PACK_MEMO_BYTES) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self._plans: dict[tuple[object, _Key], list[Opened]] = {}
        self.hits = 0
        self.bytes = 0
        """What the kept questions and plans hold, roughly (their arrays' bytes)."""

    def clear(self) -> None:
        self._plans.clear()
        self.bytes = 0

    def __call__(self, packer: Callable[[np.ndarray, np.ndarray, Kinds], list[Opened]], demand: np.ndarray,
                 req: np.ndarray, kinds: Kinds) -> list[Opened]:
        asked = pack_key(demand, req, kinds)
        key = (packer, asked)
        found = self._plans.get(key)
        if found is None:
            found = _copied(packer(demand, req, kinds))
            size = sum(len(part[2]) for part in asked if part is not None) + sum(e.counts.nbytes for e in found)
            if len(self._plans) >= self.limit or self.bytes + size > self.max_bytes:
                self.clear()
            if size <= self.max_bytes:
                self._plans[key] = found
                self.bytes += size
        else:
            self.hits += 1
        return _copied(found)


def _copied(plan: list[Opened]) -> list[Opened]:
    return [Opened(e.kind, e.counts.copy(), e.copies) for e in plan]

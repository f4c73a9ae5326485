"""Per-thread environment variables and stdout, so several Lambda environments can run in one process.

Each Lambda execution environment has its own process: its own variables (`AWS_LAMBDA_FUNCTION_NAME`,
`POWERTOOLS_SERVICE_NAME`, …) and its own stdout (its log stream). The emulator runs many in one process
and concurrently (a drain may wait minutes for a replacement node that the fleet function is launching
meanwhile), so both are made thread-aware: `install()` replaces `os.environ` and `sys.stdout` with proxies
that read and write the real ones, except in a thread inside `scope(variables, stdout)`, which sees the
real variables overlaid with its own and writes its output to its own stream.

Outside a scope the proxies behave exactly as what they replace, so nothing else in the process notices.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["forget_foreign_logger", "install", "scope"]

_DELETED = object()
_install_lock = threading.Lock()
_targets = threading.local()
"""Each thread's stdout target, shared by every `_Stdout`: a logger that bound an earlier proxy (a test runner
may have put its own stream back in between) still writes where the thread's scope says."""


class _Environ(MutableMapping[str, str]):
    """`os.environ` with a per-thread overlay (set and deleted keys) over the process's variables."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real
        self._local = threading.local()

    def _overlay(self) -> dict[str, Any] | None:
        overlay: dict[str, Any] | None = getattr(self._local, "overlay", None)
        return overlay

    def __getitem__(self, key: str) -> str:
        overlay = self._overlay()
        if overlay is not None and key in overlay:
            value = overlay[key]
            if value is _DELETED:
                raise KeyError(key)
            return str(value)
        return self.real[key]

    def __setitem__(self, key: str, value: str) -> None:
        overlay = self._overlay()
        if overlay is None:
            self.real[key] = value
        else:
            overlay[key] = value

    def __delitem__(self, key: str) -> None:
        overlay = self._overlay()
        if overlay is None:
            del self.real[key]
            return
        if key not in self:
            raise KeyError(key)
        overlay[key] = _DELETED

    def __iter__(self) -> Iterator[str]:
        overlay = self._overlay()
        if overlay is None:
            yield from self.real
            return
        yield from (k for k in self.real if overlay.get(k, None) is not _DELETED)
        yield from (k for k, v in overlay.items() if k not in self.real and v is not _DELETED)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def copy(self) -> dict[str, str]:
        return dict(self)

    def __repr__(self) -> str:
        return f"environ({dict(self)!r})"

    @contextlib.contextmanager
    def overlaid(self, variables: dict[str, str]) -> Iterator[None]:
        previous = self._overlay()
        self._local.overlay = {**(previous or {}), **variables}
        try:
            yield
        finally:
            self._local.overlay = previous


class _Stdout:
    """`sys.stdout` that writes to the thread's own stream inside a scope, else to the stream it replaced."""

    def __init__(self, real: TextIO) -> None:
        self.real = real

    def _target(self) -> TextIO:
        target: TextIO | None = getattr(_targets, "target", None)
        chosen = target if target is not None else self.real
        # The stream replaced may since have been closed (a test runner's capture): the process's own then.
        return sys.__stdout__ if getattr(chosen, "closed", False) and sys.__stdout__ is not None else chosen

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)

    @contextlib.contextmanager
    def redirected(self, stream: TextIO) -> Iterator[None]:
        previous = getattr(_targets, "target", None)
        _targets.target = stream
        try:
            yield
        finally:
            _targets.target = previous


def install() -> tuple[_Environ, _Stdout]:
    """Replace `os.environ` and `sys.stdout` with the thread-aware proxies (once per process)."""
    with _install_lock:
        if not isinstance(os.environ, _Environ):
            os.environ = _Environ(os.environ)  # type: ignore[assignment]  # noqa: B003 (an overlay, not a reset)
        if not isinstance(sys.stdout, _Stdout):
            sys.stdout = _Stdout(sys.stdout)
        return os.environ, sys.stdout  # type: ignore[return-value]


@contextlib.contextmanager
def scope(variables: dict[str, str], stdout: TextIO) -> Iterator[None]:
    """In this thread only: these variables over the process's, and stdout to `stdout`."""
    environ, out = install()
    with environ.overlaid(variables), out.redirected(stdout):
        yield


def forget_foreign_logger(service: str) -> None:
    """Make a service's logger as a fresh process would: unconfigured. Powertools configures a service's logger
    once per process (its `init` mark) with a handler bound to the stdout of that moment, and every later Logger of
    the service reuses it; in Lambda each environment is its own process, so the first Logger a handler makes is
    always new. Here a logger made outside every environment (a test importing a handler directly, while the test
    runner's capture was stdout) would carry that stream into the environment, and its log would go there instead
    of the environment's stream. Loggers bound to the proxy are left alone: they were made in an environment, and
    one of them may be logging right now."""
    logger = logging.getLogger(service)
    if not getattr(logger, "init", False):
        return
    streams = [getattr(handler, "stream", None) for handler in logger.handlers]
    if all(isinstance(stream, _Stdout) for stream in streams):
        return
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    for attribute in ("init", "powertools_handler", "powertools_buffer_config"):
        if hasattr(logger, attribute):
            delattr(logger, attribute)

"""`domain.pod_events.EventRecorder` in memory: keeps every event it is given, for tests to read back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.domain.pod_events import Recorded

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.domain.pod_events import PodEvent

__all__ = ["MemoryEventRecorder"]


class MemoryEventRecorder:
    def __init__(self) -> None:
        self.posted: list[PodEvent] = []

    def record(self, events: Sequence[PodEvent], *, time_left: Callable[[], float] | None = None) -> Recorded:
        self.posted += events
        return Recorded(written=len(events))

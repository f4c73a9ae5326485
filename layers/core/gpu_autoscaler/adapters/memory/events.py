"""`domain.pod_events.EventRecorder` in memory: keeps every event it is given, for tests to read back."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpu_autoscaler.domain.pod_events import PodEvent

__all__ = ["MemoryEventRecorder"]


class MemoryEventRecorder:
    def __init__(self) -> None:
        self.posted: list[PodEvent] = []

    def record(self, events: Sequence[PodEvent]) -> int:
        self.posted += events
        return len(events)

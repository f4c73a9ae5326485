"""The launch and drain queues in one process: messages kept in order with the moment they become visible."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.models.messages import DrainRequest, LaunchRequest

__all__ = ["MemoryDrainQueue", "MemoryLaunchQueue", "Queued"]


@dataclass(frozen=True)
class Queued:
    request: DrainRequest
    visible_at: datetime


class MemoryLaunchQueue:
    """`LaunchQueue`: what was sent, in order."""

    def __init__(self) -> None:
        self.sent: list[LaunchRequest] = []

    def send(self, request: LaunchRequest) -> None:
        self.sent.append(request)

    def send_many(self, requests: Sequence[LaunchRequest]) -> None:
        self.sent.extend(requests)


@dataclass
class MemoryDrainQueue:
    """`DrainQueue` honouring delays against the injected clock, as SQS DelaySeconds does (at most 15 minutes)."""

    clock: Clock
    messages: list[Queued] = field(default_factory=list)

    def send(self, request: DrainRequest, delay: timedelta | None = None) -> None:
        delay = min(delay or timedelta(0), timedelta(seconds=900))
        self.messages.append(Queued(request, self.clock.now() + delay))

    def receive(self) -> list[DrainRequest]:
        """Take every message visible now, oldest first."""
        now = self.clock.now()
        ready = [m for m in self.messages if m.visible_at <= now]
        self.messages = [m for m in self.messages if m.visible_at > now]
        return [m.request for m in ready]

    def next_visible(self) -> datetime | None:
        return min((m.visible_at for m in self.messages), default=None)

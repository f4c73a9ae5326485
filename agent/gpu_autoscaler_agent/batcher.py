"""Pods into messages: as many as fit under the size limit, none held longer than the delay limit.

Each pod entry is encoded once, when it is queued, and a message body is those encodings spliced into
the envelope, so the size counted here is the size SQS sees, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gpu_autoscaler_agent.document import envelope

__all__ = ["Batch", "Batcher", "OversizeReport", "Queued", "Report", "encode"]

_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def encode(value: Any) -> str:
    """Compact and ASCII-only: every character is one byte, and all are in SQS's allowed set."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True)
class Report:
    """One pod to report, encoded, with the identity that deduplicates its messages."""

    uid: str
    resource_version: str
    entry: dict[str, Any] = field(compare=False, repr=False)
    encoded: str = field(compare=False, repr=False)
    fingerprint: str = field(default="", compare=False, repr=False)
    """A digest of `encoded`: what the packer would read of the pod. A new resourceVersion with the same
    fingerprint is a change the report does not carry (kube-scheduler's PodScheduled message, say)."""

    @classmethod
    def of(cls, entry: dict[str, Any], resource_version: str) -> Report:
        encoded = encode(entry)
        return cls(entry["uid"], resource_version, entry, encoded,
                   hashlib.blake2b(encoded.encode(), digest_size=16).hexdigest())

    @property
    def size(self) -> int:
        return len(self.encoded)


@dataclass(frozen=True)
class Queued:
    report: Report
    since: datetime
    """When the pod joined the queue (not replaced by a newer version of it): its added latency starts here."""


@dataclass(frozen=True)
class Batch:
    items: tuple[Queued, ...]

    @property
    def reports(self) -> tuple[Report, ...]:
        return tuple(q.report for q in self.items)

    @property
    def oldest(self) -> datetime:
        return min(q.since for q in self.items)

    def __len__(self) -> int:
        return len(self.items)

    def body(self, cluster: str, sent_at: datetime) -> str:
        head = encode(envelope(cluster, sent_at, []))  # ends with `"pods":[]}`: pods is the last key
        return head[:-2] + ",".join(q.report.encoded for q in self.items) + "]}"


class OversizeReport(ValueError):
    """One pod's entry alone exceeds the message limit: it can never be sent."""


class Batcher:
    """Holds queued reports (one per pod: a newer version replaces an older one) until a batch is due."""

    def __init__(self, cluster: str, max_bytes: int, max_delay: timedelta) -> None:
        self.cluster = cluster
        self.max_bytes = max_bytes
        self.max_delay = max_delay
        self._overhead = len(encode(envelope(cluster, _EPOCH, [])))
        self._queue: dict[str, Queued] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, uid: object) -> bool:
        return uid in self._queue

    @property
    def message_bytes(self) -> int:
        """The size of the message the queued reports would make now."""
        return self._overhead + self._bytes + max(len(self._queue) - 1, 0)

    def fits_alone(self, report: Report) -> bool:
        return self._overhead + report.size <= self.max_bytes

    def add(self, report: Report, now: datetime) -> list[Batch]:
        """Queue a report; returns the batch closed to make room for it, if any."""
        if not self.fits_alone(report):
            raise OversizeReport(
                f"pod {report.uid} needs {self._overhead + report.size} bytes, over the {self.max_bytes} limit"
            )
        previous = self.discard(report.uid)
        since = previous.since if previous else now
        closed: list[Batch] = []
        if self._queue and self.message_bytes + 1 + report.size > self.max_bytes:
            closed.append(self._close())
        self._queue[report.uid] = Queued(report, since)
        self._bytes += report.size
        return closed

    def discard(self, uid: str) -> Queued | None:
        queued = self._queue.pop(uid, None)
        if queued is not None:
            self._bytes -= queued.report.size
        return queued

    @property
    def deadline(self) -> datetime | None:
        """When the oldest queued report has waited its longest."""
        if not self._queue:
            return None
        return min(q.since for q in self._queue.values()) + self.max_delay

    @property
    def oldest(self) -> datetime | None:
        return min((q.since for q in self._queue.values()), default=None)

    def due(self, now: datetime) -> list[Batch]:
        deadline = self.deadline
        if deadline is None or now < deadline:
            return []
        return [self._close()]

    def flush(self) -> list[Batch]:
        return [self._close()] if self._queue else []

    def _close(self) -> Batch:
        batch = Batch(tuple(self._queue.values()))
        self._queue = {}
        self._bytes = 0
        return batch

"""The agent's one owner of state: which pods are pending, what was queued, what still has to be delivered.

The watcher only tells it what it saw (`upsert`, `remove`, `replace_all`, from its own thread, through an
inbox); `tick` does everything time-driven: the resync, closing batches at the delay limit, sending, and
retrying after a backoff. Time comes from the injected clock, so the unit tests drive it step by step.

Delivery is at least once: a batch stays at the head of the outbox until SQS accepts it, and a pod that
stays pending is queued again every resync window; in between, only a change to what its report says
queues it again.
"""

from __future__ import annotations

import logging
import math
import queue
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from gpu_autoscaler_agent.batcher import Batch, Batcher, OversizeReport, Report
from gpu_autoscaler_agent.sender import Backoff, SendFailed, deduplication_id

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterable

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler_agent.health import Metrics

__all__ = ["Dispatcher", "Outgoing", "PodSink", "Sender"]

log = logging.getLogger(__name__)


class PodSink(Protocol):
    """What the watcher reports to: the pods that should (and should no longer) be reported."""

    def upsert(self, report: Report) -> None: ...

    def remove(self, uid: str) -> None: ...

    def replace_all(self, reports: Iterable[Report]) -> None: ...


class Sender(Protocol):
    def send(self, body: str, dedup_id: str) -> str: ...


@dataclass
class Outgoing:
    """A closed batch with its body fixed at first attempt, so every retry is the identical message."""

    batch: Batch
    body: str
    dedup_id: str
    failures: int = 0
    retry_at: datetime | None = None


class Dispatcher:
    def __init__(
        self,
        cluster: str,
        sender: Sender,
        clock: Clock,
        metrics: Metrics,
        *,
        resync: timedelta,
        max_bytes: int,
        max_delay: timedelta,
        backoff: Backoff | None = None,
    ) -> None:
        self.cluster = cluster
        self._sender = sender
        self._clock = clock
        self._metrics = metrics
        self._resync = resync.total_seconds()
        self._batcher = Batcher(cluster, max_bytes, max_delay)
        self._backoff = backoff or Backoff()
        self._pending: dict[str, Report] = {}
        self._queued: dict[str, tuple[str, int]] = {}
        """uid -> (report fingerprint, window) last put in a batch: the same pair is not queued twice. Not the
        resourceVersion: kube-scheduler rewrites a pending pod's PodScheduled message whenever the number of
        nodes changes ("0/12 nodes are available: …"), so while nodes join every pending pod gets a new version
        each second with nothing the report carries changed; queueing each made a document of every pending pod
        a second, more than the packer drains (one at a time, a whole document each), and the queue grew
        stale documents behind it. What changes the report still goes at once; the resync sends it again."""
        self._outbox: deque[Outgoing] = deque()
        self._window = self.window_of(clock.now())
        self._inbox: queue.SimpleQueue[tuple[str, object, datetime]] = queue.SimpleQueue()
        self.heartbeat = clock.now()
        self.refused_by_queue: str | None = None
        """The error code of the last send, while it was the queue refusing the agent itself (`SendFailed.
        misconfigured`); None once a send goes through. The agent is not ready meanwhile."""

    # -- the watcher's side (any thread) -------------------------------------------------------------

    # Each message carries the moment it was seen: a pod's added latency is counted from then.

    def upsert(self, report: Report) -> None:
        self._inbox.put(("upsert", report, self._clock.now()))

    def remove(self, uid: str) -> None:
        self._inbox.put(("remove", uid, self._clock.now()))

    def replace_all(self, reports: Iterable[Report]) -> None:
        self._inbox.put(("replace_all", list(reports), self._clock.now()))

    def wake(self) -> None:
        self._inbox.put(("wake", None, self._clock.now()))

    # -- the dispatcher's own thread -------------------------------------------------------------------

    def window_of(self, moment: datetime) -> int:
        """Resync windows are aligned to the epoch, so restarted or duplicate agents share them."""
        return math.floor(moment.timestamp() / self._resync)

    @property
    def pending(self) -> dict[str, Report]:
        return dict(self._pending)

    @property
    def undelivered(self) -> int:
        """Pods queued or in messages not yet accepted."""
        return len(self._batcher) + sum(len(o.batch) for o in self._outbox)

    def run(self, stop: threading.Event, max_wait: float = 0.5) -> None:
        while not stop.is_set():
            self.tick()
            try:
                item = self._inbox.get(timeout=self._seconds_to_next(max_wait))
            except queue.Empty:
                continue
            self._apply(item)

    def tick(self) -> None:
        """Apply what the watcher reported, then do whatever is due now."""
        self._drain_inbox()
        now = self._clock.now()
        self.heartbeat = now
        window = self.window_of(now)
        if window != self._window:
            self._window = window
            self._metrics.inc("resyncs_total")
            for report in list(self._pending.values()):
                self._queue(report, now)
        self._outbox.extend(self._outgoing(b, now) for b in self._batcher.due(now))
        self._send_due(now)
        self._update_gauges(now)

    def flush(self) -> None:
        """Close the open batch now, whatever its age (at shutdown, and for `run_once`)."""
        self._drain_inbox()
        now = self._clock.now()
        self._outbox.extend(self._outgoing(b, now) for b in self._batcher.flush())
        for outgoing in self._outbox:
            outgoing.retry_at = None
        self._send_due(now)
        self._update_gauges(now)

    def next_retry(self) -> datetime | None:
        return self._outbox[0].retry_at if self._outbox else None

    def _seconds_to_next(self, cap: float) -> float:
        now = self._clock.now()
        moments = [m for m in (self._batcher.deadline, self.next_retry()) if m is not None]
        moments.append(datetime.fromtimestamp((self._window + 1) * self._resync, tz=now.tzinfo))
        return max(0.0, min(cap, *((m - now).total_seconds() for m in moments)))

    def _drain_inbox(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._apply(item)

    def _apply(self, item: tuple[str, object, datetime]) -> None:
        kind, payload, now = item
        if kind == "upsert":
            assert isinstance(payload, Report)
            self._pending[payload.uid] = payload
            self._queue(payload, now)
        elif kind == "remove":
            self._forget(str(payload))
        elif kind == "replace_all":
            assert isinstance(payload, list)
            fresh = {r.uid: r for r in payload}
            for uid in set(self._pending) - set(fresh):
                self._forget(uid)
            for report in fresh.values():
                self._pending[report.uid] = report
                self._queue(report, now)
        self._metrics.set("pods_pending", len(self._pending))

    def _forget(self, uid: str) -> None:
        """The pod was scheduled, deleted or no longer reportable: stop reporting it (sent messages stand)."""
        self._pending.pop(uid, None)
        self._queued.pop(uid, None)
        self._batcher.discard(uid)

    def _queue(self, report: Report, now: datetime) -> None:
        key = (report.fingerprint, self._window)
        if self._queued.get(report.uid) == key:
            return
        try:
            closed = self._batcher.add(report, now)
        except OversizeReport as error:
            log.error("not reporting a pod: %s", error)
            self._metrics.inc("pods_dropped_total")
            return
        self._queued[report.uid] = key
        self._outbox.extend(self._outgoing(b, now) for b in closed)

    def _outgoing(self, batch: Batch, now: datetime) -> Outgoing:
        return Outgoing(batch, batch.body(self.cluster, now), deduplication_id(batch.reports, self._window))

    def _send_due(self, now: datetime) -> None:
        """Strictly in order: while the head waits out a backoff, nothing behind it is tried."""
        while self._outbox:
            head = self._outbox[0]
            if head.retry_at is not None and now < head.retry_at:
                return
            started = time.monotonic()
            try:
                self._sender.send(head.body, head.dedup_id)
            except SendFailed as error:
                self._failed(head, error, now)
                if not error.rejected:
                    return
                continue
            self._metrics.observe("send_latency_seconds", time.monotonic() - started)
            self.refused_by_queue = None
            self._outbox.popleft()
            self._delivered(head.batch, self._clock.now())

    def _failed(self, head: Outgoing, error: SendFailed, now: datetime) -> None:
        self._metrics.inc("send_failures_total", reason="throttled" if error.throttled else error.code or "error")
        if error.rejected:
            self._outbox.popleft()
            self._reject(head, error, now)
            return
        head.failures += 1
        delay = self._backoff.delay(head.failures)
        head.retry_at = now + timedelta(seconds=delay)
        if error.misconfigured:
            self.refused_by_queue = error.code
            log.error("the queue refuses the agent (%s): check QUEUE_URL (the stack's PendingPodsQueueUrl output, "
                      "whose region the agent takes), and that the agent runs as the stack's AgentRoleArn (its EKS "
                      "Pod Identity association) or an IRSA role holding AgentPolicyArn; %d pods wait, try %d "
                      "again in %.1fs", error, len(head.batch), head.failures + 1, delay)
            return
        log.warning("send of %d pods failed (%s), try %d again in %.1fs", len(head.batch), error,
                    head.failures + 1, delay)

    def _reject(self, head: Outgoing, error: SendFailed, now: datetime) -> None:
        """SQS refused the content: split the batch to isolate the pod it refuses; that pod waits for the next
        resync window (or its next change) instead of blocking everyone behind it."""
        items = head.batch.items
        if len(items) > 1:
            half = len(items) // 2
            parts = [Batch(items[:half]), Batch(items[half:])]
            self._outbox.extendleft(reversed([self._outgoing(p, now) for p in parts]))
            return
        uid = items[0].report.uid
        log.error("queue refused the report of pod %s: %s", uid, error)
        self._metrics.inc("pods_dropped_total")
        self._queued.pop(uid, None)

    def _delivered(self, batch: Batch, now: datetime) -> None:
        self._metrics.inc("messages_sent_total")
        self._metrics.inc("pods_sent_total", len(batch))
        for item in batch.items:
            self._metrics.observe("report_latency_seconds", max((now - item.since).total_seconds(), 0.0))

    def _update_gauges(self, now: datetime) -> None:
        oldest = [t for t in (self._batcher.oldest, *(o.batch.oldest for o in self._outbox)) if t is not None]
        self._metrics.set("lag_seconds", max((now - min(oldest)).total_seconds(), 0.0) if oldest else 0.0)
        self._metrics.set("pods_pending", len(self._pending))

"""The dispatcher against the real queue shape (FIFO on moto): retries, deduplication, size, grouping."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING

from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler_agent.batcher import Report
from gpu_autoscaler_agent.dispatcher import Dispatcher
from gpu_autoscaler_agent.document import pending_pod
from gpu_autoscaler_agent.health import Metrics
from gpu_autoscaler_agent.sender import Backoff, QueueSender
from tests.integration.agent.conftest import FlakySqs
from tests.unit.agent.builders import make_pod

if TYPE_CHECKING:
    from tests.integration.agent.conftest import Queue


def dispatcher(queue: Queue, sqs: object, metrics: Metrics, max_bytes: int = 256 * 1024) -> Dispatcher:
    return Dispatcher(
        queue.cluster, QueueSender(sqs, queue.url, queue.cluster), SystemClock(), metrics,  # type: ignore[arg-type]
        resync=timedelta(hours=1), max_bytes=max_bytes, max_delay=timedelta(milliseconds=100),
        backoff=Backoff(initial=0.05, maximum=0.2),
    )


def report(uid: str, padding: int = 0) -> Report:
    pod = make_pod(uid=uid, resource_version="7", node_selector={"pad": "x" * padding} if padding else None)
    return Report.of(pending_pod(pod), "7")


def run_until_delivered(d: Dispatcher, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    d.tick()
    while d.undelivered and time.monotonic() < deadline:
        time.sleep(0.05)
        d.tick()
    assert d.undelivered == 0


def test_throttled_sends_are_retried_until_every_pod_is_in_the_queue_once(queue: Queue) -> None:
    metrics = Metrics()
    flaky = FlakySqs(queue.sqs, failures=3, deliver_then_fail=True)  # each failed try did reach the queue
    d = dispatcher(queue, flaky, metrics)
    for uid in ("a", "b", "c"):
        d.upsert(report(uid))
    time.sleep(0.15)
    run_until_delivered(d)
    messages = queue.receive()
    assert [p["uid"] for m in messages for p in m["document"]["pods"]] == ["a", "b", "c"]  # once: deduplicated
    assert all(m["group"] == queue.cluster for m in messages)
    assert flaky.attempts == 4
    assert metrics.value("send_failures_total", reason="throttled") == 3
    assert metrics.value("pods_sent_total") == 3


def test_batches_split_at_the_size_limit_and_every_message_fits_and_parses(queue: Queue) -> None:
    limit = 256 * 1024
    d = dispatcher(queue, queue.sqs, Metrics(), max_bytes=limit)
    uids = [f"pod-{i:03d}" for i in range(100)]
    for uid in uids:
        d.upsert(report(uid, padding=6000))  # about 600 KB in all
    time.sleep(0.15)
    run_until_delivered(d)
    messages = queue.receive()
    assert len(messages) == 3
    assert all(m["bytes"] <= limit for m in messages)
    assert max(m["bytes"] for m in messages) > limit - 7000
    got = [p.uid for m in messages for p in PendingPodsDocument.model_validate(m["document"]).pods]
    assert sorted(got) == uids

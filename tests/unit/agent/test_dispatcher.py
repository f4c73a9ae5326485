from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler_agent.batcher import Report
from gpu_autoscaler_agent.dispatcher import Dispatcher
from gpu_autoscaler_agent.document import pending_pod
from gpu_autoscaler_agent.health import Metrics
from gpu_autoscaler_agent.sender import Backoff, SendFailed
from tests.unit.agent.builders import make_pod

T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)  # a multiple of every resync period used here
SECOND = timedelta(seconds=1)


class FakeSender:
    """Records every message; `fail_next(n, error)` makes the next n sends fail."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, Any], str]] = []
        self.attempts = 0
        self._failures: list[SendFailed] = []

    def fail_next(self, times: int, error: SendFailed | None = None) -> None:
        self._failures.extend([error or SendFailed("throttled", "RequestThrottled", throttled=True)] * times)

    def send(self, body: str, dedup_id: str) -> str:
        self.attempts += 1
        if self._failures:
            raise self._failures.pop(0)
        self.sent.append((json.loads(body), dedup_id))
        return f"m-{len(self.sent)}"

    @property
    def uids(self) -> list[str]:
        return [p["uid"] for document, _ in self.sent for p in document["pods"]]


def report(uid: str, rv: str = "1", padding: int = 0) -> Report:
    pod = make_pod(uid=uid, resource_version=rv, node_selector={"pad": "x" * padding} if padding else None)
    return Report.of(pending_pod(pod), rv)


class Harness:
    def __init__(self, *, resync: float = 60, max_bytes: int = 256 * 1024) -> None:
        self.clock = FixedClock(T0)
        self.sender = FakeSender()
        self.metrics = Metrics()
        self.dispatcher = Dispatcher(
            "ml-prod", self.sender, self.clock, self.metrics,
            resync=timedelta(seconds=resync), max_bytes=max_bytes, max_delay=SECOND,
            backoff=Backoff(initial=1.0, maximum=8.0, jitter=lambda: 1.0),
        )

    def advance(self, seconds: float) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        self.dispatcher.tick()


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_a_pending_pod_is_sent_within_the_delay_as_a_valid_document(h: Harness) -> None:
    h.dispatcher.upsert(report("a"))
    h.dispatcher.tick()
    assert h.sender.sent == []
    h.advance(1)
    [(document, dedup_id)] = h.sender.sent
    assert PendingPodsDocument.model_validate(document).pods[0].uid == "a"
    assert document["cluster"] == "ml-prod"
    assert dedup_id == f"a.1.{int(T0.timestamp()) // 60}"
    assert h.metrics.value("pods_sent_total") == 1
    assert h.metrics.value("report_latency_seconds_count") == 1


def test_a_pending_pod_is_sent_once_per_resync_window(h: Harness) -> None:
    h.dispatcher.upsert(report("a"))
    for _ in range(59):
        h.advance(1)
    assert h.sender.uids == ["a"]
    h.dispatcher.upsert(report("a"))  # the same version seen again (a relist) is not sent again
    h.advance(1)  # T0 + 60 s: the next window
    h.advance(1)
    assert h.sender.uids == ["a", "a"]
    assert h.sender.sent[0][1] != h.sender.sent[1][1]
    assert h.metrics.value("resyncs_total") == 1


def test_a_changed_pod_is_sent_again_at_once(h: Harness) -> None:
    h.dispatcher.upsert(report("a", rv="1"))
    h.advance(1)
    h.dispatcher.upsert(report("a", rv="2", padding=4))  # what the packer reads of it changed
    h.advance(1)
    assert [d["pods"][0]["uid"] for d, _ in h.sender.sent] == ["a", "a"]


def test_a_pod_whose_report_did_not_change_is_not_sent_again_within_the_window(h: Harness) -> None:
    """kube-scheduler rewrites a pending pod's PodScheduled message each time the count of nodes in it changes
    ("0/12 nodes are available: …"), so while nodes join every pending pod gets a new resourceVersion each
    second. None of that is in the report: sending all pending pods again for it made one document a second
    that the packer could not drain (the chaos soak's 75–95 stale documents queued). The resync window still
    sends every pending pod again."""
    h.dispatcher.upsert(report("a", rv="1"))
    h.dispatcher.upsert(report("b", rv="1"))
    h.advance(1)
    for rv in range(2, 30):  # a node joins each second: a new version of each, the same report
        h.dispatcher.upsert(report("a", rv=str(rv)))
        h.dispatcher.upsert(report("b", rv=str(rv)))
        h.advance(1)
    assert h.sender.uids == ["a", "b"]
    h.advance(60)  # the next window
    h.advance(1)
    assert sorted(h.sender.uids) == ["a", "a", "b", "b"]


def test_a_scheduled_pod_is_no_longer_reported(h: Harness) -> None:
    h.dispatcher.upsert(report("a"))
    h.dispatcher.upsert(report("b"))
    h.dispatcher.remove("a")
    h.advance(1)
    h.advance(60)
    h.advance(1)
    assert h.sender.uids == ["b", "b"]


def test_a_relist_replaces_the_pending_set(h: Harness) -> None:
    h.dispatcher.upsert(report("a"))
    h.dispatcher.upsert(report("b"))
    h.advance(1)
    h.dispatcher.replace_all([report("b"), report("c")])
    h.advance(1)
    assert sorted(h.dispatcher.pending) == ["b", "c"]
    assert h.sender.uids == ["a", "b", "c"]  # b was already sent in this window at this version


def test_many_pods_in_one_second_make_one_message(h: Harness) -> None:
    for i in range(50):
        h.dispatcher.upsert(report(f"p{i}"))
    h.advance(1)
    assert len(h.sender.sent) == 1 and len(h.sender.uids) == 50
    assert len(h.sender.sent[0][1]) == 64  # a hash names a batch


def test_a_full_batch_goes_out_before_the_delay_and_each_message_fits() -> None:
    h = Harness(max_bytes=16 * 1024)
    for i in range(10):
        h.dispatcher.upsert(report(f"p{i}", padding=4500))  # three fit in 16 KiB
    h.dispatcher.tick()
    assert [len(d["pods"]) for d, _ in h.sender.sent] == [3, 3, 3]  # the full ones left at once
    h.advance(1)
    assert sorted(h.sender.uids) == sorted(f"p{i}" for i in range(10))
    assert all(len(json.dumps(d, separators=(",", ":"))) <= 16 * 1024 for d, _ in h.sender.sent)


def test_a_throttled_send_is_retried_with_backoff_and_nothing_is_lost(h: Harness) -> None:
    h.dispatcher.upsert(report("a"))
    h.sender.fail_next(3)
    h.advance(1)  # attempt 1 fails; next in 1 s
    h.dispatcher.upsert(report("b"))
    h.advance(1)  # attempt 2 fails; next in 2 s (b's batch waits behind it)
    h.advance(1)
    assert h.sender.attempts == 2
    h.advance(1)  # attempt 3 fails; next in 4 s
    assert h.metrics.value("lag_seconds") == 4  # a has waited since T0
    h.advance(4)  # a is delivered, then b
    assert h.sender.uids == ["a", "b"]
    assert h.metrics.value("send_failures_total", reason="throttled") == 3
    assert h.metrics.value("lag_seconds") == 0


def test_a_retry_is_the_identical_message(h: Harness) -> None:
    bodies: list[tuple[str, str]] = []
    send = h.sender.send

    def recording(body: str, dedup_id: str) -> str:
        bodies.append((body, dedup_id))
        return send(body, dedup_id)

    h.sender.send = recording  # type: ignore[method-assign]
    h.dispatcher.upsert(report("a"))
    h.sender.fail_next(1)
    h.advance(1)
    h.advance(1)
    assert len(bodies) == 2 and bodies[0] == bodies[1]


def test_a_refused_batch_is_split_and_only_the_refused_pod_waits_for_the_next_window(h: Harness) -> None:
    refusal = SendFailed("bad", "InvalidMessageContents", rejected=True)
    for uid in ("a", "b", "c", "d"):
        h.dispatcher.upsert(report(uid))
    h.sender.fail_next(1, refusal)  # the batch of four
    h.sender.fail_next(1, refusal)  # [a, b]
    h.sender.fail_next(1, refusal)  # [a]
    h.advance(1)
    assert h.sender.uids == ["b", "c", "d"]
    assert h.metrics.value("pods_dropped_total") == 1
    h.advance(60)
    h.advance(1)
    assert sorted(h.sender.uids[3:]) == ["a", "b", "c", "d"]


def test_flush_sends_at_once_whatever_the_age(h: Harness) -> None:
    h.dispatcher.upsert(report("a"))
    h.dispatcher.flush()
    assert h.sender.uids == ["a"] and h.dispatcher.undelivered == 0


def test_undelivered_counts_queued_and_failing_pods(h: Harness) -> None:
    h.dispatcher.upsert(report("a"))
    h.dispatcher.upsert(report("b"))
    h.dispatcher.tick()
    assert h.dispatcher.undelivered == 2
    h.sender.fail_next(1)
    h.advance(1)
    assert h.dispatcher.undelivered == 2
    h.advance(1)
    assert h.dispatcher.undelivered == 0


def test_each_accepted_send_is_timed_and_a_failed_one_is_not(h: Harness) -> None:
    h.sender.fail_next(1)
    h.dispatcher.upsert(report("a"))
    h.advance(1)
    assert h.metrics.value("send_latency_seconds_count") == 0 and h.metrics.value("send_failures_total",
                                                                                   reason="throttled") == 1
    h.advance(2)
    assert h.metrics.value("send_latency_seconds_count") == 1
    assert h.metrics.value("send_latency_seconds_sum") >= 0
    assert "gpu_autoscaler_agent_send_latency_seconds_count 1\n" in h.metrics.render()


@pytest.mark.parametrize("code", ["AWS.SimpleQueueService.NonExistentQueue", "AccessDenied"])
def test_a_queue_that_refuses_the_agent_is_an_error_naming_the_fix_until_a_send_goes_through(
    h: Harness, code: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A wrong queue URL (or region), or an agent without the stack's identity, fails every send the same way for
    ever: unlike throttling it never passes by itself, so it is an error that says what to check, and the
    dispatcher says so (`refused_by_queue`, which the agent's readiness reads) until a send goes through."""
    h.dispatcher.upsert(report("a"))
    h.sender.fail_next(2, SendFailed(f"SendMessage failed: {code}", code, misconfigured=True))
    with caplog.at_level("WARNING", logger="gpu_autoscaler_agent.dispatcher"):
        h.advance(1)
    [record] = caplog.records
    assert record.levelname == "ERROR" and "PendingPodsQueueUrl" in record.getMessage()
    assert "AgentRoleArn" in record.getMessage()
    assert h.dispatcher.refused_by_queue == code
    h.advance(1)
    h.advance(2)  # delivered after the third try: the queue takes the agent again
    assert h.sender.uids == ["a"] and h.dispatcher.refused_by_queue is None

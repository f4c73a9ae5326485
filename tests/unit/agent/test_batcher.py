from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler_agent.batcher import Batcher, OversizeReport, Report
from gpu_autoscaler_agent.document import pending_pod
from gpu_autoscaler_agent.settings import SQS_MAX_MESSAGE_BYTES
from tests.unit.agent.builders import make_pod

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def report(padding: int = 0, **overrides: object) -> Report:
    """A pod report; `padding` grows it by about that many bytes (a long node selector value)."""
    pod = make_pod(node_selector={"pad": "x" * padding} if padding else None, **overrides)  # type: ignore[arg-type]
    return Report.of(pending_pod(pod), pod["metadata"]["resourceVersion"])


def test_a_batch_is_due_after_the_delay_and_not_before() -> None:
    batcher = Batcher("ml-prod", SQS_MAX_MESSAGE_BYTES, SECOND)
    assert batcher.add(report(), T0) == []
    batcher.add(report(), T0 + SECOND / 2)
    assert batcher.due(T0 + SECOND * 0.99) == []
    assert batcher.deadline == T0 + SECOND
    [batch] = batcher.due(T0 + SECOND)
    assert len(batch) == 2 and len(batcher) == 0


def test_the_body_is_the_document_and_exactly_as_large_as_counted() -> None:
    batcher = Batcher("ml-prod", SQS_MAX_MESSAGE_BYTES, SECOND)
    for _ in range(3):
        batcher.add(report(), T0)
    counted = batcher.message_bytes
    [batch] = batcher.flush()
    body = batch.body("ml-prod", T0 + timedelta(milliseconds=123))
    assert len(body.encode()) == counted
    document = PendingPodsDocument.model_validate(json.loads(body))
    assert [p.uid for p in document.pods] == [r.uid for r in batch.reports]
    assert document.sent_at == T0 + timedelta(milliseconds=123)


def test_batches_split_at_the_sqs_limit_and_each_fits() -> None:
    batcher = Batcher("ml-prod", SQS_MAX_MESSAGE_BYTES, SECOND)
    reports = [report(padding=10_000) for _ in range(60)]  # about 600 KB in all
    batches = [b for r in reports for b in batcher.add(r, T0)] + batcher.flush()
    assert len(batches) == 3
    sizes = [len(b.body("ml-prod", T0).encode()) for b in batches]
    assert all(size <= SQS_MAX_MESSAGE_BYTES for size in sizes)
    assert sizes[0] > SQS_MAX_MESSAGE_BYTES - 11_000  # filled before closing
    assert [r.uid for b in batches for r in b.reports] == [r.uid for r in reports]


def test_a_report_exactly_at_the_limit_is_sent_alone() -> None:
    probe = Batcher("c", 4096, SECOND)
    base = report()
    room = 4096 - probe.message_bytes - base.size  # what padding still fits in an otherwise empty message
    exact = report(padding=room - len(',"nodeSelector":{"pad":""}'))
    assert probe.fits_alone(exact) and not probe.fits_alone(report(padding=room))
    probe.add(base, T0)
    [closed] = probe.add(exact, T0)
    assert closed.reports == (base,)
    [alone] = probe.flush()
    assert len(alone.body("c", T0)) == 4096


def test_a_report_larger_than_any_message_is_refused() -> None:
    with pytest.raises(OversizeReport):
        Batcher("c", 4096, SECOND).add(report(padding=5000), T0)


def test_a_newer_version_of_a_pod_replaces_the_queued_one_and_keeps_its_wait() -> None:
    batcher = Batcher("c", SQS_MAX_MESSAGE_BYTES, SECOND)
    first = report(uid="u1", resource_version="1")
    batcher.add(first, T0)
    batcher.add(report(uid="u1", resource_version="2"), T0 + SECOND / 2)
    assert len(batcher) == 1
    [batch] = batcher.due(T0 + SECOND)
    assert batch.reports[0].resource_version == "2"


def test_discarding_a_pod_forgets_it() -> None:
    batcher = Batcher("c", SQS_MAX_MESSAGE_BYTES, SECOND)
    empty = batcher.message_bytes
    batcher.add(report(uid="u1"), T0)
    batcher.discard("u1")
    assert len(batcher) == 0 and batcher.message_bytes == empty and batcher.due(T0 + SECOND) == []

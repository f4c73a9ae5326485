"""A queue-fed handler's failed records: counted, and delivered again after `RETRY_AFTER`, not the queue's timeout; a
record that did no work (not started, or skipped behind a failure in its FIFO group) goes back at once."""

from __future__ import annotations

from typing import Any

import pytest
from aws_lambda_powertools import Metrics
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    SqsFifoPartialProcessor,
    process_partial_response,
)
from botocore.exceptions import ClientError

from gpu_autoscaler.adapters.aws.clients import worst_call_seconds
from gpu_autoscaler.batch_failures import (
    RECORD_RESERVE_SECONDS,
    RESERVE_SHARE,
    RETRY_AFTER,
    NotStarted,
    invocation_time_left,
    report_failures,
    time_for_a_record,
)
from gpu_autoscaler.lambda_context import local_context
from gpu_autoscaler.wiring import FUNCTION_WIRING

ARN = "arn:aws:sqs:us-east-1:123456789012:ml-prod-interruption"


class RecordingSqs:
    """Answers as SQS does and records what it was asked; `refuse` names receipt handles whose change fails."""

    def __init__(self, refuse: frozenset[str] = frozenset(), visibility: int = 360) -> None:
        self.refuse = refuse
        self.visibility = visibility
        self.urls: list[tuple[str, str]] = []
        self.changes: list[tuple[str, str, int]] = []

    def get_queue_url(self, QueueName: str, QueueOwnerAWSAccountId: str) -> dict[str, str]:  # noqa: N803
        self.urls.append((QueueName, QueueOwnerAWSAccountId))
        return {"QueueUrl": f"https://sqs.us-east-1.amazonaws.com/{QueueOwnerAWSAccountId}/{QueueName}"}

    def get_queue_attributes(self, QueueUrl: str, AttributeNames: list[str]) -> dict[str, Any]:  # noqa: N803
        assert AttributeNames == ["VisibilityTimeout"]
        return {"Attributes": {"VisibilityTimeout": str(self.visibility)}}

    def change_message_visibility(self, QueueUrl: str, ReceiptHandle: str, VisibilityTimeout: int) -> None:  # noqa: N803
        if ReceiptHandle in self.refuse:
            raise ClientError({"Error": {"Code": "ReceiptHandleIsInvalid", "Message": "expired"}},
                              "ChangeMessageVisibility")
        self.changes.append((QueueUrl, ReceiptHandle, VisibilityTimeout))


def record(message_id: str, delivered: int, group: str | None = None) -> dict[str, Any]:
    attributes = {"ApproximateReceiveCount": str(delivered)}
    if group is not None:
        attributes["MessageGroupId"] = group
    return {"messageId": message_id, "receiptHandle": f"handle-{message_id}", "body": "{}",
            "attributes": attributes, "eventSourceARN": ARN}


def processed(event: dict[str, Any], fail: frozenset[str] = frozenset(), not_started: frozenset[str] = frozenset(),
              processor: BatchProcessor | None = None) -> BatchProcessor:
    """`processor` (a standard queue's by default) after a handler's batch: the records named in `fail` raise a
    failure, those in `not_started` `NotStarted`, the others succeed."""
    processor = processor or BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    processor.raise_on_entire_batch_failure = False

    def handle(record: Any) -> None:
        if record.message_id in not_started:
            raise NotStarted("not started")
        if record.message_id in fail:
            raise RuntimeError("failed")

    process_partial_response(event=event, record_handler=handle, processor=processor)
    return processor


def test_each_failed_record_comes_back_by_how_often_it_was_delivered() -> None:
    sqs = RecordingSqs()
    event = {"Records": [record("ok", 1), record("first", 1), record("third", 3), record("fourth", 4)]}
    processor = processed(event, fail=frozenset({"first", "third", "fourth"}))
    response = report_failures(Metrics(namespace="Test"), event, processor, lambda: sqs)
    assert response == {"batchItemFailures": [{"itemIdentifier": m} for m in ("first", "third", "fourth")]}
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/ml-prod-interruption"
    assert sqs.changes == [(url, "handle-first", RETRY_AFTER[0]), (url, "handle-third", RETRY_AFTER[2])]
    assert sqs.urls == [("ml-prod-interruption", "123456789012")]  # once per queue


def test_a_record_not_started_goes_back_at_once_whatever_its_deliveries_and_a_failed_one_keeps_the_backoff() -> None:
    """Before, a record the handler never started (too little of the invocation left) waited 10, 40, 160 s like a
    failed one, though it did no work, and every delivery counts toward maxReceiveCount."""
    sqs = RecordingSqs()
    event = {"Records": [record("failed", 3), record("late", 3), record("later", 5)]}
    processor = processed(event, fail=frozenset({"failed"}), not_started=frozenset({"late", "later"}))
    report_failures(Metrics(namespace="Test"), event, processor, lambda: sqs)
    assert [(handle, seconds) for _, handle, seconds in sqs.changes] == [
        ("handle-failed", RETRY_AFTER[2]), ("handle-late", 0), ("handle-later", 0)]


def test_fifo_records_skipped_behind_one_go_back_at_once_and_only_the_failed_record_waits() -> None:
    """A FIFO group's records after its first failure are skipped (never started): they go back at once, and SQS
    still hands them out only after the one in flight before them ("If you receive a message with a specific message
    group ID, no more messages for the same message group ID are returned unless you delete the message or it
    becomes visible", SQS developer guide, FIFO queue delivery logic)."""
    sqs = RecordingSqs()
    event = {"Records": [record("done", 3, "a"), record("late", 3, "a"), record("behind-late", 3, "a"),
                         record("failed", 2, "b"), record("behind-failed", 2, "b")]}
    processor = processed(event, fail=frozenset({"failed"}), not_started=frozenset({"late"}),
                          processor=SqsFifoPartialProcessor(skip_group_on_error=True))
    response = report_failures(Metrics(namespace="Test"), event, processor, lambda: sqs)
    assert [f["itemIdentifier"] for f in response["batchItemFailures"]] == [
        "late", "behind-late", "failed", "behind-failed"]
    assert [(handle, seconds) for _, handle, seconds in sqs.changes] == [
        ("handle-late", 0), ("handle-behind-late", 0), ("handle-failed", RETRY_AFTER[1]), ("handle-behind-failed", 0)]


def test_no_client_is_made_when_nothing_failed() -> None:
    def never() -> Any:
        raise AssertionError("an SQS client was made for a batch without failures")

    event = {"Records": [record("ok", 1)]}
    response = report_failures(Metrics(namespace="Test"), event, processed(event), never)
    assert response == {"batchItemFailures": []}


def test_a_record_whose_visibility_cannot_be_changed_keeps_the_queues_and_the_others_go_on() -> None:
    sqs = RecordingSqs(refuse=frozenset({"handle-stale"}))
    event = {"Records": [record("stale", 1), record("next", 2)]}
    report_failures(Metrics(namespace="Test"), event, processed(event, fail=frozenset({"stale", "next"})),
                    lambda: sqs)
    assert [(handle, seconds) for _, handle, seconds in sqs.changes] == [("handle-next", RETRY_AFTER[1])]


def test_a_queue_with_a_shorter_visibility_timeout_keeps_it() -> None:
    """Never later than the queue itself would have it back (the emulator's chaos runs shorten it to seconds)."""
    sqs = RecordingSqs(visibility=15)
    event = {"Records": [record("first", 1), record("second", 2)]}
    report_failures(Metrics(namespace="Test"), event, processed(event, fail=frozenset({"first", "second"})),
                    lambda: sqs)
    assert [seconds for *_, seconds in sqs.changes] == [min(RETRY_AFTER[0], 15), 15]


def test_a_stalled_aws_call_is_bounded_well_within_every_queue_fed_functions_timeout() -> None:
    """Before, five attempts of 5 + 30 s: one stalled call could take 175 s, past every function's timeout, and
    Lambda's stop at the timeout returned the whole batch only after the queue's visibility timeout."""
    assert worst_call_seconds() <= RECORD_RESERVE_SECONDS
    for wiring in FUNCTION_WIRING.values():
        if wiring.queue is not None:  # the stack's functions start records with the whole reserve kept
            assert RECORD_RESERVE_SECONDS <= RESERVE_SHARE * wiring.timeout_seconds, wiring.name


def test_the_first_record_of_an_invocation_is_always_started_and_a_short_one_keeps_a_quarter_for_records() -> None:
    now = [0.0]
    context = local_context("interruption", timeout_seconds=6, monotonic=lambda: now[0])
    time_for_a_record(context)  # 6 s left of 6: started
    now[0] = 1.4
    time_for_a_record(context)  # 4.6 s left: more than 3/4 of 6 s
    now[0] = 1.6
    with pytest.raises(NotStarted, match="not started: 4 s of the invocation left"):
        time_for_a_record(context)
    time_for_a_record(local_context("interruption", timeout_seconds=6, monotonic=lambda: now[0]))  # a new invocation


def test_the_invocations_time_left_is_read_when_asked() -> None:
    """What bounds the packer's pod Events: the time left when each is started, not when the record was."""
    now = [0.0]
    left = invocation_time_left(local_context("packer", timeout_seconds=60, monotonic=lambda: now[0]))
    assert left is not None and left() == pytest.approx(60)
    now[0] = 25.0
    assert left() == pytest.approx(35)
    assert invocation_time_left(None) is None


def test_failures_the_processor_does_not_pair_with_their_exceptions_all_keep_the_backoff() -> None:
    """The pairing of a response's failures with the processor's exceptions rests on Powertools listing both in the
    same order; should a version list them otherwise (their counts differ), every failed record keeps the backoff,
    as before records that did no work were told apart, and the batch's answer is not lost to an exception."""
    sqs = RecordingSqs()
    event = {"Records": [record("failed", 1), record("late", 1)]}
    processor = processed(event, fail=frozenset({"failed"}), not_started=frozenset({"late"}))
    processor.exceptions.pop()
    response = report_failures(Metrics(namespace="Test"), event, processor, lambda: sqs)
    assert [f["itemIdentifier"] for f in response["batchItemFailures"]] == ["failed", "late"]
    assert [(handle, seconds) for _, handle, seconds in sqs.changes] == [
        ("handle-failed", RETRY_AFTER[0]), ("handle-late", RETRY_AFTER[0])]


def test_no_interruption_notice_waits_behind_another_nor_goes_back_unstarted_however_long_acting_on_one_takes() -> None:
    """Every delivery counts toward the queue's maxReceiveCount, a record bounced unstarted too. With ten notices a
    batch, a notice past the first 18 s of its invocation (60 s less the 42 s reserve) was bounced, and one bounced
    five times in a storm of slow acts went to the dead-letter queue: its node got no replacement and no drain (the
    chaos rig showed it at load 8.6). One notice an invocation is always started."""
    wiring = FUNCTION_WIRING["interruption"]
    now = [0.0]
    context = local_context("interruption", timeout_seconds=wiring.timeout_seconds, monotonic=lambda: now[0])
    for _ in range(wiring.batch_size):
        time_for_a_record(context)
        now[0] += wiring.timeout_seconds - RECORD_RESERVE_SECONDS + 1  # an act slower than the window for starting

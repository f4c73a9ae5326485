"""What every queue-fed handler does with the records it reports failed: counts them, and has them back soon.

Counted: a partial batch failure is no Lambda error. Lambda retries the records the handler names and reports the
invocation as a success, so neither the function's `Errors` metric nor its alarm sees records going back to their
queue until one reaches the dead-letter queue. `RecordsFailed` is that count, published by every invocation (so none
publishes an empty metrics document).

Back soon: Lambda leaves a failed record in flight until its queue's visibility timeout ends ("Handling errors for an
SQS event source in Lambda", AWS Lambda developer guide), and the stack sets that timeout to six times the function's,
as AWS advises for SQS event sources (`infra.queues.VISIBILITY_FACTOR`): six minutes for the interruption function,
whose Spot warnings give two, half an hour for a drain. So each failed record's visibility is set here, by how often
it has been delivered, to `RETRY_AFTER` (10 s, then 40 s, then 160 s) or the queue's own timeout if that is shorter;
from the fourth delivery on it keeps the queue's, so a longer outage still has the queue's timeout between the last
deliveries before the dead-letter queue. Karpenter receives its interruption queue with a 20 s visibility timeout for
the same reason (karpenter-provider-aws `pkg/providers/sqs/sqs.go`). The event source's grant allows GetQueueUrl,
GetQueueAttributes and ChangeMessageVisibility; a record whose visibility cannot be changed keeps the queue's: it
comes back later, not never.

Started only with time left: when Lambda stops an invocation at its timeout, the handler never returns, and every
record of the batch, those already acted on too, is in flight until the queue's visibility timeout ends ("If the
invocation fails or times out, every message in the batch will be returned to the queue", same guide). So a record
is started only while one stalled call (to AWS or to the Kubernetes API, every attempt timing out) still fits in
what is left (`RECORD_RESERVE_SECONDS`); the records after it are reported failed without being started.

Back at once when not started: a record that did no work, not started for want of time (`NotStarted`) or skipped
behind an earlier record of its FIFO message group (Powertools' circuit breaker), is made visible again at once
(visibility 0, "The minimum is 0 seconds", SQS API reference, ChangeMessageVisibility), whatever its deliveries. The
backoff is for records that failed: every delivery counts toward the queue's maxReceiveCount ("When the ReceiveCount
for a message exceeds the maxReceiveCount for a queue, Amazon SQS moves the message to the dead-letter queue", SQS
API reference, SetQueueAttributes RedrivePolicy), so a backoff for a record that never ran only delays it: the
packer's documents are one FIFO group per cluster, and a burst's later documents waited 40 s, 160 s, then the
queue's 360 s behind the first ones. A skipped FIFO record still comes after the one before it: "If you receive a
message with a specific message group ID, no more messages for the same message group ID are returned unless you
delete the message or it becomes visible" (SQS developer guide, FIFO queue delivery logic).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch.exceptions import (
    SQSFifoCircuitBreakerError,
    SQSFifoMessageGroupCircuitBreakerError,
)
from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.adapters.aws.clients import AwsClients, worst_call_seconds
from gpu_autoscaler.adapters.kubernetes.rest import FUNCTION_TIMEOUT, worst_request_seconds
from gpu_autoscaler.settings import load_settings

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from aws_lambda_powertools import Metrics
    from aws_lambda_powertools.utilities.batch import BatchProcessor
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse

__all__ = [
    "RECORD_RESERVE_SECONDS",
    "RETRY_AFTER",
    "NotStarted",
    "invocation_time_left",
    "report_failures",
    "time_for_a_record",
]

log = logging.getLogger(__name__)

RETRY_AFTER = (10, 40, 160)
"""Seconds until a failed record is delivered again, after its first, second and third delivery."""

RECORD_RESERVE_SECONDS = max(worst_call_seconds(), worst_request_seconds(FUNCTION_TIMEOUT))
"""A record is started only while this much of the invocation is left: one stalled call still fits."""
RESERVE_SHARE = 0.75
"""Of an invocation shorter than the stack's (the chaos rig's interruption function has 6 s), the reserve is at most
this share of it, so that a quarter of it is left for starting records. The stack's functions (60 s, 120 s) keep
the whole `RECORD_RESERVE_SECONDS`."""

_invocation_time: OrderedDict[str, float] = OrderedDict()
"""Seconds each recent invocation had when its first record was looked at, by request id (an execution environment
runs one invocation at a time; the emulator runs several in one process)."""
_REMEMBERED = 64
_invocation_lock = threading.Lock()


class InvocationContext(Protocol):
    """What of a Lambda context the record clock reads (Lambda's, or `lambda_context.LocalLambdaContext`)."""

    @property
    def aws_request_id(self) -> str: ...

    def get_remaining_time_in_millis(self) -> int: ...


class NotStarted(Exception):
    """A record not started: too little of the invocation is left; it goes back to its queue at once."""


_DID_NO_WORK = (NotStarted, SQSFifoCircuitBreakerError, SQSFifoMessageGroupCircuitBreakerError)
"""What a record that was never started failed with: its own `NotStarted`, or a FIFO processor's skip of the records
after a group's (or the batch's) first failure (Powertools `SqsFifoPartialProcessor`)."""


def time_for_a_record(lambda_context: InvocationContext | None) -> None:
    """Raise `NotStarted` when less of the invocation is left than one stalled call may take. The first record of an
    invocation is always started."""
    if lambda_context is None:
        return
    left = lambda_context.get_remaining_time_in_millis() / 1000
    with _invocation_lock:
        whole = _invocation_time.setdefault(lambda_context.aws_request_id, left)
        while len(_invocation_time) > _REMEMBERED:
            _invocation_time.popitem(last=False)
    reserve = min(RECORD_RESERVE_SECONDS, RESERVE_SHARE * whole)
    if left < reserve:
        raise NotStarted(f"not started: {left:.0f} s of the invocation left, one stalled call may take "
                         f"{reserve:.0f} s; the record goes back to its queue")


def invocation_time_left(lambda_context: InvocationContext | None) -> Callable[[], float] | None:
    """The seconds left in the invocation, read when called, for work a record may cut short (the packer's pod
    Events); None without a context."""
    if lambda_context is None:
        return None
    context = lambda_context
    return lambda: context.get_remaining_time_in_millis() / 1000


def _sqs() -> Any:
    """The function's SQS client, made only when a record failed (a rare path: no client at cold start)."""
    settings = load_settings()
    return AwsClients(settings.region, settings.endpoint_url).client("sqs")


def report_failures(metrics: Metrics, event: Mapping[str, Any], processor: BatchProcessor,
                    sqs: Callable[[], Any] = _sqs) -> PartialItemFailureResponse:
    """The response of `processor`, which has just handled `event`, after counting its failed records in `metrics`
    and setting their visibility: at once for a record never started, by `RETRY_AFTER` for one that failed. `sqs`
    makes the SQS client, called only when a record failed."""
    response = processor.response()
    metrics.add_metric(name="RecordsFailed", unit=MetricUnit.Count, value=len(response["batchItemFailures"]))
    if response["batchItemFailures"]:
        failed = {item["itemIdentifier"] for item in response["batchItemFailures"]}
        _retry_soon([r for r in event.get("Records", []) if r.get("messageId") in failed],
                    _did_no_work(response, processor), sqs())
    return response


def _did_no_work(response: PartialItemFailureResponse, processor: BatchProcessor) -> set[str]:
    """The failed records that were never started. The processor lists a failed record's exception in the order it
    lists the record in its response (Powertools 3.x `BasePartialBatchProcessor`); should the two lists differ in
    length, none is told apart, and every failed record keeps the backoff."""
    failures, exceptions = response["batchItemFailures"], processor.exceptions
    if len(failures) != len(exceptions):
        log.warning("the batch processor listed %d failed records and %d exceptions: every failed record is backed "
                    "off", len(failures), len(exceptions))
        return set()
    return {str(item["itemIdentifier"]) for item, (kind, *_) in zip(failures, exceptions, strict=True)
            if kind is not None and issubclass(kind, _DID_NO_WORK)}


def _retry_soon(records: list[Mapping[str, Any]], idle: set[str], sqs: Any) -> None:
    """Each of `records` visible again after `RETRY_AFTER` by its deliveries, or at once if its message id is in
    `idle`; from its fourth delivery on, a failed record keeps the queue's visibility timeout."""
    queues: dict[str, tuple[str, int]] = {}
    """By queue ARN: its URL and visibility timeout."""
    for record in records:
        delivered = int(record.get("attributes", {}).get("ApproximateReceiveCount", "1"))
        not_started = record.get("messageId") in idle
        if delivered > len(RETRY_AFTER) and not not_started:
            continue
        arn = record["eventSourceARN"]
        try:
            if arn not in queues:
                *_, account, name = arn.split(":")
                url = sqs.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]
                attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
                queues[arn] = (url, int(attributes["Attributes"]["VisibilityTimeout"]))
            url, visibility = queues[arn]
            seconds = 0 if not_started else min(RETRY_AFTER[delivered - 1], visibility)
            sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=record["receiptHandle"],
                                          VisibilityTimeout=seconds)
        except (BotoCoreError, ClientError) as error:
            log.warning("a failed record keeps its queue's visibility timeout: %s", error,
                        extra={"messageId": record.get("messageId")})

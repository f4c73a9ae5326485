"""packer: pending-pods documents (SQS FIFO, one per record) → NodeClaims stored and launch requests sent.

The queue is FIFO (group = cluster), so records are handled in order and the batch stops at the first failure
(Powertools `SqsFifoPartialProcessor`): the failed record and every later one of its group are reported in
`batchItemFailures` and come back in order, as AWS Lambda's SQS guide asks of FIFO consumers ("stop processing
messages after the first failure and return all failed and unprocessed messages"). A record that is not a
valid pending-pods document, or is one for another cluster (an agent sent to the wrong queue), can never succeed:
it is sent to the dead-letter queue at once with its reason (the validation error, or the cluster named) as the
`reason` attribute (and logged), then acknowledged, so it does not hold its group back for `maxReceiveCount`
deliveries nor drag the documents behind it to the DLQ. Without `PENDING_PODS_DLQ_URL` it fails like any other
record and SQS redrives it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from pydantic import ValidationError

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.adapters.aws.dead_letters import SqsDeadLetters
from gpu_autoscaler.batch_failures import invocation_time_left, report_failures, time_for_a_record
from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler.models.validation import describe_validation
from gpu_autoscaler.naming import log_service
from gpu_autoscaler.services.packer import PackerService, WrongCluster, aws_packer_service
from gpu_autoscaler.settings import load_settings

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
    from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service=log_service("packer"))
tracer = Tracer(service="packer")
metrics = Metrics(service="packer")  # the namespace: POWERTOOLS_METRICS_NAMESPACE, the cluster's
processor = SqsFifoPartialProcessor(skip_group_on_error=True, logger=logger)
"""Only the failed record's group stops (a group is one cluster; another cluster's documents go on)."""
processor.raise_on_entire_batch_failure = False  # report every record failed rather than raise; the constructor
# of this Powertools version does not take the option its base class has (powertools-lambda-python#7596)


@functools.cache
def clients() -> AwsClients:
    """One set of boto3 clients for the service and the dead-letter sender: SQS's model loads once."""
    settings = load_settings()
    return AwsClients(settings.region, settings.endpoint_url)


@functools.cache
def service() -> PackerService:
    """Built on first use and kept while the execution environment lives (clients, catalog, solver caches)."""
    return aws_packer_service(load_settings(), clients=clients())


@functools.cache
def dead_letters() -> SqsDeadLetters | None:
    settings = load_settings()
    if not settings.pending_pods_dlq_url:
        return None
    return SqsDeadLetters(clients().client("sqs"), settings.pending_pods_dlq_url)


@tracer.capture_method
def record_handler(record: SQSRecord, lambda_context: LambdaContext | None = None) -> dict[str, Any]:
    time_for_a_record(lambda_context)
    try:
        document = PendingPodsDocument.model_validate_json(record.body)
    except ValidationError as error:
        errors = error.errors(include_url=False, include_context=False)
        logger.error("not a pending-pods document", extra={"messageId": record.message_id, "errors": errors})
        return _dead_letter(record, f"not a pending-pods document: {'; '.join(describe_validation(error))}", error)
    try:
        outcome = service().handle(document, source=record.message_id, time_left=invocation_time_left(lambda_context))
    except WrongCluster as error:
        logger.error("a document for another cluster", extra={"messageId": record.message_id, "error": str(error)})
        return _dead_letter(record, str(error), error)
    metrics.add_metric(name="PodsPending", unit=MetricUnit.Count, value=outcome.pods)
    metrics.add_metric(name="ClaimsCreated", unit=MetricUnit.Count, value=len(outcome.created))
    metrics.add_metric(name="PodsUnschedulable", unit=MetricUnit.Count, value=len(outcome.unschedulable))
    metrics.add_metric(name="PlannedPricePerHour", unit=MetricUnit.NoUnit, value=outcome.price_per_hour)
    metrics.add_metric(name="PodEventsRefused", unit=MetricUnit.Count, value=outcome.events_refused)
    logger.info("document packed", extra=outcome.summary())
    return outcome.summary()


def _dead_letter(record: SQSRecord, reason: str, error: Exception) -> dict[str, Any]:
    """A record that can never succeed, sent to the dead-letter queue with its reason and acknowledged: retried, it
    would hold its cluster's FIFO group for maxReceiveCount deliveries. Without the queue's URL it fails."""
    dlq = dead_letters()
    if dlq is None:
        raise error
    dlq.send(record.body, reason, message_id=record.message_id, group_id=record.attributes.message_group_id)
    metrics.add_metric(name="DocumentsDeadLettered", unit=MetricUnit.Count, value=1)
    return {"deadLettered": record.message_id, "reason": reason}


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
    return report_failures(metrics, event, processor)

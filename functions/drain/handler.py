"""drain: DrainRequests (SQS drain queue, one per invocation) → the node cordoned, evicted, then gone.

A drain works for as long as this invocation has (minus a margin), waiting out short PodDisruptionBudget
refusals in place; when it must wait longer it re-enqueues its progress with a delay (≤ 15 minutes) and the
message is done. A record that is not a DrainRequest fails alone, its validation error logged, and SQS moves
it to the dead-letter queue after `maxReceiveCount`.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from pydantic import ValidationError

from gpu_autoscaler.batch_failures import report_failures
from gpu_autoscaler.models.messages import DrainRequest
from gpu_autoscaler.naming import log_service
from gpu_autoscaler.services.drain import DrainService, aws_drain_service
from gpu_autoscaler.settings import load_settings

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
    from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service=log_service("drain"))
tracer = Tracer(service="drain")
metrics = Metrics(service="drain")  # the namespace: POWERTOOLS_METRICS_NAMESPACE, the cluster's
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False, logger=logger)

MARGIN = timedelta(seconds=30)
"""Left of the invocation after the last wait: the last pass, the re-enqueue and the batch report."""
MAX_BUDGET = timedelta(minutes=4)


@functools.cache
def service() -> DrainService:
    """Built on first use and kept while the execution environment lives (clients, Kubernetes token)."""
    return aws_drain_service(load_settings())


def budget(context: LambdaContext | None) -> timedelta:
    """How long this drain may wait in place before it re-enqueues itself instead."""
    if context is None:
        return timedelta(0)
    remaining = timedelta(milliseconds=context.get_remaining_time_in_millis()) - MARGIN
    return max(timedelta(0), min(remaining, MAX_BUDGET))


@tracer.capture_method
def record_handler(record: SQSRecord, lambda_context: LambdaContext | None = None) -> dict[str, Any]:
    try:
        request = DrainRequest.model_validate_json(record.body)
    except ValidationError as error:
        logger.error("not a drain request", extra={"messageId": record.message_id, "errors": error.errors(
            include_url=False, include_context=False)})
        raise
    logger.append_keys(node=request.node, claim=request.claim_id, attempt=request.attempt)
    outcome = service().drain(request, budget(lambda_context))
    metrics.add_metric(name="PodsEvicted", unit=MetricUnit.Count, value=len(outcome.evicted))
    metrics.add_metric(name="EvictionsRefused", unit=MetricUnit.Count, value=outcome.blocked)
    metrics.add_metric(name="PodsDeletedAtDeadline", unit=MetricUnit.Count, value=len(outcome.deleted))
    metrics.add_metric(name="PodEventsRefused", unit=MetricUnit.Count, value=outcome.events_refused)
    if outcome.status == "finished":
        metrics.add_metric(name="DrainsFinished", unit=MetricUnit.Count, value=1)
        if outcome.duration is not None:
            metrics.add_metric(name="DrainSeconds", unit=MetricUnit.Seconds, value=outcome.duration.total_seconds())
    elif outcome.status == "continued":
        metrics.add_metric(name="DrainsContinued", unit=MetricUnit.Count, value=1)
    elif outcome.status == "abandoned":
        metrics.add_metric(name="DrainsAbandoned", unit=MetricUnit.Count, value=1)
    logger.info("drain step done", extra=outcome.summary())
    return outcome.summary()


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
    return report_failures(metrics, event, processor)

"""fleet: launch requests (SQS launch queue, one `LaunchRequest` per record) → EC2 CreateFleet, claims Launched.

Each record is handled on its own (Powertools `BatchProcessor`, partial batch failure): a record that is not
a valid `LaunchRequest` fails alone, its validation error logged, and SQS redrives it to the dead-letter queue
after `maxReceiveCount`; so does one whose CreateFleet stays throttled or failing on EC2's side (a 5xx; the
claims are still Pending, so the redelivery simply tries again), and so does one that finds the cluster's
certificate authority or service CIDR neither configured nor readable from EKS DescribeCluster (nodes launched
without them could never join). The rest of the batch goes on. A request only names claims: the service acts on
their stored state, so a redelivered record launches nothing twice.

Metrics: claims launched, launch failures by reason, launches refused (claims EC2 refused for a reason no retry
mends, `FailedClaim.refused`: they fail nothing, so the stack alarms on this count), time from claim to instance,
offerings found unavailable, USD/h launched.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from pydantic import ValidationError

from gpu_autoscaler.batch_failures import report_failures, time_for_a_record
from gpu_autoscaler.errors import ClusterBootstrapUnavailable, RequestThrottled
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.naming import log_service
from gpu_autoscaler.services.fleet import FleetService, LaunchOutcome, aws_fleet_service
from gpu_autoscaler.settings import load_settings

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
    from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service=log_service("fleet"))
tracer = Tracer(service="fleet")
metrics = Metrics(service="fleet")  # the namespace: POWERTOOLS_METRICS_NAMESPACE, the cluster's
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False, logger=logger)


@functools.cache
def service() -> FleetService:
    """Built on first use and kept while the execution environment lives (clients, subnets, catalog)."""
    return aws_fleet_service(load_settings())


def record_metrics(outcome: LaunchOutcome) -> None:
    metrics.add_metric(name="ClaimsLaunched", unit=MetricUnit.Count, value=len(outcome.launched))
    metrics.add_metric(name="UnavailableOfferings", unit=MetricUnit.Count, value=len(outcome.unavailable))
    metrics.add_metric(name="LaunchesRefused", unit=MetricUnit.Count, value=sum(f.refused for f in outcome.failed))
    metrics.add_metric(name="LaunchedPricePerHour", unit=MetricUnit.NoUnit, value=outcome.price_per_hour)
    for launched in outcome.launched:
        metrics.add_metric(name="TimeToLaunch", unit=MetricUnit.Seconds, value=launched.seconds_to_launch)
    for failed in outcome.failed:
        with single_metric(name="LaunchFailures", unit=MetricUnit.Count, value=1,
                           namespace=metrics.namespace) as metric:
            metric.add_dimension(name="service", value="fleet")
            metric.add_dimension(name="reason", value=failed.code)


@tracer.capture_method
def record_handler(record: SQSRecord, lambda_context: LambdaContext | None = None) -> dict[str, Any]:
    time_for_a_record(lambda_context)
    try:
        request = LaunchRequest.model_validate_json(record.body)
    except ValidationError as error:
        logger.error("not a launch request", extra={"messageId": record.message_id, "errors": error.errors(
            include_url=False, include_context=False)})
        raise
    try:
        outcome = service().launch(request)
    except RequestThrottled:
        logger.warning("CreateFleet stays throttled or unavailable; the request goes back to the queue",
                       extra={"messageId": record.message_id, "claims": request.claim_ids})
        raise
    except ClusterBootstrapUnavailable as error:
        logger.error("nothing launched: nodes could not join the cluster; the request goes back to the queue",
                     extra={"messageId": record.message_id, "claims": request.claim_ids, "error": str(error)})
        raise
    record_metrics(outcome)
    summary = outcome.summary()
    if outcome.failed:
        logger.warning("claims could not launch; their pods are pending again", extra=summary)
    else:
        logger.info("launch request handled", extra=summary)
    return summary


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
    return report_failures(metrics, event, processor)

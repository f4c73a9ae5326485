"""interruption: EventBridge events about our capacity (SQS interruption queue) → replacements, drains, closes.

Each record's body is the EventBridge event, unchanged. Events this function does not act on (a state it
ignores, a Health event for another service) are acknowledged with an info log; a body that is not an
event at all fails alone and goes to the dead-letter queue after `maxReceiveCount`.

Each (kind, instance) acts once (Powertools idempotency on the stack's table): AWS repeats notices, a
rebalance and a Spot warning may name the same instance minutes apart, and SQS redelivers. A failure
deletes the idempotency record, so the retry acts again.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyAlreadyInProgressError

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.batch_failures import report_failures, time_for_a_record
from gpu_autoscaler.domain.interruption import Notice, UnknownEvent, parse_notice
from gpu_autoscaler.naming import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE, log_service
from gpu_autoscaler.services.interruption import InterruptionService, aws_interruption_service
from gpu_autoscaler.settings import load_settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
    from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service=log_service("interruption"))
tracer = Tracer(service="interruption")
metrics = Metrics(service="interruption")  # the namespace: POWERTOOLS_METRICS_NAMESPACE, the cluster's
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False, logger=logger)
idempotency = IdempotencyConfig(expires_after_seconds=6 * 3600)
"""Long enough to cover AWS repeating a notice and SQS redriving a message; a rebalance hours later acts again."""
IDEMPOTENCY_PARTITION = "IDEMPOTENCY#interruption"
"""Records live beside the cluster's items in the single table, under their own partition."""


@functools.cache
def clients() -> AwsClients:
    """One set of boto3 clients for the service and the idempotency records: DynamoDB's model loads once."""
    settings = load_settings()
    return AwsClients(settings.region, settings.endpoint_url)


@functools.cache
def service() -> InterruptionService:
    """Built on first use and kept while the execution environment lives (clients, catalog, Kubernetes token)."""
    return aws_interruption_service(load_settings(), clients=clients())


@functools.cache
def act_once() -> Callable[..., dict[str, Any]]:
    """`_act` behind Powertools idempotency, keyed by (kind, instance); made on first use, after the
    environment (and, in tests, the emulator's endpoint) is known."""
    settings = load_settings()
    persistence = DynamoDBPersistenceLayer(
        table_name=settings.table_name,
        key_attr=PARTITION_KEY,
        sort_key_attr=SORT_KEY,
        static_pk_value=IDEMPOTENCY_PARTITION,
        expiry_attr=TTL_ATTRIBUTE,
        boto3_client=clients().client("dynamodb"),
    )
    return idempotent_function(data_keyword_argument="key", persistence_store=persistence,
                               config=idempotency)(_act)


def _act(key: dict[str, str], notice: Notice) -> dict[str, Any]:
    outcome = service().handle_instance(notice, key["instanceId"])
    metrics.add_metric(name=_METRICS.get(outcome.action, "NoticesIgnored"), unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="ReplacementClaims", unit=MetricUnit.Count, value=len(outcome.replacements))
    logger.info("notice acted on", extra=outcome.summary())
    return outcome.summary()


_METRICS = {"closed": "ClaimsClosed", "replace-and-drain": "NodesReplaced", "drain": "DrainsRequested"}


@tracer.capture_method
def record_handler(record: SQSRecord, lambda_context: LambdaContext | None = None) -> dict[str, Any]:
    time_for_a_record(lambda_context)
    try:
        notice = parse_notice(json.loads(record.body))
    except UnknownEvent as why:
        logger.info("event not acted on", extra={"messageId": record.message_id, "reason": str(why)})
        metrics.add_metric(name="EventsNotHandled", unit=MetricUnit.Count, value=1)
        return {"ignored": str(why)}
    except ValueError as error:  # json.JSONDecodeError is one
        logger.error("not an EventBridge event", extra={"messageId": record.message_id, "error": str(error)})
        raise
    metrics.add_metric(name="Notices", unit=MetricUnit.Count, value=1)
    instances = service().instances_for(notice)
    try:
        results = [act_once()(key={"kind": str(notice.kind), "instanceId": instance}, notice=notice)
                   for instance in instances]
    except IdempotencyAlreadyInProgressError:
        # Another invocation holds this notice, or one died holding it (its record stays in progress until
        # that invocation's timeout): the redelivery after the visibility timeout acts on it; if SQS gives up
        # first, this is the reason the dead letter carries.
        logger.warning("notice still in progress in another invocation; it goes back to the queue",
                       extra={"messageId": record.message_id, "eventId": notice.event_id,
                              "instances": list(instances)})
        raise
    return {"eventId": notice.event_id, "kind": str(notice.kind), "instances": results}


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    idempotency.register_lambda_context(context)
    process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
    return report_failures(metrics, event, processor)

"""consolidate: an EventBridge Scheduler tick (rate(1 minute)) → registrations reconciled, nodes given back.

The event is the schedule's input, a `ScheduleTick`; anything else fails with an `InvalidTick` naming the
problem (Scheduler retries, then dead-letters it). One call into the service, under the function's tick lease
(`services.tick_lease`): reconcile (registrations, registration timeouts, demand history), then consolidation
(replacements launched, drains requested). The response is its summary; each decision is logged with the USD/h it
saves, and counted per reason; the GPU pods the agent must have reported by now are counted too
(`GpuPodsUnschedulable`, `domain.agent_witness`), and a tick the Kubernetes API failed (`KubernetesUnreachable`). A
tick that finds another holding the lease does nothing and
answers `{"skipped": true, "leaseHolder", "leaseExpiresAt"}`, counted as `TicksSkipped`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from gpu_autoscaler.naming import log_service
from gpu_autoscaler.services.aws_environment import AwsEnvironment
from gpu_autoscaler.services.consolidate import ConsolidateService, aws_consolidate_service
from gpu_autoscaler.services.prewarm import InvalidTick, parse_tick
from gpu_autoscaler.services.tick_lease import TickLease, TickSkipped
from gpu_autoscaler.settings import load_settings

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service=log_service("consolidate"))
tracer = Tracer(service="consolidate")
metrics = Metrics(service="consolidate")  # the namespace: POWERTOOLS_METRICS_NAMESPACE, the cluster's


@functools.cache
def environment() -> AwsEnvironment:
    return AwsEnvironment(load_settings())


@functools.cache
def service() -> ConsolidateService:
    """Built on first use and kept while the execution environment lives (clients, catalog, solver caches)."""
    return aws_consolidate_service(environment())


@functools.cache
def lease() -> TickLease:
    """What keeps two ticks apart: the function reserves no concurrency (a new account has none to give)."""
    return environment().tick_lease("consolidate")


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        tick = parse_tick(event)
    except InvalidTick as error:
        logger.error("not a ScheduleTick", extra={"error": str(error), "event": event})
        metrics.add_metric(name="TicksRejected", unit=MetricUnit.Count, value=1)
        raise
    outcome = lease().run_invocation(context, lambda: service().run(tick))
    if isinstance(outcome, TickSkipped):
        metrics.add_metric(name="TicksSkipped", unit=MetricUnit.Count, value=1)
        return outcome.summary()
    metrics.add_metric(name="ClaimsRegistered", unit=MetricUnit.Count, value=len(outcome.reconcile.registered))
    metrics.add_metric(name="RegistrationTimeouts", unit=MetricUnit.Count, value=len(outcome.reconcile.timed_out))
    # Instances of live claims EC2 still has without our ownership tag: left alone, and no longer ours to end.
    collected = outcome.reconcile.collected
    metrics.add_metric(name="OwnershipTagLost", unit=MetricUnit.Count,
                       value=len(collected.ownership_lost) if collected is not None else 0)
    metrics.add_metric(name="ConsolidationSavingPerHour", unit=MetricUnit.NoUnit, value=outcome.saving)
    metrics.add_metric(name="ConsolidationsProposed", unit=MetricUnit.Count, value=len(outcome.proposed))
    metrics.add_metric(name="ConsolidationsRejected", unit=MetricUnit.Count, value=len(outcome.rejected))
    # Weighed against what reached the pending-pods queue: GPU pods waiting while the agent sends nothing.
    metrics.add_metric(name="GpuPodsUnschedulable", unit=MetricUnit.Count, value=outcome.gpu_pods_unschedulable)
    # A tick the Kubernetes API failed ends normally (the next one is the retry): counted, so that an endpoint the
    # function never reaches is an alarm after minutes, not a WARNING each minute.
    metrics.add_metric(name="KubernetesUnreachable", unit=MetricUnit.Count, value=int(outcome.api_failure is not None))
    dimensions = {**metrics.default_dimensions, "service": "consolidate"}
    for reason, (count, saving) in outcome.by_reason().items():
        # One EMF document per reason: a dimension of its own, which the handler-wide metrics cannot carry.
        with single_metric(name="ConsolidationDecisions", unit=MetricUnit.Count, value=count,
                           namespace=metrics.namespace, default_dimensions=dimensions) as metric:
            metric.add_dimension(name="reason", value=reason)
        with single_metric(name="ConsolidationSavingPerHourByReason", unit=MetricUnit.NoUnit, value=saving,
                           namespace=metrics.namespace, default_dimensions=dimensions) as metric:
            metric.add_dimension(name="reason", value=reason)
    return outcome.summary()

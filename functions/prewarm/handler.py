"""prewarm: an EventBridge Scheduler tick (a scaling window's cron, or rate(5 minutes)) → warm capacity.

The event is the schedule's input, a `ScheduleTick`; anything else fails with an `InvalidTick` naming the
problem (Scheduler retries, then dead-letters it). One call into the service, under the function's tick lease
(`services.tick_lease`); the response is its summary: warm targets per pool, claims launched and released, and the
forecast status (`disabled`, `ok`, `insufficient-history` when a pool has under 24 h of demand history, or
`partial`). A tick that finds another holding the lease does nothing and answers `{"skipped": true,
"leaseHolder", "leaseExpiresAt"}`, counted as `TicksSkipped`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit

from gpu_autoscaler.naming import log_service
from gpu_autoscaler.services.aws_environment import AwsEnvironment
from gpu_autoscaler.services.prewarm import InvalidTick, PrewarmService, aws_prewarm_service, parse_tick
from gpu_autoscaler.services.tick_lease import TickLease, TickSkipped
from gpu_autoscaler.settings import load_settings

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service=log_service("prewarm"))
tracer = Tracer(service="prewarm")
metrics = Metrics(service="prewarm")  # the namespace: POWERTOOLS_METRICS_NAMESPACE, the cluster's


@functools.cache
def environment() -> AwsEnvironment:
    return AwsEnvironment(load_settings())


@functools.cache
def service() -> PrewarmService:
    """Built on first use and kept while the execution environment lives (clients, catalog, solver caches)."""
    return aws_prewarm_service(environment())


@functools.cache
def lease() -> TickLease:
    """What keeps two ticks apart: the function reserves no concurrency (a new account has none to give)."""
    return environment().tick_lease("prewarm")


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
    summary = outcome.summary()
    metrics.add_metric(name="WarmClaimsLaunched", unit=MetricUnit.Count, value=len(outcome.launched))
    metrics.add_metric(name="WarmClaimsReleased", unit=MetricUnit.Count, value=len(outcome.released))
    metrics.add_metric(name="WarmTargetGpus", unit=MetricUnit.Count,
                       value=sum(p.target for p in outcome.decision.pools))
    if outcome.forecast_status not in ("ok", "disabled"):
        logger.warning("forecast not available for every pool", extra={"forecastStatus": outcome.forecast_status})
    return summary

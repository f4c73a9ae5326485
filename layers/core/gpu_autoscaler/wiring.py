"""How the functions are triggered: queue → function, batch sizes, timeouts, redrive, schedules.

The CDK stack (`infra/`) builds the event source mappings, queues and schedules from these values, and the
emulator drives the handlers by the same ones, so the two cannot drift apart. Plain data only: no CDK,
no boto3.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import timedelta

from gpu_autoscaler.naming import FUNCTIONS

__all__ = [
    "APPLICATION_LOG_LEVEL",
    "FULL_VCPU_MB",
    "FIFO_QUEUE",
    "FUNCTION_WIRING",
    "MAX_RECEIVE_COUNT",
    "QUEUES",
    "RATE_SCHEDULES",
    "RULE_TARGET_MAX_EVENT_AGE_SECONDS",
    "RULE_TARGET_RETRY_ATTEMPTS",
    "SCHEDULED_TIME",
    "SCHEDULE_DELIVERY_RETRIES",
    "VISIBILITY_FACTOR",
    "FunctionWiring",
    "RateSchedule",
    "TickRetry",
    "consumer",
    "rate_period",
    "schedule_name",
    "tick_input",
    "tick_retry",
    "visibility_timeout",
]

QUEUES = ("pending-pods", "interruption", "launch", "drain")
"""The work queues, by logical name (each has a `<name>-dlq`)."""

FIFO_QUEUE = "pending-pods"
"""The one FIFO queue: the agent's documents, in one message group per cluster (its MessageGroupId), so Lambda
runs its consumer one batch at a time ("for FIFO queues, concurrent invocations are capped either by the number of
message group IDs or the maximum concurrency setting")."""

MAX_RECEIVE_COUNT = 5
"""Deliveries before SQS moves a message to its DLQ: enough to ride out throttling and transient errors."""

VISIBILITY_FACTOR = 6
"""AWS's advice for Lambda consumers: visibility ≥ 6 × function timeout, so retries of a throttled batch
do not make a message visible again while a function still holds it."""

APPLICATION_LOG_LEVEL = "INFO"
"""Every function's application log level (Lambda's advanced logging controls, with the JSON log format). The
Python runtime sets the root logger's level from it (`AWS_LAMBDA_LOG_LEVEL`); without one the root stays at the
standard library's WARNING, and the services' INFO lines (each consolidation decision, each launch) never reach
the log. Powertools' Logger takes the same level from it."""


@dataclass(frozen=True)
class TickRetry:
    """What a failed or late tick of a scheduled function gets. Scheduler invokes Lambda asynchronously ("When you
    set up EventBridge Scheduler with Lambda, EventBridge Scheduler invokes your Lambda function asynchronously"):
    once Lambda has queued the tick, a function error is retried by Lambda, as the function's asynchronous
    invocation config (EventInvokeConfig) says (at most 2 retries, "a one-minute wait between the first two
    attempts, and two minutes between the second and third"), and a tick Lambda throttles (the account's
    concurrency all in use) is kept and tried again until it is `max_event_age_seconds` old. The schedule's own
    RetryPolicy only covers delivering the tick to Lambda. A tick that finds another running skips without an
    error (`services.tick_lease`), so it is not retried."""

    retry_attempts: int
    max_event_age_seconds: int


@dataclass(frozen=True)
class FunctionWiring:
    """What differs between the functions in how Lambda runs and feeds them."""

    name: str
    timeout_seconds: int
    memory_mb: int
    queue: str | None
    """Logical name of the queue feeding it (`QUEUES`), or None for the functions Scheduler invokes."""
    batch_size: int = 10
    batching_window_seconds: int = 0
    """The event source mapping's MaximumBatchingWindowInSeconds (0: hand over what one receive returns)."""
    max_concurrency: int | None = None
    """Cap on the SQS pollers' concurrent invocations (≥ 2) where a burst must not hammer an API. No function
    reserves concurrency: Lambda keeps 100 of an account's unreserved ("You can reserve up to the Unreserved
    account concurrency value that is shown, minus 100 for functions that don't have reserved concurrency"), and
    "New AWS accounts have reduced concurrency and memory quotas", as low as 10 ("…below its minimum value of
    [10]"): any reservation fails the deploy there."""
    recursive: bool = False
    """Sends to its own queue on purpose (drain progress), so Lambda's loop detection must not stop it."""
    tick_retry: TickRetry | None = None
    """For the functions Scheduler invokes (no queue): their EventInvokeConfig."""


FULL_VCPU_MB = 1769
"""Lambda's memory setting at which a function gets one whole vCPU (Lambda developer guide, memory and
computing power)."""

FUNCTION_WIRING: dict[str, FunctionWiring] = {
    w.name: w
    for w in (
        # One packer at a time without a reservation (`FIFO_QUEUE`): the cluster's reports are packed in order,
        # and two packers never claim capacity for the same pods.
        FunctionWiring("packer", timeout_seconds=60, memory_mb=1024, queue="pending-pods"),
        FunctionWiring("fleet", timeout_seconds=120, memory_mb=512, queue="launch", batch_size=5, max_concurrency=5,
                       recursive=True),
        # A full vCPU (Lambda allocates CPU in proportion to memory, one vCPU at 1,769 MB): the Spot warning →
        # cordon path with a cold start is CPU-bound, ~3.6 CPU-seconds (`python -m benchmarks itn-cordon`),
        # more than the 5 s budget on 512 MB's third of a vCPU.
        # One notice an invocation, up to ten at once. A handler acts on its batch's records one after another,
        # so with ten a batch the tenth Spot warning waited for nine acts, and a record not started within the
        # first 18 s (`batch_failures.RECORD_RESERVE_SECONDS`) went back unstarted, each time counting toward
        # maxReceiveCount: in a storm of slow acts a notice was dead-lettered, its node neither replaced nor
        # drained. Karpenter acts on a receive's messages in parallel, ten at a time (karpenter-provider-aws
        # `pkg/controllers/interruption/controller.go`, `workqueue.ParallelizeUntil(ctx, 10, …)`); here Lambda's
        # concurrent invocations do, capped at ten so a storm's cold starts do not all load the catalog from the
        # EC2 and Pricing APIs at once. At the cap the event source mapping stops reading until an invocation ends,
        # so no delivery is spent (AWS Compute Blog, "Introducing maximum concurrency of AWS Lambda functions when
        # using Amazon SQS as an event source"), where a reserved concurrency would throttle and return messages.
        FunctionWiring("interruption", timeout_seconds=60, memory_mb=FULL_VCPU_MB, queue="interruption",
                       batch_size=1, max_concurrency=10),
        FunctionWiring("drain", timeout_seconds=300, memory_mb=512, queue="drain", batch_size=1, max_concurrency=10,
                       recursive=True),
        # Scheduler-invoked, so nothing but their lease in the state table keeps two ticks from running at once
        # (a window's and the rate tick both at 09:00; a consolidation longer than its minute): the tick that finds
        # it held skips (`services.tick_lease`); the one running does the whole job.
        # A window's start matters more than a rate tick: a failed tick is retried as often as Lambda allows and
        # kept 15 minutes. One function has one config, so the 5-minute rate tick gets the same: each tick does
        # the whole job from the state and the time it runs at (the time it was due, `SCHEDULED_TIME`, is only
        # logged), so a late one does no harm.
        FunctionWiring("prewarm", timeout_seconds=120, memory_mb=1024, queue=None,
                       tick_retry=TickRetry(retry_attempts=2, max_event_age_seconds=900)),
        # A tick older than its one-minute period is superseded by the next one: dropped, never retried.
        FunctionWiring("consolidate", timeout_seconds=120, memory_mb=1024, queue=None,
                       tick_retry=TickRetry(retry_attempts=0, max_event_age_seconds=60)),
    )
}  # fmt: skip

if tuple(FUNCTION_WIRING) != FUNCTIONS:
    raise RuntimeError("FUNCTION_WIRING must list exactly gpu_autoscaler.naming.FUNCTIONS, in order")
if any((w.queue is None) != (w.tick_retry is not None) for w in FUNCTION_WIRING.values()):
    raise RuntimeError("FUNCTION_WIRING: a function has a queue or, Scheduler invoking it, a tick_retry")


def consumer(queue: str) -> FunctionWiring:
    """The function a work queue feeds."""
    for wiring in FUNCTION_WIRING.values():
        if wiring.queue == queue:
            return wiring
    raise KeyError(f"no function consumes queue '{queue}'; queues: {', '.join(QUEUES)}")


def visibility_timeout(queue: str) -> int:
    """Seconds: `VISIBILITY_FACTOR` × the consuming function's timeout."""
    return consumer(queue).timeout_seconds * VISIBILITY_FACTOR


# ---- EventBridge rules (patterns: gpu_autoscaler.event_patterns) ------------------------------------------

RULE_TARGET_RETRY_ATTEMPTS = 8
RULE_TARGET_MAX_EVENT_AGE_SECONDS = 300
"""A 2-minute Spot warning is worthless later than this; what cannot be delivered goes to the queue's DLQ."""


# ---- EventBridge Scheduler ---------------------------------------------------------------------------------

SCHEDULED_TIME = "<aws.scheduler.scheduled-time>"
"""Scheduler's context attribute, replaced by the time the schedule was due: logged with what the tick did, so a
late retry shows which tick it was."""


SCHEDULE_DELIVERY_RETRIES = 5
"""Scheduler's own retries of a tick it could not hand to Lambda (the Invoke call failed), within the tick's
`TickRetry.max_event_age_seconds`; a function error is Lambda's to retry (`TickRetry`)."""


def tick_retry(function: str) -> TickRetry:
    """The retries and age of a scheduled function's ticks."""
    retry = FUNCTION_WIRING[function].tick_retry
    if retry is None:
        raise KeyError(f"'{function}' is not invoked by Scheduler")
    return retry


@dataclass(frozen=True)
class RateSchedule:
    function: str
    expression: str

    @property
    def name(self) -> str:
        return f"{self.function}-rate"

    @property
    def period(self) -> timedelta:
        return _rate_period(self.expression)


RATE_SCHEDULES = (
    RateSchedule("prewarm", "rate(5 minutes)"),
    RateSchedule("consolidate", "rate(1 minute)"),
)

_RATE = re.compile(r"^rate\((?P<value>\d+)\s+(?P<unit>minutes?|hours?|days?)\)$")


def _rate_period(expression: str) -> timedelta:
    match = _RATE.match(expression.strip())
    if not match:
        raise ValueError(f"'{expression}' is not a rate expression like 'rate(5 minutes)'")
    unit = match.group("unit").rstrip("s") + "s"
    return timedelta(**{unit: int(match.group("value"))})


def rate_period(function: str) -> timedelta:
    """The period of a scheduled function's rate schedule."""
    for rate in RATE_SCHEDULES:
        if rate.function == function:
            return rate.period
    raise KeyError(f"no rate schedule for '{function}'")


def tick_input(window: str | None) -> str:
    """The target input: `gpu_autoscaler.models.messages.ScheduleTick` as JSON."""
    tick: dict[str, str] = {"trigger": "window", "window": window} if window else {"trigger": "rate"}
    tick["scheduledTime"] = SCHEDULED_TIME
    return json.dumps(tick, separators=(",", ":"))


def schedule_name(window: str) -> str:
    """`window-<name>`, shortened with a digest when the 64-character limit would cut it."""
    name = f"window-{window}"
    if len(name) <= 64:
        return name
    digest = hashlib.sha256(window.encode()).hexdigest()[:8]
    return f"window-{window[:47]}-{digest}"

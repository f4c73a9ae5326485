"""EventBridge Scheduler, played by the emulator: fire the stack's schedules at their times.

The schedules are read back from the endpoint (`triggers.read_schedules`), as the stack created them:

- rate schedules (`rate(5 minutes)` prewarm, `rate(1 minute)` consolidate) fire every period divided by
  `speed`, so a demo can watch several ticks in a minute;
- cron schedules (the scaling windows, with their time zone) fire when the wall clock reaches the next
  occurrence, daylight saving time as EventBridge Scheduler documents it (`scheduler_cron`, the emulator's
  own reading of the documentation: the project's window code is what it witnesses). They are not
  compressed: the functions judge whether a window is open by the wall clock, and a tick at a time that is
  not the window's would tell them nothing.

A tick is the schedule's input with `<aws.scheduler.scheduled-time>` replaced by the time it was due, handed
to the function as Lambda's asynchronous invocation would: a failure is retried as often as the function's
`TickRetry` says (its EventInvokeConfig), then the invocation record goes to the scheduler DLQ (the functions'
on-failure destination).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.emulator.scheduler_cron import SchedulerCron
from gpu_autoscaler.wiring import SCHEDULED_TIME, RateSchedule, tick_retry

if TYPE_CHECKING:
    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.lambdas import Invocation, LambdaHost
    from gpu_autoscaler.emulator.triggers import ScheduleSpec

__all__ = ["ScheduleRunner"]

log = logging.getLogger(__name__)


@dataclass
class _Due:
    spec: ScheduleSpec
    next_at: datetime | None
    period: timedelta | None = None
    """Compressed period of a rate schedule; None for cron."""
    cron: SchedulerCron | None = None
    fired: int = 0


@dataclass
class ScheduleRunner:
    """Fires schedules on time until `stop` is set; `fire(name)` fires one now."""

    host: LambdaHost
    schedules: list[ScheduleSpec]
    sqs: Any
    dead_letter_url: str
    speed: float = 1.0
    clock: Clock = field(default_factory=SystemClock)
    _due: dict[str, _Due] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError(f"speed must be positive, got {self.speed}")
        now = self.clock.now()
        for spec in self.schedules:
            if spec.expression.startswith("rate("):
                period = RateSchedule(spec.function, spec.expression).period / self.speed
                self._due[spec.name] = _Due(spec, now + period, period=period)
            else:
                cron = SchedulerCron.parse(spec.expression, spec.timezone)
                self._due[spec.name] = _Due(spec, cron.next_after(now), cron=cron)

    def next_times(self) -> dict[str, datetime | None]:
        """Schedule name → when it fires next (None: never again)."""
        with self._lock:
            return {name: due.next_at for name, due in self._due.items()}

    def fired(self) -> dict[str, int]:
        with self._lock:
            return {name: due.fired for name, due in self._due.items()}

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            for spec, scheduled in self._take_due(self.clock.now()):
                self._fire(spec, scheduled=scheduled)
            upcoming = [t for t in self.next_times().values() if t is not None]
            wait = min((t - self.clock.now()).total_seconds() for t in upcoming) if upcoming else 1.0
            stop.wait(min(max(wait, 0.05), 1.0))

    def _take_due(self, now: datetime) -> list[tuple[ScheduleSpec, datetime]]:
        fired = []
        with self._lock:
            for due in self._due.values():
                if due.next_at is None or due.next_at > now:
                    continue
                fired.append((due.spec, due.next_at))
                due.fired += 1
                if due.period is not None:
                    due.next_at = max(due.next_at + due.period, now)
                elif due.cron is not None:
                    due.next_at = due.cron.next_after(now)
        return fired

    def fire(self, name: str) -> Invocation:
        """Fire schedule `name` now, as if it were due."""
        with self._lock:
            due = self._due.get(name)
            if due is None:
                raise KeyError(f"no schedule '{name}'; known: {', '.join(sorted(self._due))}")
            due.fired += 1
        return self._fire(due.spec, scheduled=self.clock.now())

    def _fire(self, spec: ScheduleSpec, *, scheduled: datetime) -> Invocation:
        stamp = scheduled.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        payload = json.loads(spec.input.replace(SCHEDULED_TIME, stamp))
        invocation = self.host.invoke(spec.function, payload, trigger=f"schedule {spec.name}")
        for _ in range(tick_retry(spec.function).retry_attempts):
            if invocation.error is None:
                return invocation
            invocation = self.host.invoke(spec.function, payload, trigger=f"schedule {spec.name} (retry)")
        if invocation.error is not None:
            self._dead_letter(spec, payload, invocation)
        return invocation

    def _dead_letter(self, spec: ScheduleSpec, payload: Any, invocation: Invocation) -> None:
        """Lambda's on-failure destination record for an asynchronous invocation that failed every attempt."""
        error_type, _, message = (invocation.error or "").partition(": ")
        record = {
            "version": "1.0",
            "timestamp": invocation.started.isoformat(),
            "requestContext": {
                "requestId": str(uuid.uuid4()),
                "functionArn": f"{spec.target_arn}:$LATEST",
                "condition": "RetriesExhausted",
                "approximateInvokeCount": tick_retry(spec.function).retry_attempts + 1,
            },
            "requestPayload": payload,
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "responsePayload": {"errorType": error_type, "errorMessage": message},
        }
        self.sqs.send_message(QueueUrl=self.dead_letter_url, MessageBody=json.dumps(record))
        log.warning("schedule %s: %s failed %d times; sent to the scheduler DLQ", spec.name, spec.function,
                    tick_retry(spec.function).retry_attempts + 1)

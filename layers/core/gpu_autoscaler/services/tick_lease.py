"""One tick at a time of a scheduled function (prewarm, consolidate), by a lease in the state table.

Each tick reads the whole state and acts on it, so two at once could both buy the same warm capacity or both drain
the same node. Scheduler does not keep them apart (a window's tick and the rate tick both at 09:00; a tick longer
than its period), and reserved concurrency, which would, cannot be had in a new account: Lambda keeps 100 of an
account's concurrency unreserved ("You can reserve up to the Unreserved account concurrency value that is shown,
minus 100 for functions that don't have reserved concurrency"), and "New AWS accounts have reduced concurrency and
memory quotas" (Lambda quotas), as low as 10 ("…below its minimum value of [10]"): a reservation fails the deploy.

So a tick takes its function's lease (`ports.TickLeases`, one conditional write) until its invocation's end
(now + what is left of it, at most the function's timeout), when Lambda would have stopped it at the latest, so
a tick that crashed or timed out frees it by itself; does its work; and gives the lease back, only if it is still
its own. A tick that finds the lease held skips:
logged (the holder, until when), reported (`TickSkipped`), and it returns normally, since an error would have
Lambda retry the asynchronous invocation (`wiring.TickRetry`) and retried ticks would pile up behind the one
running. Nothing is lost: every tick does the whole job from the state at the time it runs, and the next one
comes within the schedule's period.

The simulator runs its ticks one at a time in one thread and takes no lease.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gpu_autoscaler.models.leases import Lease
from gpu_autoscaler.wiring import FUNCTION_WIRING

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.ports import TickLeases

__all__ = ["TickLease", "TickSkipped"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class TickSkipped:
    """A tick that found another holding the lease, and did nothing."""

    held: Lease

    def summary(self) -> dict[str, Any]:
        """The handler's response."""
        return {"skipped": True, "leaseHolder": self.held.holder, "leaseExpiresAt": self.held.expires_at.isoformat()}


class TickLease:
    """The lease of one scheduled function's ticks."""

    def __init__(self, leases: TickLeases, function: str, clock: Clock) -> None:
        self.leases = leases
        self.function = function
        self.clock = clock
        self.hold = timedelta(seconds=FUNCTION_WIRING[function].timeout_seconds)
        """The function's timeout, "the amount of time (in seconds) that Lambda allows a function to run before
        stopping it" (Lambda API reference, CreateFunction): no holder outlives its lease."""

    def run(self, holder: str, tick: Callable[[], T], *, remaining: timedelta | None = None) -> T | TickSkipped:
        """`tick()` under the lease, as `holder` (the invocation's request id); a `TickSkipped` naming the lease
        held, without calling `tick`, when another holds it. The lease is given back however `tick` ends.

        `remaining`: what is left of the invocation (`get_remaining_time_in_millis`), when Lambda stops it at the
        latest; the lease is held no longer than that (at most the function's timeout), so a holder that crashed or
        was stopped keeps the next ticks out only until its own end."""
        now = self.clock.now()
        hold = self.hold if remaining is None else min(self.hold, remaining)
        lease = Lease(name=self.function, holder=holder, expires_at=now + hold)
        held = self.leases.take(lease, now)
        if held is not None:
            logger.info("%s tick skipped: another tick holds the lease (request %s, until %s)", self.function,
                        held.holder, held.expires_at.isoformat(),
                        extra={"leaseHolder": held.holder, "leaseExpiresAt": held.expires_at.isoformat()})
            return TickSkipped(held)
        try:
            return tick()
        finally:
            if not self.leases.release(lease):
                logger.warning("%s tick %s outlived its lease (until %s), which another tick has taken over since",
                               self.function, holder, lease.expires_at.isoformat())

    def run_invocation(self, context: Invocation, tick: Callable[[], T]) -> T | TickSkipped:
        """`run` for a Lambda invocation: held by its request id until its end."""
        return self.run(context.aws_request_id, tick,
                        remaining=timedelta(milliseconds=context.get_remaining_time_in_millis()))


class Invocation(Protocol):
    """What `run_invocation` reads of the Lambda context."""

    @property
    def aws_request_id(self) -> str: ...

    def get_remaining_time_in_millis(self) -> int: ...

"""Two prewarm ticks at once (a window's tick and the rate tick, both at 09:00; a tick longer than its period): the
one that finds the lease held skips, so warm capacity is bought once. Without the lease (what the reserved
concurrency of 1 used to prevent, and a new account cannot reserve) the second tick reads the state before the
first has written its claims, and both buy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.memory.tick_leases import MemoryTickLeases
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.packing.solver import Solver
from gpu_autoscaler.domain.prewarm import WARM_GPUS_ATTRIBUTE, window_warm
from gpu_autoscaler.models.messages import ScheduleTick
from gpu_autoscaler.services.prewarm import PrewarmService, SolverPlanner
from gpu_autoscaler.services.tick_lease import TickLease, TickSkipped

from .builders import make_catalog, make_config
from .fakes import MemoryStore, RecordingQueue

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.models.claims import NodeClaim

OPENS = datetime(2026, 1, 5, 14, tzinfo=UTC)  # 09:00 in New York: the example window's start
FIRST = OPENS - timedelta(minutes=10, seconds=10)  # inside the lead time and tick period; its own 5-minute bucket
SECOND = FIRST + timedelta(seconds=20)  # the next bucket: its placeholder pods (and claim ids) differ


class InterruptedStore(MemoryStore):
    """Runs `meanwhile` once, when the first claim is about to be stored: the first tick has read the state and
    decided, and has not written yet."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: Callable[[], Any] | None = None

    def create_claim(self, claim: NodeClaim) -> None:
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()
        super().create_claim(claim)


class Rig:
    def __init__(self) -> None:
        self.config = make_config()
        self.clock = FixedClock(FIRST)
        self.store = InterruptedStore()
        self.queue = RecordingQueue()
        catalog = make_catalog()
        solver = Solver(self.config, catalog, self.clock)
        self.service = PrewarmService(self.config, self.store, self.queue,  # type: ignore[arg-type]
                                      catalog.instance_types, clock=self.clock,
                                      plan_capacity=SolverPlanner(lambda: solver, self.store))  # type: ignore[arg-type]
        self.lease = TickLease(MemoryTickLeases(), "prewarm", self.clock)

    def warm_gpus(self) -> float:
        return sum(float(c.attributes[WARM_GPUS_ATTRIBUTE]) for c in self.store.claims.values()
                   if c.warm == window_warm("peak"))


def test_a_tick_that_starts_while_another_runs_skips_and_buys_nothing() -> None:
    rig = Rig()
    seconds: list[Any] = []

    def second_tick() -> None:
        rig.clock.set(SECOND)
        seconds.append(rig.lease.run("request-2", lambda: rig.service.run(ScheduleTick(trigger="window",
                                                                                         window="peak"))))
        rig.clock.set(FIRST + timedelta(seconds=30))

    rig.store.meanwhile = second_tick
    first = rig.lease.run("request-1", lambda: rig.service.run(ScheduleTick(trigger="rate")))
    [skipped] = seconds
    assert isinstance(skipped, TickSkipped) and skipped.held.holder == "request-1"
    assert not isinstance(first, TickSkipped) and first.launched
    assert rig.warm_gpus() == 8  # the window's 8 GPUs, bought once
    assert sorted(rig.queue.claim_ids) == sorted(c.id for c in first.launched)


def test_without_the_lease_the_same_overlap_buys_the_window_twice() -> None:
    """The hazard the lease keeps away: this rig's overlap is a real one."""
    rig = Rig()

    def second_tick() -> None:
        rig.clock.set(SECOND)
        rig.service.run(ScheduleTick(trigger="window", window="peak"))

    rig.store.meanwhile = second_tick
    rig.service.run(ScheduleTick(trigger="rate"))
    assert rig.warm_gpus() == 16

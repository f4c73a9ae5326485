"""Two consolidate ticks at once (a tick longer than its one-minute period): the one that finds the lease held skips,
so a node is drained once. Without the lease (what the reserved concurrency of 1 used to prevent, and a new account
cannot reserve) the second tick finds the first's decision marked but its drain not yet sent, takes it for a tick
that died there, and sends the drain again."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.memory.tick_leases import MemoryTickLeases
from gpu_autoscaler.services.tick_lease import TickLease, TickSkipped
from tests.unit.consolidation.builders import Cluster, pool_config
from tests.unit.consolidation.test_service import Rig

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.models.messages import DrainRequest


class Interrupted:
    """The drain queue, running `meanwhile` once before the first drain is sent: the first tick has marked its
    decision and not yet queued the drain."""

    def __init__(self, rig: Rig) -> None:
        self.drains = rig.service.drains
        self.meanwhile: Callable[[], Any] | None = None

    def send(self, request: DrainRequest, delay: timedelta | None = None) -> None:
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()
        self.drains.send(request, delay)


def rig_with_a_node_to_replace() -> tuple[Rig, str, Interrupted]:
    scene = Cluster(pool_config())
    big = scene.node("g5.48xlarge")
    scene.pod(big, gpus=4, cpu="16", memory="64Gi")
    rig = Rig(scene)
    interrupted = Interrupted(rig)
    rig.service.drains = interrupted
    return rig, big, interrupted


def test_a_tick_that_starts_while_another_runs_skips_and_drains_nothing() -> None:
    rig, big, interrupted = rig_with_a_node_to_replace()
    lease = TickLease(MemoryTickLeases(), "consolidate", rig.clock)
    seconds: list[Any] = []

    def second_tick() -> None:
        rig.clock.advance(timedelta(seconds=10))
        seconds.append(lease.run("request-3", rig.service.run))

    interrupted.meanwhile = second_tick
    lease.run("request-1", rig.service.run)  # proposes
    rig.clock.advance(timedelta(minutes=1))
    acted = lease.run("request-2", rig.service.run)  # validates, acts; the second tick starts before its drain
    [skipped] = seconds
    assert isinstance(skipped, TickSkipped) and skipped.held.holder == "request-2"
    assert not isinstance(acted, TickSkipped) and [d.nodes for d in acted.acted] == [(big,)]
    assert [d.node_name for d in rig.sent("drain")] == [big]


def test_without_the_lease_the_same_overlap_drains_the_node_twice() -> None:
    """The hazard the lease keeps away: this rig's overlap is a real one."""
    rig, big, interrupted = rig_with_a_node_to_replace()

    def second_tick() -> None:
        rig.clock.advance(timedelta(seconds=10))
        rig.service.run()

    interrupted.meanwhile = second_tick
    rig.service.run()
    rig.clock.advance(timedelta(minutes=1))
    rig.service.run()
    assert [d.node_name for d in rig.sent("drain")] == [big, big]

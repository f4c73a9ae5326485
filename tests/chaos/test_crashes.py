"""Scenario 3: a function dies mid-way — at each point where it leaves half-done work, in packer, fleet,
interruption, drain and consolidate — and the redelivery completes the work exactly once.

One emulator for the module; each seed runs the whole lifecycle (pods arrive and bind, a Spot warning takes a
node, the pods are deleted and the capacity given back) with one crash point per function, and the invariants
are checked after every phase. Seed 0 takes each function's first point (the issue's: packer after the claim
writes before the launch message, fleet after CreateFleet before the claim write, interruption and
consolidation after the claim write before the drain message, drain after TerminateInstances before the
claim write); other seeds draw among the points of `scenarios.CRASH_POINTS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.chaos.conftest import seeds
from tests.chaos.faults import CrashPlan
from tests.chaos.invariants import wait_for_invariants
from tests.chaos.rig import gpu_pod
from tests.chaos.scenarios import CONSOLIDATION_MARKED_NOT_SENT, CRASH_POINTS, crash_lifecycle, crash_points_for

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig


@pytest.mark.parametrize("seed", seeds(0, extra=2))
def test_a_crash_at_each_point_is_redelivered_and_done_exactly_once(rig: ChaosRig, seed: int) -> None:
    points = crash_points_for(seed)
    result, plan = crash_lifecycle(rig, points, prefix=f"crash{seed}")

    assert result.report.ok, str(result.report)
    crashed = {p.function for p in plan.crashed}
    assert crashed == set(CRASH_POINTS), f"crash points never reached: {[str(p) for p in plan.points]}"
    assert result.report.pods == 0 and result.report.instances == 0, "everything given back at the end"


def test_consolidation_dying_between_its_mark_and_the_drain_gives_the_node_back_on_the_next_tick(
    rig: ChaosRig,
) -> None:
    rig.begin()
    plan = CrashPlan(points=[CONSOLIDATION_MARKED_NOT_SENT])
    try:
        with plan.install(rig.pipeline.host):
            rig.create_pods([gpu_pod("marked-0")])
            rig.wait(rig.all_bound, 60, "the pod to be bound")
            rig.delete_pods()
            rig.wait(lambda: bool(plan.crashed), 30, "consolidation to die after its mark")
            rig.wait(lambda: not rig.instances("pending", "running"), 12, "the node to be given back by a later tick")
    finally:  # what the stall left: EC2 takes it back, the collector closes its claim
        left = [i["InstanceId"] for i in rig.instances("pending", "running")]
        if left:
            rig.ec2.terminate_instances(InstanceIds=left)
        rig.wait(lambda: wait_for_invariants(rig, 0).ok, 60, "the leftovers to be collected")

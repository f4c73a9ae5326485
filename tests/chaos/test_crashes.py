"""Scenario 3: a function dies mid-way — at each point where it leaves half-done work, in packer, fleet,
interruption, drain and consolidate — and the redelivery completes the work exactly once.

One emulator for the module; each seed runs the whole lifecycle (pods arrive and bind, a Spot warning takes a
node, the pods are deleted and the capacity given back) with one crash point per function, and the invariants
are checked after every phase. Seed 0 takes each function's first point (the issue's: packer after the claim
writes before the launch message, fleet after CreateFleet before the claim write, interruption and
consolidation after the claim write before the drain message, drain after TerminateInstances before the
claim write); other seeds draw among the points of `scenarios.CRASH_POINTS`. Every seed also has consolidation
die between marking a node and sending its drain: the next tick finds the mark without its drain noted as sent
and sends it, so the capacity is given back within the lifecycle's minute (it used to wait for the mark to lapse,
30 minutes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.chaos.conftest import seeds
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
    assert CONSOLIDATION_MARKED_NOT_SENT in plan.crashed, "consolidation never died between its mark and its drain"
    assert result.report.pods == 0 and result.report.instances == 0, "everything given back at the end"

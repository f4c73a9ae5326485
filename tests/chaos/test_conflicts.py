"""Scenario 5: conditional-write conflicts — two invocations updating one claim at once (the claim's version)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.chaos.scenarios import conflicting_launches

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig


def test_two_fleet_invocations_recording_one_launch_keep_one_instance(rig: ChaosRig) -> None:
    result, plan = conflicting_launches(rig)

    assert plan.released and all(came for _, came in plan.released), \
        f"the second writer never overlapped the first: {plan.released}"
    assert result.report.ok, str(result.report)

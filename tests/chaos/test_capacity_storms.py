"""Scenario 2: insufficient-capacity storms. EC2 has no Spot capacity for one GPU family (the strict layer's
`capacity_storm`: an instant CreateFleet answers `InsufficientInstanceCapacity` per override), then no On-Demand
either (5 s in CI, 30 s with GPU_AUTOSCALER_CHAOS_SOAK=1, which also draws other families and pod counts from random
seeds), then capacity returns. The pods need that family. After
each phase the four invariants hold: with Spot out they are bound On-Demand; with everything out they are released
and reported unschedulable with a reason (the fleet's report of the claim that could not launch, the packer's once
every offering is marked unavailable), none provisioned twice; once capacity is back, every pod is bound."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.chaos.conftest import SOAK, seeds
from tests.chaos.scenarios import capacity_storm_lifecycle, storm_shape

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig


@pytest.mark.parametrize("seed", seeds(0, extra=2))
def test_a_family_without_spot_then_without_capacity_releases_its_pods_with_reasons_then_places_them(
    rig: ChaosRig, seed: int,
) -> None:
    family, pods = storm_shape(seed)
    result = capacity_storm_lifecycle(rig, family=family, pods=pods, seed=seed, hold=30.0 if SOAK else 5.0,
                                      prefix=f"ice{seed}")

    assert result.report.ok, str(result.report)
    assert result.refused > 0, "the storm refused no launch"
    assert result.on_demand == result.pods // 2, "with Spot out, the pods go On-Demand"
    later = result.pods - result.pods // 2
    assert result.released == later, "with no capacity at all, every new pod is reported with a reason"

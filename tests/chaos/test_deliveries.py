"""Scenario 4: duplicate and out-of-order deliveries of every message type; the same Spot warning five times;
a rebalance, Spot warnings and the state change of one instance within seconds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.chaos.conftest import seeds
from tests.chaos.scenarios import duplicate_lifecycle, interruption_storm

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig


@pytest.mark.parametrize("seed", seeds(0, extra=2))
def test_every_message_delivered_twice_and_late_changes_nothing(rig: ChaosRig, seed: int) -> None:
    result, plan = duplicate_lifecycle(rig, seed, prefix=f"dup{seed}")

    assert result.report.ok, str(result.report)
    # Every queue of the pipeline saw duplicates: pending pods (agent), launch, drain.
    assert {q.split(".")[0].rsplit("-", 1)[-1] for q in plan.duplicated} >= {"pods", "launch", "drain"}, plan.duplicated


def test_rebalance_five_spot_warnings_and_the_state_change_replace_the_node_once(rig: ChaosRig) -> None:
    result = interruption_storm(rig, warnings=5)

    assert result.report.ok, str(result.report)

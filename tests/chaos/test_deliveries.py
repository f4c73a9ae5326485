"""Scenario 4: duplicate and out-of-order deliveries of every message type; the same Spot warning five times;
a rebalance, Spot warnings and the state change of one instance within seconds. Scenario 5, in the same run of
duplicates: two fleet invocations recording one launch at once (the claim's version decides)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.chaos.conftest import seeds
from tests.chaos.scenarios import duplicate_lifecycle, interruption_storm

if TYPE_CHECKING:
    from tests.chaos.faults import CrashPlan
    from tests.chaos.rig import ChaosRig
    from tests.chaos.scenarios import LifecycleResult


@pytest.fixture(scope="module", params=seeds(0, extra=2), ids=lambda seed: f"seed{seed}")
def duplicated(rig: ChaosRig, request: pytest.FixtureRequest) -> tuple[LifecycleResult, CrashPlan]:
    """One lifecycle with every message delivered twice, shared by the tests of scenarios 4 and 5."""
    return duplicate_lifecycle(rig, request.param, prefix=f"dup{request.param}")


def test_every_message_delivered_twice_and_late_changes_nothing(
    duplicated: tuple[LifecycleResult, CrashPlan],
) -> None:
    result, plan = duplicated

    assert result.report.ok, str(result.report)
    # Every queue of the pipeline saw duplicates: pending pods (agent), launch, drain.
    assert {q.split(".")[0].rsplit("-", 1)[-1] for q in plan.duplicated} >= {"pods", "launch", "drain"}, plan.duplicated


def test_two_fleet_invocations_recording_one_launch_keep_one_instance(
    duplicated: tuple[LifecycleResult, CrashPlan],
) -> None:
    result, plan = duplicated

    assert plan.released and all(came for _, came in plan.released), \
        f"the second writer never overlapped the first: {plan.released}"
    assert result.report.ok, str(result.report)


def test_rebalance_five_spot_warnings_and_the_state_change_replace_the_node_once(rig: ChaosRig) -> None:
    result = interruption_storm(rig, warnings=5)

    assert result.report.ok, str(result.report)

"""Scenario 8: clocks two minutes apart between the API server, the agent and the Lambdas (`tests/chaos/skew.py`
lists where one component's timestamp meets another's clock); the lifecycle — pods bound, a Spot warning, the
capacity given back — keeps every invariant, and nothing waits out or skips the skew (a node the API server
stamped two minutes "in the future" used to look too young to consolidate for those two minutes).

The DST half of the scenario is `tests/unit/emulator/test_scheduler_cron.py`: the emulator's EventBridge
Scheduler fires windows across every change as documented, and the project's window code agrees with it."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from tests.chaos.conftest import SOAK
from tests.chaos.skew import Skew, skewed_lifecycle

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig

TWO = timedelta(minutes=2)
SKEWS = [Skew(api_server=TWO, agent=-TWO)]
if SOAK:
    SKEWS += [Skew(api_server=-TWO, agent=TWO), Skew(lambdas=TWO), Skew(lambdas=-TWO, api_server=TWO)]


@pytest.mark.parametrize("skew", SKEWS, ids=str)
def test_clocks_two_minutes_apart_keep_every_invariant(rig: ChaosRig, skew: Skew) -> None:
    result = skewed_lifecycle(rig, skew, prefix=f"skew{SKEWS.index(skew)}")

    assert result.report.ok, str(result.report)
    assert result.report.pods == 0 and result.report.instances == 0, "everything given back at the end"

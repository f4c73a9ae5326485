"""Scenario 7: the Kubernetes API unavailable during a drain; the agent's watch broken and resumed.

CI: a 10 s outage answered 503 ServiceUnavailable; with GPU_AUTOSCALER_CHAOS_SOAK=1, the issue's 60 s, and
also with connections refused. The drain's own retries run on real seconds (the emulator speeds up only its
schedules), so the outage is not scaled: 10 s already spans two of the drain's retries (5 s apart, then 10)
and the agent's backoff."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.chaos.conftest import SOAK
from tests.chaos.outage import api_outage_during_drain

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig

OUTAGES = [("unavailable", 60.0), ("refused", 60.0)] if SOAK else [("unavailable", 10.0)]


@pytest.mark.timeout(600)  # the soak's minute of outage, on a loaded machine
@pytest.mark.parametrize(("mode", "seconds"), OUTAGES)
def test_a_drain_survives_the_api_going_away_and_the_agent_lists_again(
    rig: ChaosRig, mode: str, seconds: float,
) -> None:
    result = api_outage_during_drain(rig, seconds=seconds, mode=mode, prefix=f"outage-{mode}")

    assert result.report.ok, str(result.report)
    assert result.drain_retries > 0, "the drain never met the outage"
    assert result.deleted_past_budget == [], "a voluntary drain deleted pods instead of evicting them"
    assert result.min_running >= result.pods - 1, (
        f"{result.pods - result.min_running} guarded pods away at once; the budget allows 1")
    if result.changed_during:
        assert result.relisted, "the agent's watch was not told 410 Gone and did not list again"

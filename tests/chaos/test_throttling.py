"""Scenario 1: EC2 throttles (RequestLimitExceeded, from the strict layer's fault rule) 30 % of its calls while GPU
pods arrive; every pod is bound once it passes, nothing is launched twice, nothing dead-lettered without reason.

CI: 20 pods and 8 s of throttling (the issue's two minutes, scaled down 30× with the emulator's clock, are 4 s; 8 s
span several of every function's retries); with GPU_AUTOSCALER_CHAOS_SOAK=1, the issue's 200 pods and 120 s."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from tests.chaos.conftest import SOAK
from tests.chaos.scenarios import throttling_storm

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig


def test_thirty_percent_throttling_while_pods_arrive_loses_nothing(rig: ChaosRig) -> None:
    with rig.soak_visibility() if SOAK else contextlib.nullcontext():
        result = throttling_storm(rig, pods=200 if SOAK else 20, seconds=120.0 if SOAK else 8.0, seed=0)

    assert result.refused > 0, "the fault rule refused nothing"
    assert result.report.ok, str(result.report)

"""Measured boot times become a pool's lead time once there are enough of them: windows warm earlier (or later)
and the forecast looks that far ahead."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from gpu_autoscaler.config import MeasuredLeadTime
from gpu_autoscaler.domain.boot_times import lead_time, quantile
from gpu_autoscaler.domain.prewarm import window_warm
from gpu_autoscaler.models.boot import BootSample

from .builders import make_config
from .test_service import START, Rig

PEAK = window_warm("peak")


def boots(seconds: list[float], pool: str = "gpu", launched: datetime = START - timedelta(days=1)) -> list[BootSample]:
    return [BootSample(pool=pool, instance_type="g6.xlarge", claim_id=f"c{i}", launched_at=launched,
                       ready_at=launched + timedelta(seconds=s / 2),
                       gpus_allocatable_at=launched + timedelta(seconds=s))
            for i, s in enumerate(seconds)]


def test_quantile_interpolates_between_order_statistics() -> None:
    assert quantile([300, 100, 200], 0.5) == 200
    assert quantile([100, 200, 300, 400, 500, 600, 700, 800, 900, 1000], 0.9) == pytest.approx(910)
    assert quantile([42], 0.9) == 42


def test_the_configured_lead_time_holds_until_enough_boots_are_measured() -> None:
    pool = make_config().pool("gpu")
    settings = MeasuredLeadTime(min_samples=5, quantile=0.9)
    few = lead_time(pool, boots([600] * 4), settings)
    assert (few.value, few.measured, few.samples) == (pool.lead_time, False, 4)
    assert few.median == timedelta(seconds=600)  # reported, not used
    enough = lead_time(pool, boots([500, 600, 600, 700, 1500]), settings)
    assert enough.measured and enough.samples == 5
    assert enough.value == timedelta(seconds=1180)  # p90 of the five: 700 + 0.6 × 800
    assert enough.median == timedelta(seconds=600)
    median = lead_time(pool, boots([500, 600, 600, 700, 1500]), MeasuredLeadTime(quantile=0.5))
    assert median.value == timedelta(seconds=600)
    off = lead_time(pool, boots([500] * 9), MeasuredLeadTime(enabled=False))
    assert not off.measured and off.value == pool.lead_time
    other = lead_time(pool, boots([500] * 9, pool="other"), settings)
    assert other.samples == 0 and not other.measured


def test_a_window_is_warmed_a_measured_lead_time_ahead_once_enough_boots_are_recorded() -> None:
    # Configured: 8 minutes of lead plus the 5-minute tick period. Measured: boots take 20 minutes.
    config = make_config()
    rig = Rig(config, START - timedelta(minutes=25))
    rig.store.boots = boots([1200] * 4)
    summary = rig.tick()
    assert rig.warm(PEAK) == []
    assert summary["leadTimes"]["gpu"] == {"seconds": 480.0, "source": "configured", "samples": 4,
                                           "medianSeconds": 1200.0, "p90Seconds": 1200.0}
    rig.store.boots = boots([1200] * 5)
    summary = rig.tick()
    assert rig.gpus(PEAK) >= 8
    assert summary["leadTimes"]["gpu"]["source"] == "measured" and summary["leadTimes"]["gpu"]["seconds"] == 1200


def test_a_fast_measured_boot_warms_later_than_the_configured_guess() -> None:
    rig = Rig(make_config(), START - timedelta(minutes=13))  # the configured 8 minutes + 6 would warm now
    rig.store.boots = boots([240] * 6)
    rig.tick()
    assert rig.warm(PEAK) == []
    rig.tick(START - timedelta(minutes=9))  # 4 minutes of measured boot + the 5-minute period and its minute
    assert rig.gpus(PEAK) >= 8


def test_old_boots_fall_out_of_the_history() -> None:
    rig = Rig(make_config(), START - timedelta(minutes=25))
    rig.store.boots = boots([1200] * 5, launched=START - timedelta(days=15))  # history is 14 days
    assert rig.tick()["leadTimes"]["gpu"] == {"seconds": 480.0, "source": "configured", "samples": 0}
    assert rig.warm(PEAK) == []


def test_the_forecast_looks_a_measured_lead_time_ahead() -> None:
    config = make_config(enabled=True)
    rig = Rig(config, START)
    rig.store.boots = boots([1800] * 5)
    service = rig.service
    leads = service._lead_times(START)
    assert leads["gpu"].value == timedelta(minutes=30)
    forecasts = service._forecasts(START, leads)
    assert forecasts["gpu"].target == START + timedelta(minutes=30)
    unmeasured = service._forecasts(START, {})
    assert unmeasured["gpu"].target == START + max(config.pool("gpu").lead_time, config.predictive.lead_time)

"""The backtest's replay on hand-made traces whose answers are known."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.prewarm.backtest import config
from benchmarks.prewarm.profile import derive_window
from benchmarks.prewarm.replay import Replay
from benchmarks.prewarm.trace import Trace

HOUR = 3600.0


def trace(*pods: tuple[float, float, float]) -> Trace:
    arrival, departure, gpus = (np.array(column, float) for column in zip(*pods, strict=True))
    return Trace(arrival, departure, gpus)


def test_without_warm_capacity_a_pod_waits_a_boot() -> None:
    one = trace((10 * HOUR, 11 * HOUR, 2))
    outcome = Replay("none", one, config(), start=0, score_from=0, end=12 * HOUR).run()
    assert outcome.ready_share == 0 and outcome.mean_wait == pytest.approx(480)
    assert outcome.gpu_hours == pytest.approx(2 * (1 - 480 / 3600) + 2 * 300 / 3600)  # runs, then 5 min idle
    assert outcome.idle_gpu_hours == pytest.approx(2 * 300 / 3600)


def test_a_window_has_capacity_ready_at_its_start() -> None:
    window = {"name": "w", "schedule": "cron(0 10 * * ? *)", "timezone": "UTC", "duration": "1h",
              "nodePool": "gpu", "warm": {"gpus": 4}}
    one = trace((10 * HOUR, 10.5 * HOUR, 2))
    outcome = Replay("windows", one, config(windows=[window]), start=0, score_from=0, end=12 * HOUR).run()
    assert outcome.ready_share == 1 and outcome.warm_share == 1 and outcome.mean_wait == 0
    # Held from 09:47 (start − 8 min lead − 5 min tick period): the 09:50 tick launches 4 GPUs, up at 09:58
    # and busy 10:00-10:30 for 2 of them; released at 11:00 and consolidated 5 minutes later.
    assert outcome.idle_warm_gpu_hours == pytest.approx(4 * (62 / 60) - 2 * 0.5)
    assert outcome.gpu_hours == pytest.approx(4 * (62 / 60) + 4 * 5 / 60)


def test_a_pod_deleted_before_capacity_came_is_unplaced() -> None:
    short = trace((10 * HOUR, 10 * HOUR + 60, 1))
    outcome = Replay("none", short, config(), start=0, score_from=0, end=12 * HOUR).run()
    assert outcome.unplaced == 1 and outcome.mean_wait == pytest.approx(60)


def test_the_derived_window_covers_the_busy_hours() -> None:
    days = 7
    busy = [(d * 24 * HOUR + h * HOUR + m * 60, d * 24 * HOUR + h * HOUR + m * 60 + 1800, 1.0)
            for d in range(days) for h in range(18, 22) for m in range(0, 60, 10)]
    window = derive_window(trace(*busy), 0, days * 24 * HOUR)
    assert 17 <= window.start_hour <= 18 and window.start_hour + window.hours >= 22
    assert window.gpus == 3  # three 30-minute pods overlap at any moment once the window has run half an hour

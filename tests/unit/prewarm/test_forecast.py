"""The demand forecaster: no forecast under 24 h of history, a known daily pattern recovered, quantiles."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gpu_autoscaler.domain.forecast import (
    BUCKET,
    DemandSeries,
    Forecaster,
    ForecastStatus,
    bucket_start,
    inverted_cdf,
)

from .builders import MONDAY, office_hours_demand

if TYPE_CHECKING:
    from gpu_autoscaler.domain.forecast import Forecast

LEAD = timedelta(minutes=8)


def at(days: float, hours: float = 0, minutes: float = 0) -> datetime:
    return MONDAY + timedelta(days=days, hours=hours, minutes=minutes)


class TestHistory:
    def test_no_forecast_under_24_hours_of_history(self) -> None:
        series = DemandSeries.from_array(MONDAY, office_hours_demand(2))
        now = at(0, 23, 55)
        forecast = Forecaster(0.9).forecast(series, now, now + LEAD, "gpu")
        assert forecast.status is ForecastStatus.INSUFFICIENT_HISTORY and forecast.gpus is None
        assert "23.9 h of demand history" in forecast.reason and "at least 24.0 h" in forecast.reason
        assert forecast.to_json()["status"] == "insufficient-history"

    def test_a_forecast_from_24_hours_on(self) -> None:
        series = DemandSeries.from_array(MONDAY, office_hours_demand(2))
        forecast = Forecaster(0.9).forecast(series, at(1), at(1) + LEAD, "gpu")
        assert forecast.ok and forecast.gpus is not None

    def test_history_is_measured_from_the_oldest_record_not_the_window_asked_for(self) -> None:
        since = at(0)
        records = [(at(0, 20) + i * BUCKET, 3.0) for i in range(60)]
        series = DemandSeries.from_records(records, since, at(1, 10))
        assert series.first_record == at(0, 20)
        assert not Forecaster(0.9).forecast(series, at(1, 10), at(1, 10) + LEAD).ok

    def test_the_time_before_the_first_record_is_not_zero_demand(self) -> None:
        # 26 h of a steady 3 GPUs, read back over the 14 days prediction asks for.
        now = at(14, 20)
        records = [(now - i * BUCKET, 3.0) for i in range(1, 26 * 12 + 1)]
        series = DemandSeries.from_records(records, now - timedelta(days=14), now)
        forecast = Forecaster(0.9).forecast(series, now, now + LEAD)
        assert forecast.ok and forecast.profile == 3 and forecast.gpus == pytest.approx(3)

    def test_missing_buckets_are_zero_and_records_outside_are_dropped(self) -> None:
        records = [(at(0, 0, 7), 4.0), (at(0, 0, 20), 2.0), (at(0, -1), 9.0), (at(0, 1), 9.0)]
        series = DemandSeries.from_records(records, at(0), at(0, 1))
        assert series.values.tolist() == [0, 4, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
        assert series.first_record == at(0, 0, 5)
        assert bucket_start(at(0, 0, 7, )) == at(0, 0, 5)


def predicted(forecast: Forecast) -> float:
    """The GPUs of a forecast the test knows is made (None is for one that is not made: too little history, say)."""
    assert forecast.gpus is not None, forecast.status
    return forecast.gpus


class TestPattern:
    def test_recovers_a_known_office_hours_pattern(self) -> None:
        # Two weeks of 2 GPUs, plus 10 on weekdays 09:00-17:00 UTC, plus Poisson(1) noise.
        series = DemandSeries.from_array(MONDAY, office_hours_demand(21, noise=1.0))
        forecaster = Forecaster(0.9)
        busy: list[float] = []
        quiet: list[float] = []
        weekend: list[float] = []
        for day in range(14, 19):  # the third week's weekdays, from the first two weeks
            busy.append(predicted(forecaster.forecast(series, at(day, 8, 55), at(day, 8, 55) + LEAD)))
            busy.append(predicted(forecaster.forecast(series, at(day, 13), at(day, 13) + LEAD)))
            quiet.append(predicted(forecaster.forecast(series, at(day, 3), at(day, 3) + LEAD)))
        for day in (19, 20):
            weekend.append(predicted(forecaster.forecast(series, at(day, 13), at(day, 13) + LEAD)))
        truth_q90_busy = 12 + 2  # 12 GPUs plus the 90th percentile of Poisson(1) noise (2)
        truth_q90_quiet = 2 + 2
        assert all(abs(g - truth_q90_busy) <= 1.5 for g in busy), busy
        assert all(abs(g - truth_q90_quiet) <= 1.5 for g in quiet), quiet
        # The day-of-week profile knows weekends are quiet; the time-of-day profile keeps a share of the blend.
        assert all(g < (truth_q90_busy + truth_q90_quiet) / 2 for g in weekend), weekend

    def test_the_ramp_is_seen_a_lead_time_ahead(self) -> None:
        series = DemandSeries.from_array(MONDAY, office_hours_demand(14))
        forecaster = Forecaster(0.9, tolerance=timedelta(0))
        assert forecaster.forecast(series, at(14, 8, 50), at(14, 8, 58)).gpus == pytest.approx(2)
        assert forecaster.forecast(series, at(14, 8, 52), at(14, 9)).gpus == pytest.approx(12)

    def test_a_quantile_not_the_mean(self) -> None:
        # Demand alternates day by day between 0 and 10 GPUs: the mean is 5, the 90th percentile 10.
        days = 8
        values = np.repeat([0.0 if d % 2 else 10.0 for d in range(days)], 288)
        series = DemandSeries.from_array(MONDAY, values)
        now = at(days, 12)
        high = Forecaster(0.9, level_weight=0, weekday_share=0).forecast(series, now, now + LEAD).gpus
        low = Forecaster(0.1, level_weight=0, weekday_share=0).forecast(series, now, now + LEAD).gpus
        assert high == pytest.approx(10) and low == pytest.approx(0)

    def test_a_busier_day_than_usual_raises_the_forecast(self) -> None:
        values = office_hours_demand(15)
        today = 14 * 288
        values[today + 10 * 12:today + 11 * 12] += 6  # Monday 10:00-11:00 runs 6 GPUs above its usual
        series = DemandSeries.from_array(MONDAY, values)
        now = at(14, 11)
        usual = Forecaster(0.9).forecast(DemandSeries.from_array(MONDAY, office_hours_demand(15)), now, now + LEAD)
        busier = Forecaster(0.9, level_weight=0.5).forecast(series, now, now + LEAD)
        assert usual.gpus == pytest.approx(12)
        assert busier.level == pytest.approx(18) and busier.gpus == pytest.approx(15)

    def test_only_buckets_complete_at_now_are_read(self) -> None:
        values = office_hours_demand(3)
        values[2 * 288 + 12 * 12:] = 500  # the future, already in the array: must not leak into the forecast
        series = DemandSeries.from_array(MONDAY, values)
        forecast = Forecaster(0.9).forecast(series, at(2, 12), at(2, 12) + LEAD)
        assert forecast.gpus == pytest.approx(12)

    def test_the_profiles_follow_local_time_across_a_clock_change(self) -> None:
        """Office hours are local: on the Monday after New York springs forward, 09:00 EDT is 13:00 UTC, while every
        past weekday was busy from 14:00 UTC. The profiles read the same local time on past days."""
        new_york = ZoneInfo("America/New_York")
        now = datetime(2026, 3, 9, 8, 52, tzinfo=new_york).astimezone(UTC)
        since = now - timedelta(days=14)
        records = []
        for i in range(14 * 288):
            moment = since + i * BUCKET
            wall = moment.astimezone(new_york)
            records.append((moment, 10.0 if wall.weekday() < 5 and 9 <= wall.hour < 17 else 0.0))
        series = DemandSeries.from_records(records, since, now)
        local = Forecaster(0.9, zone=new_york).forecast(series, now, now + LEAD)
        assert local.gpus == pytest.approx(10)
        assert Forecaster(0.9).forecast(series, now, now + LEAD).gpus == 0  # in UTC: 08:00 of last week
        week_later = now + timedelta(days=7)  # every past day now on the same side of the change
        assert Forecaster(0.9, zone=new_york).forecast(series, week_later, week_later + LEAD).status == "ok"

    def test_a_window_view_replays_what_the_store_would_return(self) -> None:
        series = DemandSeries.from_array(MONDAY, office_hours_demand(20))
        now = at(18, 9)
        view = series.window(now - timedelta(days=14), now)
        assert view.values.size == 14 * 288 and view.start == now - timedelta(days=14)
        forecaster = Forecaster(0.9)
        assert forecaster.forecast(view, now, now + LEAD).gpus == forecaster.forecast(series, now, now + LEAD).gpus


class TestInvertedCdf:
    """The profiles' quantile is numpy's `inverted_cdf`, found by a partial sort: the same value, always."""

    @given(
        values=hnp.arrays(np.float64, st.integers(1, 400),
                          elements=st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
                          | st.sampled_from([0.0, 0.25, 1.0, 2.0, 8.0])),
        q=st.floats(0, 1, exclude_min=True, exclude_max=True) | st.sampled_from([0.1, 0.5, 0.9, 0.95, 0.99, 1 / 3]),
    )
    def test_equals_numpy_quantile(self, values: np.ndarray, q: float) -> None:
        before = values.copy()
        assert inverted_cdf(values, q) == np.quantile(values, q, method="inverted_cdf")
        assert np.array_equal(values, before)  # the caller's samples are not reordered

    @pytest.mark.parametrize("n", range(1, 41))
    def test_equals_numpy_quantile_where_n_times_q_is_a_whole_number(self, n: int) -> None:
        values = np.arange(n, 0, -1, dtype=np.float64)
        for q in (0.1, 0.2, 0.25, 0.5, 0.75, 0.8, 0.9):
            assert inverted_cdf(values, q) == np.quantile(values, q, method="inverted_cdf")

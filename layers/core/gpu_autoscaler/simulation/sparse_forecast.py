"""The forecaster on the simulator's sparse series: `Forecaster.forecast`'s very numbers, read from the buckets
that hold demand instead of from every profile sample.

A pre-warm tick forecasts each pod shape class with history (`domain.pod_shapes`) — hundreds of thousands of
forecasts over a replay of months — and a class's series is mostly zeros: it holds a class's *pending* GPUs, a
bucket or two per pod that waited. The domain forecaster gathers each profile's few dozen samples and selects
its quantile with numpy, whose per-call overhead dominates on arrays that small. Here the store keeps each
series' non-zero buckets by time of day (`SimulationStateStore.nonzero`); a profile's samples are then the
count of buckets at the target's time of day in range (arithmetic) and the few non-zero ones among them
(bisections), and since demand is never negative the q-quantile is 0 unless the non-zero samples reach it, else
the right one of them sorted — the same sample `inverted_cdf` selects, so the forecast is equal to the bit.
Anything but a `SparseSeries` with enough history, or a forecast whose history holds a clock change of the
forecaster's `zone`, goes to the domain forecaster unchanged; the simulator's tests compare the two on random
series.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.forecast import BUCKET, DemandSeries, Forecast, Forecaster, ForecastStatus

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

__all__ = ["SparseForecaster", "SparseSeries"]

_DAY = int(timedelta(days=1) / BUCKET)
_BUCKET_SECONDS = int(BUCKET.total_seconds())


@dataclass(frozen=True)
class SparseSeries(DemandSeries):
    """A window of a store series (`values` a view of it), with where to find its non-zero buckets."""

    offset: int = 0
    """The store series' bucket index of this window's bucket 0."""
    nonzero: Mapping[int, list[int]] = field(default_factory=dict)
    """The store series' buckets holding demand, by index modulo a day's buckets, in order."""


@dataclass(frozen=True)
class SparseForecaster(Forecaster):
    @classmethod
    def like(cls, forecaster: Forecaster) -> SparseForecaster:
        """The same model with the same settings."""
        return cls(**{f.name: getattr(forecaster, f.name) for f in fields(forecaster)})

    def forecast(self, series: DemandSeries, now: datetime, target: datetime, pool: str = "") -> Forecast:
        if not isinstance(series, SparseSeries) or series.first_record is None:
            return super().forecast(series, now, target, pool)
        history = now - series.first_record
        start = series.start.timestamp()
        end = min(series.values.size, _index(now, start))
        if history < self.min_history or end <= 0:
            return super().forecast(series, now, target, pool)
        half, recent_buckets = _spans(self.tolerance, self.recent)
        target_index = _index(target, start)
        usual_index = end - 1 - (recent_buckets - 1) // 2
        if self.zone is not None and (
                self.local_shifts(series.start + target_index * BUCKET, target_index // _DAY + 1) is not None
                or self.local_shifts(series.start + usual_index * BUCKET, usual_index // _DAY + 1) is not None):
            return super().forecast(series, now, target, pool)  # a clock change within the history: by local time
        first = max(0, _index(series.first_record, start))
        profile = self._sparse_profile(series, end, target_index, self.quantile, first, half)
        if profile is None:
            return super().forecast(series, now, target, pool)
        value, samples = profile
        recent = series.values[max(0, end - recent_buckets):end]
        last = recent.tolist()
        # The domain's `recent.sum()`, whose arithmetic it must keep, only where there is something to add.
        level = float(recent.sum()) / recent.size if any(last) else 0.0
        if value == 0.0 and level == 0.0 and self.level_weight >= 0:
            gpus = 0.0  # the offset, 0 less a median of demand, is never above 0: the domain's max(0, …) is 0
        else:
            usual = self._sparse_profile(series, end, usual_index, 0.5, first, half)
            offset = level - usual[0] if usual is not None else 0.0
            gpus = max(0.0, value + self.level_weight * offset)
        return Forecast(pool, ForecastStatus.OK, target, history, gpus, value, level, samples, current=last[-1])

    def _sparse_profile(self, series: SparseSeries, end: int, target_index: int, q: float,
                        first: int, half: int) -> tuple[float, int] | None:
        """`Forecaster._profile` over `series.values[:end]`: the samples are the buckets i in [first, end) with
        i = target − d·day + o, 1 ≤ d ≤ target // day + 1, |o| ≤ half (the tolerance in buckets); weekday ones
        have d % 7 == 0."""
        days = target_index // _DAY + 1
        count = weekday_count = 0
        found: list[float] = []
        weekday: list[float] = []
        values = series.values
        offset = series.offset
        nonzero = series.nonzero
        for o in range(-half, half + 1):
            base = target_index + o
            d_high = min(days, (base - first) // _DAY)
            d_low = max(1, (base - end) // _DAY + 1)
            if d_high < d_low:
                continue
            count += d_high - d_low + 1
            weekday_count += d_high // 7 - (d_low - 1) // 7
            buckets = nonzero.get((offset + base) % _DAY)
            if not buckets:
                continue
            lo = bisect_left(buckets, offset + base - d_high * _DAY)
            hi = bisect_left(buckets, offset + base - d_low * _DAY + 1)
            for absolute in buckets[lo:hi]:
                index = absolute - offset
                sample = float(values[index])
                found.append(sample)
                if ((base - index) // _DAY) % 7 == 0:
                    weekday.append(sample)
        if count == 0:
            return None
        by_time = _quantile(found, count, q)
        if weekday_count == 0:
            return by_time, count
        by_weekday = _quantile(weekday, weekday_count, q)
        return self.weekday_share * by_weekday + (1 - self.weekday_share) * by_time, count


def _index(moment: datetime, start: float) -> int:
    """`DemandSeries.index(moment)` for a series starting at `start` (its POSIX seconds), found once a forecast."""
    seconds = int(moment.timestamp()) // _BUCKET_SECONDS * _BUCKET_SECONDS
    return int((seconds - start) / _BUCKET_SECONDS)


@functools.lru_cache(maxsize=16)
def _spans(tolerance: timedelta, recent: timedelta) -> tuple[int, int]:
    """The profile's half-width and the recent level's length, in buckets, as the domain forecaster finds them."""
    return int(tolerance / BUCKET), max(1, math.ceil(recent / BUCKET))


def _quantile(positive: list[float], count: int, q: float) -> float:
    """`inverted_cdf` of `count` samples of which `positive` are the non-zero ones and the rest are zeros."""
    k = max(0, math.ceil(count * q) - 1)
    zeros = count - len(positive)
    if k < zeros:
        return 0.0
    positive.sort()
    return positive[k - zeros]

"""Demand forecasting for predictive pre-warm: GPUs a pool will be asked for one lead time from now.

AWS predictive scaling forecasts hourly, 48 h ahead, for Auto Scaling groups. Here the horizon is one
lead time (node boot plus image pull, minutes), the step is the 5-minute demand bucket and the unit is
a node pool, so the model is small and fast enough to run on every 5-minute tick:

1. Seasonal profiles, read at the configured quantile (not the mean: warm capacity is there for the
   busy days). The time-of-day profile takes the buckets at the target's time of day (± `tolerance`)
   on every past day of the history; the day-of-week profile takes only the past days of the target's
   weekday. The two quantiles are blended, `weekday_share` to the day-of-week one once the history
   holds at least one such day (Monday 09:00 looks like past Mondays, not like Saturdays), else the
   time-of-day profile alone. Time of day and weekday are the `zone`'s (None: UTC): office hours follow
   local time, so for the week after a daylight-saving change a past day's 09:00 is an hour away from
   today's in UTC.
2. Recent level. Today may run hotter or colder than usual: the mean of the last `recent` of demand,
   minus the profiles' median for that time, is how far off today is. `level_weight` of that offset is
   added to the profile at the target.

`forecast = max(0, profile_q(target) + level_weight × (recent − profile_median(now)))`

Demand history is what the packer and the reconcile step record: requested GPUs (pending plus
running, in physical GPUs) per pool per 5-minute bucket. A bucket with no record counts as zero
demand — recorders may skip idle buckets — so a recorder outage reads as a quiet spell and errs
towards less warm capacity, never more. With less than `min_history` (24 h) between the oldest record
and now there is no forecast at all: the status says so, and the caller logs and reports it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "BUCKET",
    "MIN_HISTORY",
    "DemandSeries",
    "Forecast",
    "ForecastStatus",
    "Forecaster",
    "bucket_start",
    "inverted_cdf",
]

BUCKET = timedelta(minutes=5)
MIN_HISTORY = timedelta(hours=24)
_BUCKET_SECONDS = int(BUCKET.total_seconds())
_DAY = int(timedelta(days=1) / BUCKET)


def bucket_start(moment: datetime) -> datetime:
    """The UTC start of the 5-minute bucket holding `moment`: the sort key demand records are written under."""
    utc = moment.astimezone(UTC)
    seconds = int(utc.timestamp()) // _BUCKET_SECONDS * _BUCKET_SECONDS
    return datetime.fromtimestamp(seconds, UTC)


class ForecastStatus(StrEnum):
    OK = "ok"
    INSUFFICIENT_HISTORY = "insufficient-history"
    DISABLED = "disabled"


@dataclass(frozen=True)
class Forecast:
    """The forecast for one pool, or why there is none."""

    pool: str
    status: ForecastStatus
    target: datetime
    """The instant forecast for: now + lead time."""
    history: timedelta
    """How far back the demand history reaches."""
    gpus: float | None = None
    """Forecast demand in physical GPUs at `target`; None unless status is OK."""
    profile: float | None = None
    """The seasonal profile's quantile at the target, before the level correction."""
    level: float | None = None
    """Mean demand over the recent buckets."""
    samples: int = 0
    current: float | None = None
    """Demand in the last complete bucket: what the pool is asked for now."""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is ForecastStatus.OK

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "status": self.status.value,
            "target": self.target.isoformat(),
            "historyHours": round(self.history.total_seconds() / 3600, 2),
        }
        if self.gpus is not None:
            out.update(gpus=round(self.gpus, 3), profile=round(self.profile or 0.0, 3),
                       level=round(self.level or 0.0, 3), current=round(self.current or 0.0, 3),
                       samples=self.samples)
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class DemandSeries:
    """Demand per 5-minute bucket from `start`, dense (a missing bucket is 0), and when records begin."""

    start: datetime
    """Start of bucket 0 (UTC, bucket-aligned)."""
    values: np.ndarray
    first_record: datetime | None
    """The oldest bucket that had a record; None when there is none."""

    @classmethod
    def from_records(cls, records: Iterable[tuple[datetime, float]], since: datetime, until: datetime) -> DemandSeries:
        """Buckets from `since` up to (not including) the bucket holding `until`; records outside are dropped."""
        start = bucket_start(since)
        count = max(0, int((bucket_start(until) - start) / BUCKET))
        values = np.zeros(count, np.float64)
        first: datetime | None = None
        for moment, gpus in records:
            index = int((bucket_start(moment) - start) / BUCKET)
            if 0 <= index < count:
                values[index] = gpus
                bucket = start + index * BUCKET
                first = bucket if first is None or bucket < first else first
        return cls(start, values, first)

    @classmethod
    def from_array(cls, start: datetime, values: np.ndarray, first_record: datetime | None = None) -> DemandSeries:
        """A series already dense (the simulator's and the backtest's): records begin at `start` unless told."""
        aligned = bucket_start(start)
        return cls(aligned, np.asarray(values, np.float64), aligned if first_record is None else first_record)

    def index(self, moment: datetime) -> int:
        """The bucket holding `moment`: `(bucket_start(moment) - start) / BUCKET` in whole seconds (start is
        bucket-aligned), without building the datetimes — forecasting asks this several times a tick."""
        seconds = int(moment.timestamp()) // _BUCKET_SECONDS * _BUCKET_SECONDS
        return int((seconds - self.start.timestamp()) / _BUCKET_SECONDS)

    def window(self, since: datetime, until: datetime) -> DemandSeries:
        """The buckets in [since, until) as a view (no copy): what a `demand_history(since)` read at `until`
        would have returned, for replaying a long series tick by tick."""
        return self.between(self.index(since), self.index(until))

    def between(self, lo: int, hi: int) -> DemandSeries:
        """`window` in bucket indices (as `index` gives them; clipped to the series): the simulator reads many
        series with one start over the same instants, so it finds the indices once."""
        lo = max(0, lo)
        hi = max(lo, min(self.values.size, hi))
        first = self.first_record
        start = self.start + lo * BUCKET
        if first is not None and first < start:
            first = start
        return DemandSeries(start, self.values[lo:hi], first)


@dataclass(frozen=True)
class Forecaster:
    """The forecasting model with its settings; `forecast` is pure (series and instants in, Forecast out)."""

    quantile: float
    tolerance: timedelta = timedelta(minutes=10)
    """Samples within this of the target's time of day count for the profiles."""
    weekday_share: float = 0.75
    """Weight of the day-of-week profile in the blend, once the history holds a day of the target's weekday."""
    level_weight: float = 0.5
    recent: timedelta = timedelta(minutes=15)
    min_history: timedelta = MIN_HISTORY
    zone: tzinfo | None = None
    """The time zone demand keeps its hours in (the cluster's users'): a past day's sample is taken at the target's
    local time of day, which a daylight-saving change moves an hour in UTC. None: UTC."""

    def __post_init__(self) -> None:
        if not 0 < self.quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile}")

    def forecast(self, series: DemandSeries, now: datetime, target: datetime, pool: str = "") -> Forecast:
        """Demand at `target` from the buckets of `series` that ended by `now`."""
        history = now - series.first_record if series.first_record is not None else timedelta(0)
        if history < self.min_history:
            return Forecast(
                pool, ForecastStatus.INSUFFICIENT_HISTORY, target, history,
                reason=f"{_hours(history)} of demand history; forecasting needs at least {_hours(self.min_history)}",
            )
        end = min(series.values.size, series.index(now))  # complete buckets only
        # Before the first record there is no history at all (not zero demand): it is never read.
        first = max(0, series.index(series.first_record)) if series.first_record is not None else 0
        values = series.values[:end]
        target_index = series.index(target)
        profile = self._profile(values, target_index, self.quantile, first, series.start)
        if profile is None:
            return Forecast(pool, ForecastStatus.INSUFFICIENT_HISTORY, target, history,
                            reason="no past bucket at the target's time of day")
        value, samples = profile
        recent_buckets = max(1, math.ceil(self.recent / BUCKET))
        recent = values[max(0, end - recent_buckets):end]
        level = float(recent.sum()) / recent.size if recent.size else 0.0  # ndarray.mean's own arithmetic
        usual = self._profile(values, end - 1 - (recent_buckets - 1) // 2, 0.5, first, series.start)
        offset = level - usual[0] if usual is not None else 0.0
        gpus = max(0.0, value + self.level_weight * offset)
        current = float(values[end - 1]) if end > 0 else 0.0
        return Forecast(pool, ForecastStatus.OK, target, history, gpus, value, level, samples, current=current)

    def _profile(self, values: np.ndarray, target_index: int, q: float, first: int,
                 start: datetime) -> tuple[float, int] | None:
        """The blended profile's q-quantile at a bucket (`start`: bucket 0's), and how many samples it read; None
        without any."""
        samples, same_weekday = self._samples(values, target_index, first, start)
        if samples.size == 0:
            return None
        by_time = inverted_cdf(samples, q)
        weekday = samples[same_weekday]
        if weekday.size == 0:
            return by_time, int(samples.size)
        by_weekday = inverted_cdf(weekday, q)
        return self.weekday_share * by_weekday + (1 - self.weekday_share) * by_time, int(samples.size)

    def _samples(self, values: np.ndarray, target_index: int, first: int,
                 start: datetime) -> tuple[np.ndarray, np.ndarray]:
        """Past buckets from `first` on at the target's time of day (± tolerance) on every earlier day, and
        which of them fall on the target's weekday."""
        days = target_index // _DAY + 1
        half = int(self.tolerance / BUCKET)
        offsets, same = _offsets(days, half)
        shifts = self.local_shifts(start + target_index * BUCKET, days)
        if shifts is not None:
            offsets = offsets + np.repeat(shifts, 2 * half + 1)
        index = target_index + offsets
        valid = (index >= first) & (index < values.size)
        return values[index[valid]], same[valid]


    def local_shifts(self, moment: datetime, days: int) -> np.ndarray | None:
        """Per past day (1 … `days` back), the buckets from `moment` − d × 24 h to the same local time d days
        back, in the `zone`: the UTC offset the day had less the one `moment` has; None when every day's is
        the same (no zone, or no change within the days)."""
        if self.zone is None:
            return None
        return _local_shifts(int(bucket_start(moment).timestamp()), days, self.zone)


@functools.lru_cache(maxsize=256)
def _local_shifts(moment: int, days: int, zone: tzinfo) -> np.ndarray | None:
    """`Forecaster.local_shifts` of a bucket start (epoch seconds): a tick forecasts many series for the same
    instants, so each is worked out once (read-only). A local time that does not exist that day (the hour
    skipped when clocks go forward) takes the offset before the change (`fold=0`), as the windows do."""
    local = datetime.fromtimestamp(moment, zone)
    offset = local.utcoffset()
    wall = local.replace(tzinfo=None)
    shifts = np.zeros(days, np.int64)
    for d in range(1, days + 1):
        past = (wall - timedelta(days=d)).replace(tzinfo=zone).utcoffset()
        if past != offset and past is not None and offset is not None:
            shifts[d - 1] = (offset - past) // BUCKET
    if not shifts.any():
        return None
    shifts.flags.writeable = False
    return shifts


@functools.lru_cache(maxsize=64)
def _offsets(days: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    """Bucket offsets from a target to the same time of day (± `half` buckets) on each of the `days` days before
    it, nearest day first, and which offsets fall on the target's weekday: the same for every target with as
    many past days, so built once (read-only)."""
    back = np.arange(1, days + 1)
    offsets = ((-back * _DAY)[:, None] + np.arange(-half, half + 1)[None, :]).ravel()
    same = np.repeat(back % 7 == 0, 2 * half + 1)
    offsets.flags.writeable = False
    same.flags.writeable = False
    return offsets, same


def inverted_cdf(values: np.ndarray, q: float) -> float:
    """`np.quantile(values, q, method="inverted_cdf")` of a non-empty 1-D array without NaNs: its smallest
    sample whose empirical CDF reaches q, the ⌈q·n⌉-th smallest (n·q rounded as numpy rounds it). The same
    value, found by one partial sort without `np.quantile`'s general machinery, which on the profiles' few dozen
    samples costs ten times more than the selection itself — and the simulator forecasts every 5 minutes."""
    k = max(0, math.ceil(values.size * q) - 1)
    return float(np.partition(values, k)[k])


def _hours(span: timedelta) -> str:
    hours = span.total_seconds() / 3600
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} d"

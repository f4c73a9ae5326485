"""The simulator's state store: the in-memory `StateStore`, with two things kept the way a long replay needs.

- Claims not yet Terminated are indexed apart: a replay of weeks makes thousands of claims, and every
  packer, prewarm and consolidation pass lists the live ones (`MemoryStateStore` scans every claim for that).
- Boot samples are kept per pool in launch order with their expiry in a heap, so the prewarm tick's read of a
  pool's samples since an instant is a bisection, and `boot_window` names that read's content (what the
  simulated prewarm caches lead times on) — the in-memory store sorts every sample on every read.
- Demand history is a dense series per pool (`domain.forecast.DemandSeries`, one slot per 5-minute bucket,
  peak kept as the table keeps it) written by the same recorders — the packer and the reconcile step — so
  the forecast reads weeks of history as an array view instead of decoding a record per bucket on every tick.

Every other write goes through the in-memory store's conditional semantics unchanged.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.domain.forecast import BUCKET, DemandSeries, bucket_start
from gpu_autoscaler.models.claims import ClaimState, NodeClaim

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.models.boot import BootSample

__all__ = ["SimulationStateStore"]

_DAY = int(timedelta(days=1) / BUCKET)

_BootKey = tuple["datetime", str]


@dataclass
class _Boots:
    """One pool's boot samples: keys (launch instant, claim id) in order, expiry instants in a heap."""

    keys: list[_BootKey] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    """Each key's sample's launch → GPUs allocatable in seconds, in the keys' order."""
    samples: dict[_BootKey, BootSample] = field(default_factory=dict)
    expiry: list[tuple[datetime, _BootKey]] = field(default_factory=list)
    version: int = 0
    """Bumped on every sample added or expired."""


class SimulationStateStore(MemoryStateStore):
    def __init__(self, cluster: str, clock: Clock, *, history_from: datetime, buckets: int) -> None:
        """`history_from`: the first demand bucket the series hold; `buckets`: how many (more are added as
        needed)."""
        super().__init__(cluster, clock)
        self._open: dict[str, NodeClaim] = {}
        self._series_start = bucket_start(history_from)
        self._buckets = max(1, buckets)
        self._series: dict[str, DemandSeries] = {}
        self._nonzero: dict[str, dict[int, list[int]]] = {}
        self._demand_buckets: dict[str, list[int]] = {}
        self.recorded_series = 0
        """How many series have a record: bumped when one gets its first (`recorded` turns true, never back)."""
        self._boot_index: dict[str, _Boots] = {}

    # Claims

    def create_claim(self, claim: NodeClaim) -> None:
        super().create_claim(claim)
        self._index(claim)

    def transition(self, claim: NodeClaim, to: ClaimState, reason: str = "", **changes: object) -> NodeClaim:
        moved = super().transition(claim, to, reason, **changes)
        self._index(moved)
        return moved

    def update_claim(self, claim: NodeClaim, **changes: object) -> NodeClaim:
        updated = super().update_claim(claim, **changes)
        self._index(updated)
        return updated

    def list_claims(self, states: Iterable[ClaimState] | None = None) -> list[NodeClaim]:
        if states is not None:
            wanted = set(states)
            if ClaimState.TERMINATED not in wanted:
                return [c for c in self._open.values() if c.state in wanted]
        return super().list_claims(states)

    def _index(self, claim: NodeClaim) -> None:
        if claim.state is ClaimState.TERMINATED:
            self._open.pop(claim.id, None)
        else:
            self._open[claim.id] = claim

    # Boot times

    def record_boot_time(self, sample: BootSample, ttl: timedelta) -> None:
        boots = self._boot_index.setdefault(sample.pool, _Boots())
        key = (sample.launched_at, sample.claim_id)
        if key in boots.samples:
            return  # the first recorded stays, as the table keeps it
        boots.samples[key] = sample
        at = bisect_right(boots.keys, key)
        boots.keys.insert(at, key)
        boots.seconds.insert(at, sample.to_gpus.total_seconds())
        heapq.heappush(boots.expiry, (self.clock.now() + ttl, key))
        boots.version += 1

    def boot_times(self, pool: str, since: datetime) -> list[BootSample]:
        """What the in-memory store returns: the unexpired samples launched at or after `since`, oldest first."""
        boots, start = self._boots_since(pool, since)
        return [boots.samples[k] for k in boots.keys[start:]] if boots is not None else []

    def boot_seconds(self, pool: str, since: datetime) -> list[float]:
        """What `lead_time` makes of `boot_times(pool, since)`: each sample's launch → GPUs allocatable in seconds,
        oldest first."""
        boots, start = self._boots_since(pool, since)
        return boots.seconds[start:] if boots is not None else []

    def boot_window(self, pool: str, since: datetime) -> tuple[int, int]:
        """A key equal for two reads of `boot_times(pool, since)` only if they return the same samples."""
        boots, start = self._boots_since(pool, since)
        return (boots.version, start) if boots is not None else (0, 0)

    def _boots_since(self, pool: str, since: datetime) -> tuple[_Boots | None, int]:
        boots = self._boot_index.get(pool)
        if boots is None:
            return None, 0
        now = self.clock.now()
        while boots.expiry and boots.expiry[0][0] <= now:
            _, key = heapq.heappop(boots.expiry)
            del boots.samples[key]
            at = bisect_left(boots.keys, key)
            del boots.keys[at]
            del boots.seconds[at]
            boots.version += 1
        return boots, bisect_left(boots.keys, (since, ""))

    # Demand history

    def record_demand(self, pool: str, bucket: datetime, gpus: float, ttl: timedelta) -> None:
        series = self.series(pool)
        index = series.index(bucket)
        if index < 0:
            return
        if index >= series.values.size:
            grown = np.zeros(max(index + 1, 2 * series.values.size))
            grown[: series.values.size] = series.values
            series = DemandSeries(series.start, grown, series.first_record)
        if series.first_record is None or bucket_start(bucket) < series.first_record:
            if series.first_record is None:
                self.recorded_series += 1
            series = DemandSeries(series.start, series.values, bucket_start(bucket))
        before = series.values[index]
        series.values[index] = max(before, gpus)
        if before == 0 and series.values[index] != 0:
            insort(self._nonzero.setdefault(pool, {}).setdefault(index % _DAY, []), index)
            insort(self._demand_buckets.setdefault(pool, []), index)
        self._series[pool] = series

    def demand_history(self, pool: str, since: datetime) -> list[tuple[datetime, float]]:
        series = self.series(pool)
        first = series.index(since)
        return [(series.start + int(i) * BUCKET, float(series.values[i]))
                for i in np.flatnonzero(series.values) if i >= first]

    def recorded(self, pool: str) -> bool:
        """Whether any demand was ever recorded for the series (else it is all zeros, with no first record)."""
        found = self._series.get(pool)
        return found is not None and found.first_record is not None

    def holds_demand(self, pool: str, lo: int, hi: int) -> bool:
        """Whether any of the series' buckets `lo` to `hi` (excluded) holds demand: `series(pool).values[lo:hi].any()`
        for `lo` ≥ 0, by a bisection of its buckets with demand rather than a scan of the weeks between."""
        buckets = self._demand_buckets.get(pool)
        if not buckets:
            return False
        at = bisect_left(buckets, lo)
        return at < len(buckets) and buckets[at] < hi

    def nonzero(self, pool: str) -> dict[int, list[int]]:
        """The series' buckets holding demand (> 0; demand is never negative), by bucket index modulo a day's
        buckets, each list in order: `SparseForecaster` reads a sparse series' profile samples from them."""
        return self._nonzero.get(pool, {})

    def series(self, pool: str) -> DemandSeries:
        """The pool's dense history: bucket i is `start + i × 5 min`; records begin at `first_record`."""
        found = self._series.get(pool)
        if found is None:
            found = DemandSeries(self._series_start, np.zeros(self._buckets), None)
            self._series[pool] = found
        return found

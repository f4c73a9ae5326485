"""The seams between the Lambdas' services and the simulation: queues that are events, and two small
specialisations of the packer and prewarm services.

- `EventQueue`: `LaunchQueue` and `DrainQueue` both — a message becomes an event for the function that reads
  the queue, after the queue's delay (and the message's own, at most SQS's 15 minutes).
- `PolicyPacker`: `PackerService` with the policy's `Solver` (its packing method), built once for the run.
- `SimulatedPrewarm`: `PrewarmService` reading demand history from the store's dense series instead of its
  records — the same `Forecaster` on the same 5-minute buckets; decoding weeks of records on every tick would
  cost more than everything else in the run; and computing the pools' lead times again only when the boot
  samples they read changed (a tick every 5 minutes over months, a boot now and then).
- `SimulatedConsolidate`: `ConsolidateService` whose picture of the cluster (each node with its claim, the
  pods that would move, since when it has been empty, the pods on their way) is the simulation's own, kept
  between ticks, rather than rebuilt from every node and pod each time; deciding and acting are the service's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.boot_times import lead_time_of
from gpu_autoscaler.domain.forecast import BUCKET, DemandSeries
from gpu_autoscaler.domain.pod_shapes import SEPARATOR, classes, series_key
from gpu_autoscaler.services.consolidate import ConsolidateService
from gpu_autoscaler.services.packer import PackerService
from gpu_autoscaler.services.prewarm import PrewarmService
from gpu_autoscaler.simulation.sparse_forecast import SparseForecaster, SparseSeries
from gpu_autoscaler.simulation.store import SimulationStateStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from datetime import datetime

    from gpu_autoscaler.config import NodePool
    from gpu_autoscaler.domain.boot_times import LeadTime
    from gpu_autoscaler.domain.consolidation import ConsolidationNode
    from gpu_autoscaler.domain.packing.solver import Solver
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
    from gpu_autoscaler.models.messages import DrainRequest, LaunchRequest

__all__ = ["SQS_MAX_DELAY", "EventQueue", "PolicyPacker", "SimulatedConsolidate", "SimulatedPrewarm"]

SQS_MAX_DELAY = 900.0


class EventQueue:
    """A queue whose consumer acts `latency` seconds after a message is sent (plus the message's delay)."""

    def __init__(self, deliver: Callable[[float, Any], None], latency: float) -> None:
        self._deliver = deliver
        self.latency = latency

    def send(self, request: LaunchRequest | DrainRequest, delay: timedelta | None = None) -> None:
        seconds = min((delay or timedelta(0)).total_seconds(), SQS_MAX_DELAY)
        self._deliver(max(seconds, self.latency), request)

    def send_many(self, requests: Sequence[LaunchRequest]) -> None:
        for request in requests:
            self.send(request)


class PolicyPacker(PackerService):
    def __init__(self, solver: Solver, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._policy_solver = solver

    def solver(self) -> Solver:
        return self._policy_solver


class SimulatedPrewarm(PrewarmService):
    def __init__(self, series: Callable[[str], DemandSeries], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._series = series
        self._leads: tuple[object, dict[str, LeadTime]] | None = None
        self._bounds: tuple[tuple[datetime, datetime], tuple[int, int, datetime]] | None = None
        self._unrecorded: DemandSeries | None = None
        self._recorded_classes: dict[str, tuple[int, list[tuple[str, str]]]] = {}
        self.forecaster = SparseForecaster.like(self.forecaster)

    def _lead_times(self, now: datetime) -> dict[str, LeadTime]:
        """The service's, again only when a pool's samples in the history changed (a lead time depends on them
        alone), from the store's seconds per sample rather than from the samples."""
        settings = self.config.measured_lead_time
        store = self.store
        if not settings.enabled or not isinstance(store, SimulationStateStore):
            return super()._lead_times(now)
        since = now - settings.history
        key = tuple(store.boot_window(p.name, since) for p in self.config.node_pools)
        if self._leads is None or self._leads[0] != key:
            self._leads = (key, {p.name: lead_time_of(p, store.boot_seconds(p.name, since), settings)
                                 for p in self.config.node_pools})
        return self._leads[1]

    def _history(self, pool: str, since: datetime, now: datetime) -> DemandSeries:
        """The engine's dense series for the pool, instead of table records. A tick reads every pool's and shape
        class's series (dozens) over the same instants, and they share their start: the window's bounds are
        found once per tick, and the series never recorded (most classes) share one all-zero window. A shape
        class's window is a `SparseSeries`, which `SparseForecaster` reads from its non-zero buckets."""
        store = self.store
        if not isinstance(store, SimulationStateStore):
            return super()._history(pool, since, now)
        lo, hi, start = self._window_bounds(pool, since, now)
        if not store.recorded(pool):
            if self._unrecorded is None:
                self._unrecorded = _window(self._series(pool), lo, hi, start)
            return self._unrecorded
        window = _window(self._series(pool), lo, hi, start)
        if SEPARATOR not in pool:
            return window
        return SparseSeries(window.start, window.values, window.first_record, lo, store.nonzero(pool))

    def _shape_histories(self, pool: NodePool, since: datetime, now: datetime) -> Iterator[tuple[str, DemandSeries]]:
        """The service's, from the store's bookkeeping rather than a window per class (dozens a tick, most never
        recorded): the classes whose series was ever recorded, listed again only when the store records a new
        series; of those, the ones with demand in the window, by a bisection of their buckets with demand."""
        store = self.store
        if not isinstance(store, SimulationStateStore):
            yield from super()._shape_histories(pool, since, now)
            return
        version = store.recorded_series
        cached = self._recorded_classes.get(pool.name)
        if cached is None or cached[0] != version:
            keys = [(cls, series_key(pool.name, cls)) for cls in classes(pool)]
            cached = (version, [(cls, key) for cls, key in keys if store.recorded(key)])
            self._recorded_classes[pool.name] = cached
        lo, hi, _ = self._window_bounds(pool.name, since, now)
        for cls, key in cached[1]:
            if store.holds_demand(key, lo, hi):
                yield cls, self._history(key, since, now)

    def _window_bounds(self, pool: str, since: datetime, now: datetime) -> tuple[int, int, datetime]:
        """The store series' buckets of [since, now) — `lo` clipped at 0, `hi` not clipped — and the start of
        bucket `lo`: the same for every series (they share their start), found once per tick."""
        key = (since, now)
        if self._bounds is None or self._bounds[0] != key:
            series = self._series(pool)
            lo, hi = max(0, series.index(since)), series.index(now)
            self._bounds = (key, (lo, hi, series.start + lo * BUCKET))
            self._unrecorded = None
        return self._bounds[1]


def _window(series: DemandSeries, lo: int, hi: int, start: datetime) -> DemandSeries:
    """`series.between(lo, hi)` with `lo` already clipped and the window's start found."""
    first = series.first_record
    if first is not None and first < start:
        first = start
    return DemandSeries(start, series.values[lo:max(lo, min(series.values.size, hi))], first)


class SimulatedConsolidate(ConsolidateService):
    def __init__(self, picture: Callable[[Sequence[NodeClaim], datetime], list[ConsolidationNode]], *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._simulated_picture = picture

    def _picture(self, nodes: Sequence[ClusterNode], pods: Sequence[ClusterPod], claims: Sequence[NodeClaim],
                 now: datetime) -> list[ConsolidationNode]:
        return self._simulated_picture(claims, now)

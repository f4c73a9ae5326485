"""A GPU-level replay of one pool: pods arrive and leave as the trace says; capacity is launched reactively,
pre-warmed by the real decision code, and consolidated when idle.

The model, stated so the figures can be judged:

- Capacity is fluid GPUs (a GPU is a GPU: no node shapes, no packing fragmentation). A pod is placed the
  moment free ready capacity covers its GPUs; warm capacity is used first (pods land on warm nodes,
  which is what it is for), then the rest. It holds its GPUs until its deletion time, so the demand curve
  is the trace's own; a pod deleted before it was placed leaves the queue unplaced.
- Reactive provisioning (every policy): when pods wait, the GPUs they lack beyond what is free or already
  on its way are launched at once, rounded up to whole GPUs, and are ready `boot` later.
- Consolidation (every policy): each minute, non-warm capacity that has been idle for the whole of the
  last `consolidate_after` is removed. Warm capacity is never consolidated while held; once released it
  is ordinary capacity (what pods it carries stay on it).
- Pre-warm: every 5 minutes (the period the service assumes) the tick records the pool's demand
  (pending plus running GPUs) in the demand series and, for a policy with windows or prediction, calls
  the real `domain.prewarm.decide` with the capacity as NodeClaims, the real `WindowSchedule`s and the
  real `Forecaster`; its needs are sized by the real `largest_within_budget` and launched as warm
  capacity (ready `boot` later), its releases and hand-overs applied.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, cast

import numpy as np

from gpu_autoscaler.domain.forecast import DemandSeries, Forecaster
from gpu_autoscaler.domain.prewarm import WARM_GPUS_ATTRIBUTE, GpuCapacity, decide, largest_within_budget
from gpu_autoscaler.domain.windows import window_schedules, windows_zone
from gpu_autoscaler.models.claims import ClaimState, NodeClaim

if TYPE_CHECKING:
    from datetime import datetime

    from benchmarks.prewarm.trace import Trace
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.prewarm import WarmNeed

__all__ = ["Outcome", "Replay", "ReplaySettings"]

_DEPART, _READY, _ARRIVE, _TICK, _CONSOLIDATE = range(5)
_EPS = 1e-9
_NO_CAPACITY = GpuCapacity([])


@dataclass(frozen=True)
class ReplaySettings:
    boot: float = 480.0
    """Seconds from asking for a node to pods running on it (boot plus image pull)."""
    consolidate_after: float = 300.0
    tick: float = 300.0
    consolidate_every: float = 60.0
    price_per_gpu_hour: float = 1.0
    """Only for the claims' prices the decision sees; no policy here has a USD/h budget."""


@dataclass(frozen=True)
class Outcome:
    policy: str
    pods: int
    gpus: float
    ready_share: float
    """Share of the scored GPU demand placed the moment it arrived (on any free capacity)."""
    warm_share: float
    """Share of the scored GPU demand placed on arrival on warm capacity."""
    mean_wait: float
    p95_wait: float
    idle_warm_gpu_hours: float
    idle_gpu_hours: float
    gpu_hours: float
    unplaced: int


@dataclass
class _Chunk:
    id: str
    gpus: float
    ready_at: float
    warm: str | None
    created_at: float
    ready: bool = False


class Replay:
    """One policy over one stretch of the trace. `run()` once."""

    def __init__(self, name: str, trace: Trace, config: Config, *, start: float, score_from: float, end: float,
                 settings: ReplaySettings | None = None) -> None:
        self.name = name
        self.trace = trace
        self.config = config
        self.settings = settings or ReplaySettings()
        self.start, self.score_from, self.end = start, score_from, end
        self.pool = config.node_pools[0]
        self.prewarm = bool(config.scaling_windows) or config.predictive.enabled
        self.schedules = window_schedules(config)
        self.forecaster = Forecaster(config.predictive.quantile, zone=windows_zone(config))
        self.period = timedelta(seconds=self.settings.tick)
        self.lead = max(self.pool.lead_time, config.predictive.lead_time)
        buckets = int(math.ceil((end - start) / self.settings.tick)) + 1
        self.series = DemandSeries.from_array(trace.at(start), np.zeros(buckets))
        n = trace.arrival.size
        self.placed_at = np.full(n, np.nan)
        self.on_warm = np.zeros(n)
        self.on_base = np.zeros(n)
        self.gone = np.zeros(n, bool)
        self.arrival_warm = np.zeros(n)
        self.waiting: list[int] = []
        self.warm: dict[str, _Chunk] = {}
        self.base_ready = 0.0
        self.base_in_flight: list[_Chunk] = []
        self.used_warm = 0.0
        self.used_base = 0.0
        self.idle_history: deque[tuple[float, float]] = deque()
        self.ids = itertools.count()
        self.events: list[tuple[float, int, int, int | _Chunk | None]] = []
        self.order = itertools.count()
        self.now = start
        self.idle_warm = 0.0
        self.idle = 0.0
        self.provisioned = 0.0

    # Capacity

    @property
    def warm_ready(self) -> float:
        return sum(c.gpus for c in self.warm.values() if c.ready)

    def free(self) -> tuple[float, float]:
        return max(0.0, self.warm_ready - self.used_warm), max(0.0, self.base_ready - self.used_base)

    def in_flight(self) -> float:
        return sum(c.gpus for c in self.base_in_flight) + sum(c.gpus for c in self.warm.values() if not c.ready)

    def push(self, at: float, kind: int, payload: int | _Chunk | None = None) -> None:
        heapq.heappush(self.events, (at, kind, next(self.order), payload))

    # Running

    def run(self) -> Outcome:
        trace = self.trace
        for i in np.flatnonzero((trace.arrival < self.end) & (trace.departure > self.start)):
            self.push(max(trace.arrival[i], self.start), _ARRIVE, int(i))
        self.push(self.start, _TICK)
        self.push(self.start, _CONSOLIDATE)
        while self.events:
            at, kind, _, payload = heapq.heappop(self.events)
            if at >= self.end:
                break
            self.account(at)
            # The kind says what the payload is: a trace index to arrive or depart, a chunk that is ready.
            if kind == _DEPART:
                self.depart(cast("int", payload))
            elif kind == _READY:
                self.ready(cast("_Chunk", payload))
            elif kind == _ARRIVE:
                self.arrive(cast("int", payload))
            elif kind == _TICK:
                self.on_tick()
                self.push(at + self.settings.tick, _TICK)
            else:
                self.consolidate()
                self.push(at + self.settings.consolidate_every, _CONSOLIDATE)
        self.account(self.end)
        return self.outcome()

    def account(self, at: float) -> None:
        """Integrate idle and provisioned GPU-hours over the scored stretch up to `at`."""
        lo = max(self.now, self.score_from)
        if at > lo:
            hours = (at - lo) / 3600
            warm_ready = self.warm_ready
            self.idle_warm += max(0.0, warm_ready - self.used_warm) * hours
            total = warm_ready + self.base_ready
            self.idle += max(0.0, total - self.used_warm - self.used_base) * hours
            self.provisioned += total * hours
        self.now = max(self.now, at)

    def arrive(self, i: int) -> None:
        self.push(float(self.trace.departure[i]), _DEPART, i)
        if self.trace.arrival[i] < self.start:  # already running when the replay starts: its capacity exists
            self.base_ready += self.trace.gpus[i]
            self.place(i)
            return
        if not self.try_place(i):
            self.waiting.append(i)
            self.provision()

    def try_place(self, i: int) -> bool:
        warm, base = self.free()
        if warm + base + _EPS < self.trace.gpus[i]:
            return False
        self.place(i)
        return True

    def place(self, i: int) -> None:
        gpus = float(self.trace.gpus[i])
        warm, _ = self.free()
        on_warm = min(gpus, warm)
        self.on_warm[i], self.on_base[i] = on_warm, gpus - on_warm
        self.used_warm += on_warm
        self.used_base += gpus - on_warm
        self.placed_at[i] = self.now
        if self.now == max(self.trace.arrival[i], self.start):
            self.arrival_warm[i] = on_warm

    def depart(self, i: int) -> None:
        self.gone[i] = True
        if np.isnan(self.placed_at[i]):
            self.waiting.remove(i)
            return
        self.used_warm -= self.on_warm[i]
        self.used_base -= self.on_base[i]
        self.on_warm[i] = self.on_base[i] = 0.0
        self.drain_queue()

    def drain_queue(self) -> None:
        if self.waiting:
            self.waiting = [i for i in self.waiting if not self.try_place(i)]

    def provision(self) -> None:
        warm, base = self.free()
        lacking = sum(float(self.trace.gpus[i]) for i in self.waiting) - warm - base - self.in_flight()
        if lacking > _EPS:
            chunk = _Chunk(f"base-{next(self.ids)}", float(math.ceil(lacking - 1e-6)), self.now + self.settings.boot,
                           None, self.now)
            self.base_in_flight.append(chunk)
            self.push(chunk.ready_at, _READY, chunk)

    def ready(self, chunk: _Chunk) -> None:
        chunk.ready = True
        if chunk.warm is None:
            if chunk in self.base_in_flight:
                self.base_in_flight.remove(chunk)
                self.base_ready += chunk.gpus
        elif chunk.id not in self.warm:  # released while in flight: it came up as ordinary capacity
            self.base_ready += chunk.gpus
        self.drain_queue()
        if self.waiting:
            self.provision()

    def consolidate(self) -> None:
        idle = max(0.0, self.base_ready - self.used_base)
        self.idle_history.append((self.now, idle))
        while self.idle_history and self.idle_history[0][0] < self.now - self.settings.consolidate_after:
            self.idle_history.popleft()
        if self.idle_history[0][0] > self.now - self.settings.consolidate_after + _EPS:
            return  # not yet a whole period observed
        removable = min(value for _, value in self.idle_history)
        if removable > _EPS:
            self.base_ready -= removable
            self.idle_history = deque((t, v - removable) for t, v in self.idle_history)

    # Pre-warm, through the real decision code

    def on_tick(self) -> None:
        demand = self.used_warm + self.used_base + sum(float(self.trace.gpus[i]) for i in self.waiting)
        moment = self.trace.at(self.now)
        index = self.series.index(moment)
        if 0 <= index < self.series.values.size:
            self.series.values[index] = demand
        if not self.prewarm:
            return
        forecasts = {}
        if self.config.predictive.enabled:
            view = self.series.window(moment - self.config.predictive.history, moment)
            forecasts[self.pool.name] = self.forecaster.forecast(view, moment, moment + self.lead, self.pool.name)
        decision = decide(self.config, moment, self.claims(moment), _NO_CAPACITY, forecasts, schedules=self.schedules,
                          period=self.period)
        for change in decision.changes:
            self.rehold(change.claim.id, change.warm)
        for need in decision.needs:
            self.launch_warm(need)

    def claims(self, moment: datetime) -> list[NodeClaim]:
        out = [self.claim("base", self.base_ready, None, ClaimState.REGISTERED, self.start)]
        out.extend(self.claim(c.id, c.gpus, None, ClaimState.PENDING, c.created_at) for c in self.base_in_flight)
        out.extend(self.claim(c.id, c.gpus, c.warm, ClaimState.REGISTERED if c.ready else ClaimState.PENDING,
                              c.created_at) for c in self.warm.values())
        return out

    def claim(self, claim_id: str, gpus: float, warm: str | None, state: ClaimState, created: float) -> NodeClaim:
        return NodeClaim(
            cluster="backtest", id=claim_id, pool=self.pool.name, capacity_type="on-demand", zones=("z",),
            instance_types=(), price_per_hour=gpus * self.settings.price_per_gpu_hour, state=state,
            created_at=self.trace.at(created), warm=warm, attributes={WARM_GPUS_ATTRIBUTE: f"{gpus:g}"},
        )

    def rehold(self, chunk_id: str, warm: str | None) -> None:
        chunk = self.warm[chunk_id]
        if warm is not None:
            chunk.warm = warm
            return
        del self.warm[chunk_id]
        if not chunk.ready:
            return  # becomes ordinary capacity when it comes up (see `ready`)
        # Its pods stay where they are: their share of the warm capacity's use moves with it.
        share = chunk.gpus / (chunk.gpus + self.warm_ready) if chunk.gpus + self.warm_ready > 0 else 0.0
        moved = self.on_warm * share
        self.on_warm -= moved
        self.on_base += moved
        moved_total = float(moved.sum())
        self.used_warm -= moved_total
        self.used_base += moved_total
        self.base_ready += chunk.gpus

    def launch_warm(self, need: WarmNeed) -> None:
        price = self.settings.price_per_gpu_hour

        def plan(n: int) -> list[NodeClaim]:
            return [self.claim("plan", float(n), need.warm, ClaimState.PENDING, self.now)] if n > 0 else []

        claims = largest_within_budget(need, plan, _NO_CAPACITY) if need.gpus else []
        gpus = sum(c.price_per_hour for c in claims) / price
        if gpus <= 0:
            return
        chunk = _Chunk(f"warm-{next(self.ids)}", gpus, self.now + self.settings.boot, need.warm, self.now)
        self.warm[chunk.id] = chunk
        self.push(chunk.ready_at, _READY, chunk)

    # Figures

    def outcome(self) -> Outcome:
        trace = self.trace
        scored = (trace.arrival >= self.score_from) & (trace.arrival < self.end)
        gpus = trace.gpus[scored]
        arrival = trace.arrival[scored]
        placed = self.placed_at[scored]
        waits = np.where(np.isnan(placed), np.minimum(trace.departure[scored], self.end) - arrival, placed - arrival)
        on_arrival = ~np.isnan(placed) & (waits <= _EPS)
        total = float(gpus.sum())
        return Outcome(
            policy=self.name,
            pods=int(scored.sum()),
            gpus=total,
            ready_share=float(gpus[on_arrival].sum() / total),
            warm_share=float(self.arrival_warm[scored].sum() / total),
            mean_wait=float(waits.mean()),
            p95_wait=float(np.percentile(waits, 95)),
            idle_warm_gpu_hours=self.idle_warm,
            idle_gpu_hours=self.idle,
            gpu_hours=self.provisioned,
            unplaced=int(np.isnan(placed).sum()),
        )

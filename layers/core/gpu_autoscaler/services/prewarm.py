"""The prewarm use case: one scheduler tick in; warm claims stored and launched, warm holds ended.

Every tick does the whole job, whichever schedule fired it (a window's cron or the 5-minute rate), so a
lost or late tick costs at most one period: the rate tick brings a window's capacity up by its lead time
even if the window's own tick (which fires at the window's start) never arrives.

1. Each pool's lead time: the `measuredLeadTime.quantile` of its recorded boots (launch → GPUs allocatable,
   `domain.boot_times`) once it has `minSamples` of them, else the configured one. Read the cluster's live
   claims; when prediction is on, each pool's demand history since `predictive.history`, and forecast demand
   (by local time in the windows' time zone, `windows_zone`) at now + lead time (the measured one, else
   `max(pool.leadTime, predictive.leadTime)`). Under 24 h of history: no forecast, logged and reported per
   pool. With a forecast, each pod shape class's series (the packer's `<pool>/<class>`, `domain.pod_shapes`)
   is forecast to the same instant: the headroom is sized and shaped by the pods that come.
2. Decide (`domain.prewarm.decide`): what to launch per holder, which holds end, change hands or are
   extended; windows are warmed from start − lead time − `NEXT_TICK_WITHIN` (the 5-minute period and
   Scheduler's minute), so the capacity is up by the start whichever tick sees the window first.
3. Holds that end: `StateStore.update_claim(claim, warm=None, ...)` — the claim is now consolidation's
   to judge like any other; its former holder and the time are kept in its attributes
   (`warmReleased`, `warmReleasedAt`). Holds handed over (a closing window's claim the forecast keeps):
   `update_claim(claim, warm="forecast", ...)`. Holds extended (a window's later opening counts the claim):
   its `warmUntil` set to the opening's end. A claim that changed meanwhile (`StaleClaim`: each write is
   conditional on the version read) is left for the next tick.
4. Launches: the need becomes placeholder pods, the injected `plan_capacity(pods) -> claims` (the
   packer's solver) prices the cheapest nodes holding them, the budget trims them (GPUs and USD/h,
   forecast only), and each claim is stored tagged with its holder — no pods, no recorded requests, so
   the packer sees a warm claim in flight as free room for real pods — and named in a `LaunchRequest`.
   Warm claims still Pending `RESEND_AFTER` after creation are named again (a crash between storing and
   sending must not strand them; the fleet acts on a claim's state, so a repeat is harmless).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from gpu_autoscaler.domain.boot_times import LeadTime, lead_time
from gpu_autoscaler.domain.forecast import DemandSeries, Forecast, Forecaster, ForecastStatus, bucket_start
from gpu_autoscaler.domain.packing.fit import gpu_devices
from gpu_autoscaler.domain.packing.quotas import vcpu_budget
from gpu_autoscaler.domain.packing.results import REQUESTS_ATTRIBUTE, requests_attribute
from gpu_autoscaler.domain.pod_shapes import classes, series_key
from gpu_autoscaler.domain.prewarm import (
    WARM_GPUS_ATTRIBUTE,
    WARM_UNTIL_ATTRIBUTE,
    GpuCapacity,
    PrewarmDecision,
    WarmChange,
    WarmNeed,
    decide,
    largest_within_budget,
    mig_slices_per_gpu,
    placeholder_pods,
)
from gpu_autoscaler.domain.windows import WindowSchedule, window_schedules, windows_zone
from gpu_autoscaler.errors import ClaimExists, GpuAutoscalerError, StaleClaim
from gpu_autoscaler.models.claims import CLAIMED_STATES, IN_FLIGHT_STATES, ClaimState, NodeClaim
from gpu_autoscaler.models.messages import LaunchRequest, ScheduleTick
from gpu_autoscaler.models.resources import GPU
from gpu_autoscaler.services.claim_writes import withdraw_beyond_limits
from gpu_autoscaler.wiring import rate_period

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config, NodePool
    from gpu_autoscaler.domain.packing.solver import Solver
    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.models.pods import PendingPod
    from gpu_autoscaler.ports import LaunchQueue, QuotaSource, StateStore
    from gpu_autoscaler.services.aws_environment import AwsEnvironment

__all__ = [
    "LIVE_STATES",
    "NEXT_TICK_WITHIN",
    "RELEASED_AT_ATTRIBUTE",
    "RELEASED_ATTRIBUTE",
    "RESEND_AFTER",
    "InvalidTick",
    "PERIOD",
    "PlanCapacity",
    "PrewarmOutcome",
    "PrewarmService",
    "SolverPlanner",
    "aws_prewarm_service",
    "parse_tick",
]

logger = logging.getLogger(__name__)

LIVE_STATES = (ClaimState.PENDING, ClaimState.LAUNCHED, ClaimState.REGISTERED)
"""Claims that may hold warm capacity."""
RELEASED_ATTRIBUTE = "warmReleased"
"""NodeClaim attribute: the holder (`window:<name>` / `forecast`) whose warm hold ended."""
RELEASED_AT_ATTRIBUTE = "warmReleasedAt"
PERIOD = rate_period("prewarm")
"""The rate schedule's period (`gpu_autoscaler.wiring`: rate(5 minutes)): windows are warmed a period (and
Scheduler's minute, `NEXT_TICK_WITHIN`) earlier, so their capacity is up by the start whichever tick sees them
first. (The forecast stays at now + lead time: its profile already spans ±10 minutes, and the backtest found a
further 5 minutes only traded hits for idle GPUs along the same curve.)"""
NEXT_TICK_WITHIN = PERIOD + timedelta(minutes=1)
"""The longest until the next rate tick: its period, plus the minute EventBridge Scheduler takes to invoke ("if you
set your schedule to run at 1:00, it will invoke the target API between 1:00:00 and 1:00:59", Scheduler User
Guide, schedule types). Windows are warmed this much before start − lead time: a tick that sees nothing to do
must not leave the window to a next tick that comes too late to have the capacity up by the start. (A tick
retried after a failure comes later still; the next rate tick does not wait for it.)"""
RESEND_AFTER = 180.0
"""Seconds after which a warm claim still Pending is named in a launch request again."""


class InvalidTick(GpuAutoscalerError, ValueError):
    """The event is not a ScheduleTick the prewarm function can act on."""


def parse_tick(event: Any) -> ScheduleTick:
    """The scheduler's payload as a `ScheduleTick`; anything else is an `InvalidTick` naming the problem."""
    from pydantic import ValidationError

    if not isinstance(event, dict):
        raise InvalidTick(f"a ScheduleTick is a JSON object, got {type(event).__name__}")
    try:
        tick = ScheduleTick.model_validate(event)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'event'}: {e['msg']}" for e in error.errors(include_url=False)
        )
        raise InvalidTick(f"not a ScheduleTick: {problems}") from None
    if tick.trigger == "window" and not tick.window:
        raise InvalidTick("a 'window' tick must name its window")
    return tick


class PlanCapacity(Protocol):
    """The packer, asked for the cheapest new claims that hold these (placeholder) pods, and, once they are
    stored, which of them other planners' claims stored meanwhile leave within the pools' limits."""

    def __call__(self, pods: Sequence[PendingPod]) -> Sequence[NodeClaim]: ...

    def within_limits(self, stored: Sequence[NodeClaim]) -> Sequence[NodeClaim]: ...


class SolverPlanner:
    """`PlanCapacity` over the packer's solver, against the store's live claims, offerings and quotas.

    Claims in flight are shown to the solver as full: the decision already counted their GPUs as supply,
    so placeholder pods must not be placed in their free room (they would buy nothing and be counted
    twice). They still count against pool limits and quotas, as every live claim does.
    """

    def __init__(self, solver: Callable[[], Solver], store: StateStore, quotas: QuotaSource | None = None) -> None:
        self._solver = solver
        self._store = store
        self._quotas = quotas

    def __call__(self, pods: Sequence[PendingPod]) -> Sequence[NodeClaim]:
        if not pods:
            return []
        live = [_without_room(c) for c in self._store.list_claims(CLAIMED_STATES)]
        solver = self._solver()
        quotas, outside = vcpu_budget(self._quotas, live, solver.index.catalog)
        plan = solver.solve(pods, claims=live, unavailable=self._store.unavailable_offerings(), source=pods[0].uid,
                            quotas=quotas, outside=outside)
        for item in plan.unschedulable:
            logger.info("warm placeholder %s not placed: %s", item.name, item.reason)
        return plan.claims

    def within_limits(self, stored: Sequence[NodeClaim]) -> Sequence[NodeClaim]:
        return withdraw_beyond_limits(self._store, self._solver(), stored)


_FULL = requests_attribute({GPU: 10**9})


def _without_room(claim: NodeClaim) -> NodeClaim:
    if claim.state not in IN_FLIGHT_STATES:
        return claim
    return claim.model_copy(update={"attributes": {**claim.attributes, REQUESTS_ATTRIBUTE: _FULL}})


@dataclass(frozen=True)
class PrewarmOutcome:
    """What one tick did: the handler's response, logs and metrics."""

    tick: ScheduleTick
    decision: PrewarmDecision
    forecasts: dict[str, Forecast]
    launched: tuple[NodeClaim, ...] = ()
    released: tuple[WarmChange, ...] = ()
    handed_over: tuple[WarmChange, ...] = ()
    renewed: tuple[WarmChange, ...] = ()
    resent: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    lead_times: Mapping[str, LeadTime] = field(default_factory=dict)

    @property
    def forecast_status(self) -> str:
        """`disabled`, `ok`, `insufficient-history`, or `partial` when pools differ."""
        statuses = {f.status for f in self.forecasts.values()}
        if not statuses:
            return ForecastStatus.DISABLED.value
        return statuses.pop().value if len(statuses) == 1 else "partial"

    def summary(self) -> dict[str, Any]:
        return {
            "trigger": self.tick.trigger,
            "window": self.tick.window,
            "at": self.decision.now.isoformat(),
            "forecastStatus": self.forecast_status,
            "pools": {p.pool: p.to_json() for p in self.decision.pools},
            "launched": [
                {"claim": c.id, "pool": c.pool, "warm": c.warm, "capacityType": c.capacity_type,
                 "instanceTypes": list(c.instance_types[:5]), "gpus": float(c.attributes.get(WARM_GPUS_ATTRIBUTE, 0)),
                 "pricePerHour": round(c.price_per_hour, 6)}
                for c in self.launched
            ],
            "released": [{"claim": c.claim.id, "pool": c.claim.pool, "warm": c.claim.warm, "reason": c.reason}
                         for c in self.released],
            "handedOver": [{"claim": c.claim.id, "from": c.claim.warm, "to": c.warm, "reason": c.reason}
                           for c in self.handed_over],
            "holdsRenewed": [{"claim": c.claim.id, "warm": c.warm, "until": c.until.isoformat() if c.until else None}
                             for c in self.renewed],
            "launchRequestsResent": list(self.resent),
            "leadTimes": {pool: lead.to_json() for pool, lead in sorted(self.lead_times.items())},
            "notes": list(self.notes),
        }


class PrewarmService:
    """Holds each pool's warm capacity where windows and the forecast want it; safe to run on every tick."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        launches: LaunchQueue,
        instance_types: Callable[[], Sequence[InstanceType]],
        *,
        plan_capacity: PlanCapacity,
        clock: Clock,
        forecaster: Forecaster | None = None,
    ) -> None:
        """`instance_types`: the catalog's types (GPU counts, partitions); `plan_capacity`: the packer."""
        self.config = config
        self.store = store
        self.launches = launches
        self.plan_capacity = plan_capacity
        self.clock = clock
        self.forecaster = forecaster or Forecaster(config.predictive.quantile, zone=windows_zone(config))
        self._instance_types = instance_types
        self._schedules = window_schedules(config)
        self._schedules_for: dict[tuple[tuple[str, timedelta], ...], list[WindowSchedule]] = {}
        self._facts: tuple[list[InstanceType], tuple[GpuCapacity, list[str], dict[str, InstanceType]]] | None = None

    def run(self, tick: ScheduleTick) -> PrewarmOutcome:
        now = self.clock.now()
        notes: list[str] = []
        if tick.window and tick.window not in {s.name for s in self._schedules}:
            notes.append(f"tick for window '{tick.window}', which is not configured; reconciling the rest")
            logger.warning(notes[-1])
        types = list(self._instance_types())
        gpus, partitioned, by_name = self._type_facts(types)
        claims = self.store.list_claims(LIVE_STATES)
        leads = self._lead_times(now)
        forecasts = self._forecasts(now, leads)
        schedules = self._window_schedules(leads)
        shapes, mixes = self._shaping(now, forecasts, schedules)
        decision = decide(self.config, now, claims, gpus, forecasts, schedules=schedules, period=NEXT_TICK_WITHIN,
                          shapes=shapes, mixes=mixes)
        released, handed, renewed = self._apply_changes(decision.changes, now)
        launched: list[NodeClaim] = []
        for need in decision.needs:
            launched.extend(self._launch(need, now, gpus, partitioned, by_name))
        for pool in decision.pools:
            notes.extend(f"{pool.pool}: {note}" for note in pool.notes)
        resent = self._resend(claims, now)
        outcome = PrewarmOutcome(tick, decision, forecasts, tuple(launched), tuple(released), tuple(handed),
                                 tuple(renewed), tuple(resent), tuple(notes), leads)
        if logger.isEnabledFor(logging.INFO):  # the summary is built for the log alone
            logger.info("prewarm tick", extra={"prewarm": outcome.summary()})
        return outcome

    def _type_facts(self, types: list[InstanceType]) -> tuple[GpuCapacity, list[str], dict[str, InstanceType]]:
        """GPUs per type, the partitioned types, the types by name: rebuilt only when the catalog's types are not
        the very (immutable) objects of the last tick — every tick reads them, the catalog changes rarely."""
        cached = self._facts
        if cached is not None and len(cached[0]) == len(types) and all(
                a is b for a, b in zip(cached[0], types, strict=True)):
            return cached[1]
        facts = (GpuCapacity(types), sorted(t.name for t in types if t.is_gpu and t.gpus < 1),
                 {t.name: t for t in types})
        self._facts = (types, facts)
        return facts

    # Lead times

    def _lead_times(self, now: datetime) -> dict[str, LeadTime]:
        """Each pool's lead time: measured from its recorded boots once there are enough, else configured."""
        settings = self.config.measured_lead_time
        if not settings.enabled:
            return {p.name: LeadTime(p.name, p.lead_time, measured=False, samples=0) for p in self.config.node_pools}
        since = now - settings.history
        return {p.name: lead_time(p, self.store.boot_times(p.name, since), settings) for p in self.config.node_pools}

    def _window_schedules(self, leads: Mapping[str, LeadTime]) -> list[WindowSchedule]:
        """The windows with the pools' lead times; built again only when a measured lead time changed."""
        measured = tuple(sorted((pool, lead.value) for pool, lead in leads.items() if lead.measured))
        if not measured:
            return self._schedules
        if measured not in self._schedules_for:
            if len(self._schedules_for) > 64:
                self._schedules_for.clear()
            self._schedules_for[measured] = window_schedules(self.config, dict(measured))
        return self._schedules_for[measured]

    # Forecasts

    def _forecasts(self, now: datetime, leads: Mapping[str, LeadTime]) -> dict[str, Forecast]:
        predictive = self.config.predictive
        if not predictive.enabled:
            return {}
        since = now - predictive.history
        out = {}
        for pool in self.config.node_pools:
            lead = leads.get(pool.name)
            target = now + (lead.value if lead is not None and lead.measured
                            else max(pool.lead_time, predictive.lead_time))
            forecast = self.forecaster.forecast(self._history(pool.name, since, now), now, target, pool.name)
            if not forecast.ok:
                logger.info("no forecast for pool %s: %s", pool.name, forecast.reason)
            out[pool.name] = forecast
        return out

    def _shaping(self, now: datetime, forecasts: Mapping[str, Forecast], schedules: Sequence[WindowSchedule],
                 ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
        """`decide`'s `shapes` and `mixes`, from the packer's `<pool>/<class>` series (pending GPUs of each pod shape
        class), each class's series read once a tick.

        `shapes`, per pool with a forecast and shape history: each class's forecast GPUs at the pool's target, for
        the classes with enough history; a pool with shape history whose classes all forecast nothing maps to no
        class (no headroom is wanted); only a pool without any falls back to its GPU total. `mixes`, per pool with
        a window that asks for a GPU count and holds capacity now (or before the next tick): each class's GPUs
        recorded over the history, the proportions the window's nodes are shaped in. Outside its windows, a pool
        without a forecast reads no series."""
        since = now - self.config.predictive.history
        windowed = {s.window.node_pool for s in schedules
                    if s.window.warm.gpus is not None and s.holding(now, early=NEXT_TICK_WITHIN) is not None}
        shapes: dict[str, dict[str, float]] = {}
        mixes: dict[str, dict[str, float]] = {}
        for pool in self.config.node_pools:
            forecast = forecasts.get(pool.name)
            if forecast is not None and not forecast.ok:
                forecast = None
            if forecast is None and pool.name not in windowed:
                continue
            histories = list(self._shape_histories(pool, since, now))
            if pool.name in windowed:
                mixes[pool.name] = {cls: float(history.values.sum()) for cls, history in histories}
            if forecast is None:
                continue
            found = {}
            shaped_history = False
            for cls, history in histories:
                shaped = self.forecaster.forecast(history, now, forecast.target, pool.name)
                if shaped.ok:
                    shaped_history = True
                    if shaped.gpus:
                        found[cls] = shaped.gpus
            if shaped_history:
                shapes[pool.name] = found
        return shapes, mixes

    def _shape_histories(self, pool: NodePool, since: datetime, now: datetime) -> Iterator[tuple[str, DemandSeries]]:
        """The pool's shape classes whose series (`<pool>/<class>`) holds demand from `since` to `now`, in
        `classes` order, each with that series: a class that has not come in the history is not forecast at all
        (most classes of a pool never come)."""
        for cls in classes(pool):
            history = self._history(series_key(pool.name, cls), since, now)
            if history.first_record is not None and history.values.any():
                yield cls, history

    def _history(self, pool: str, since: datetime, now: datetime) -> DemandSeries:
        """A demand series (a pool's, or `<pool>/<class>`) from `since` to `now`: the store's records (the
        simulator keeps a series)."""
        return DemandSeries.from_records(self.store.demand_history(pool, since), since, now)

    # Acting

    def _apply_changes(self, changes: Sequence[WarmChange], now: datetime,
                       ) -> tuple[list[WarmChange], list[WarmChange], list[WarmChange]]:
        """Each change written on the version read (released, handed over, renewed); one another writer got in
        first with is left for the next tick. A renewal keeps the claim's reason: it happens once per opening."""
        released: list[WarmChange] = []
        handed: list[WarmChange] = []
        renewed: list[WarmChange] = []
        for change in changes:
            claim = change.claim
            attributes = dict(claim.attributes)
            if change.warm is None:
                attributes.update({RELEASED_ATTRIBUTE: claim.warm or "", RELEASED_AT_ATTRIBUTE: now.isoformat()})
                attributes.pop(WARM_UNTIL_ATTRIBUTE, None)
                reason = f"{claim.reason}; warm hold {claim.warm} ended: {change.reason}"
            else:
                reason = claim.reason if change.renewal else f"{claim.reason}; now held by {change.warm}"
            if change.until is not None:
                attributes[WARM_UNTIL_ATTRIBUTE] = change.until.isoformat()
            try:
                self.store.update_claim(claim, warm=change.warm, attributes=attributes, reason=reason)
            except StaleClaim:
                logger.info("claim %s changed meanwhile; its warm hold is looked at again next tick", claim.id)
                continue
            if change.warm is None:
                released.append(change)
            else:
                (renewed if change.renewal else handed).append(change)
            logger.info("warm claim %s: %s → %s%s (%s)", claim.id, claim.warm, change.warm or "released",
                        f" until {change.until.isoformat()}" if change.until else "", change.reason)
        return released, handed, renewed

    def _launch(self, need: WarmNeed, now: datetime, gpus: GpuCapacity, partitioned: Sequence[str],
                by_name: dict[str, InstanceType]) -> list[NodeClaim]:
        pool = self.config.pool(need.pool)
        stamp = bucket_start(now).strftime("%Y%m%dT%H%M")
        if need.instance_type:
            if need.instance_type not in by_name:
                logger.warning("warm %s: instance type %s is not in the catalog", need.warm, need.instance_type)
                return []
            pods = placeholder_pods(need, pool, stamp, devices=gpu_devices(by_name[need.instance_type], pool))
            claims = list(self.plan_capacity(pods))
        else:
            slices = mig_slices_per_gpu(pool, by_name.values())
            claims = largest_within_budget(
                need,
                lambda n: self.plan_capacity(placeholder_pods(need, pool, f"{stamp}n{n}", gpus=n,
                                                              exclude_types=partitioned, slices_per_gpu=slices)),
                gpus,
            )
        if not claims:
            logger.warning("warm %s in pool %s: nothing launched for %s (budget or no fitting offering)",
                           need.warm, need.pool, need.reason)
            return []
        stored = []
        for claim in claims:
            warm = self._as_warm(claim, need, gpus)
            try:
                self.store.create_claim(warm)
            except ClaimExists:
                logger.info("warm claim %s exists already (a retried tick)", warm.id)
                continue
            stored.append(warm)
        kept = list(self.plan_capacity.within_limits(stored)) if stored else []
        for warm in kept:
            self.launches.send(LaunchRequest(cluster=self.config.cluster_name, claim_ids=[warm.id]))
        return kept

    def _as_warm(self, claim: NodeClaim, need: WarmNeed, gpus: GpuCapacity) -> NodeClaim:
        attributes = {k: v for k, v in claim.attributes.items() if k != REQUESTS_ATTRIBUTE}
        attributes[WARM_GPUS_ATTRIBUTE] = f"{gpus.of_claim(claim):g}"
        if need.until is not None:
            attributes[WARM_UNTIL_ATTRIBUTE] = need.until.isoformat()
        return claim.model_copy(update={"warm": need.warm, "pods": (), "reason": f"warm: {need.reason}",
                                        "attributes": attributes})

    def _resend(self, claims: Sequence[NodeClaim], now: datetime) -> list[str]:
        stuck = [c.id for c in claims if c.warm and c.state is ClaimState.PENDING
                 and (now - c.created_at).total_seconds() >= RESEND_AFTER]
        for claim_id in stuck:
            self.launches.send(LaunchRequest(cluster=self.config.cluster_name, claim_ids=[claim_id]))
        return stuck


def aws_prewarm_service(env: AwsEnvironment) -> PrewarmService:
    """The service as the Lambda runs it: configuration from SSM, catalog from EC2, state in DynamoDB (the
    handler takes the tick's lease from the same environment: `AwsEnvironment.tick_lease`)."""
    return PrewarmService(
        env.config, env.store, env.launch_queue, env.catalog.instance_types,
        plan_capacity=SolverPlanner(env.packer.solver, env.store, env.quotas), clock=env.clock,
    )

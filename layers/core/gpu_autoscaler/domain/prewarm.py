"""The pre-warm decision: which warm capacity each pool should hold now, what to launch, what to let go.

Pure: configuration, the clock's instant, the live NodeClaims, GPU counts and forecasts in; a
`PrewarmDecision` out. The prewarm service acts on it (plans and stores claims, sends launch requests,
ends warm holds).

Warm capacity is NodeClaims whose `warm` says who holds them: `window:<name>` or `forecast`, and whose
`warmUntil` says until when. Consolidation leaves a claim alone while both hold; ending the hold
(`StateStore.update_claim` with `warm=None`), or its `warmUntil` passing, hands the node to consolidation, which
removes it once empty or underused. A warm node's GPUs
count for the hold whether or not real pods have landed on it, so pods using warm capacity never make
the pool buy more.

Per pool:

- Windows: each window holding capacity now (open, or opening within the pool's lead time plus the
  time to the next decision — see `windows`) wants its `warm` capacity held by claims tagged for it: a
  GPU total, or a count per instance type. The shortfall is launched; claims beyond the target, of a
  window that no longer holds (closed, removed from the configuration, moved to another pool) are
  released. The claims it keeps are held until the opening's end (`warmUntil`, which consolidation reads): a
  later opening that counts claims an earlier one launched (all day every day, or hourly openings, the next
  holding before the last ends) extends their hold to its own end.
- Forecast, shaped (the packer records each pod shape class's pending GPUs, `pod_shapes`): the pool should
  have, beyond the GPUs its pods ask for now (the demand, at most what its claims hold: demand beyond them is
  the packer's to place), headroom for the pods forecast to arrive — each class's forecast rounded down to
  whole pods of the class (`pod_shapes.whole_pods`: under one pod, none), at most `predictive.maxWarmGpus` in
  all. Free room anywhere in the pool (registered nodes, claims in flight, warm nodes) is headroom already;
  only the shortfall is bought, as placeholder pods of those classes, so the warm nodes are the types they
  need. A pool with shape history whose classes forecast no pod holds no forecast headroom. Without shape
  history the forecast is a GPU total:
- Forecast: the pool should have `min(forecast, current demand + predictive.maxWarmGpus)` GPUs of
  capacity (registered plus in flight) at now + lead time: `maxWarmGpus` bounds the idle GPUs held ahead
  of demand, not the warm claims real pods have since filled (those are the capacity the pods would
  have needed anyway). Window claims being released are adopted first (re-tagged `forecast`, so a
  closing window hands over instead of churning nodes), then the remaining shortfall is launched within
  the GPU room and the USD/h room (`maxWarmPricePerHour` less the idle share of what forecast claims
  cost). Forecast claims the target no longer needs are released, largest first, once older than
  `FORECAST_MIN_HOLD` (no flapping on a noisy bucket). Without a forecast (prediction off, or under 24 h
  of history) no forecast claim is kept. The forecast's claims (launched, adopted or kept) are held until
  `FORECAST_HOLD` from now, renewed by each decision that keeps them: a hold no decision renews (prewarm
  failing for good) ends by itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.packing.index import type_allowed
from gpu_autoscaler.domain.packing.mig import first_offering, mig_slices
from gpu_autoscaler.domain.pod_shapes import placeholder_requests, split_gpus, whole_pods
from gpu_autoscaler.domain.windows import WindowSchedule, window_schedules
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.claims import instant_attribute
from gpu_autoscaler.models.pods import PendingPod
from gpu_autoscaler.models.requirements import NodeSelectorTerm, Requirement
from gpu_autoscaler.models.resources import GPU, mig_resource
from gpu_autoscaler.models.taints import Toleration

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from gpu_autoscaler.config import Config, NodePool, Predictive, ScalingWindow
    from gpu_autoscaler.domain.forecast import Forecast
    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.models.claims import NodeClaim

__all__ = [
    "FORECAST_HOLD",
    "FORECAST_MIN_HOLD",
    "FORECAST_WARM",
    "WARM_GPUS_ATTRIBUTE",
    "WARM_UNTIL_ATTRIBUTE",
    "WINDOW_PREFIX",
    "GpuCapacity",
    "PoolWarmth",
    "PrewarmDecision",
    "WarmChange",
    "WarmNeed",
    "decide",
    "largest_within_budget",
    "mig_slices_per_gpu",
    "placeholder_pods",
    "window_warm",
    "warm_until",
    "warm_window",
]

WINDOW_PREFIX = "window:"
FORECAST_WARM = "forecast"
WARM_GPUS_ATTRIBUTE = "warmGpus"
"""NodeClaim attribute: the physical GPUs a warm claim holds (its smallest candidate's), as a decimal string."""
WARM_UNTIL_ATTRIBUTE = "warmUntil"
"""NodeClaim attribute: ISO instant a warm claim is held until (a window's: the end of the opening that counts it;
the forecast's: `FORECAST_HOLD` after the last tick that kept it): consolidation leaves the claim alone until then
(`warm_until`)."""
FORECAST_MIN_HOLD = timedelta(minutes=15)
FORECAST_HOLD = timedelta(minutes=20)
"""How far ahead a forecast claim is held (`warmUntil`), renewed by each prewarm tick that keeps it: four of the
5-minute rate schedule's periods, so a tick or two lost or late (a throttled tick, a write that lost a race) do not
end it, while a prewarm that fails for good (Lambda drops an asynchronous event after its retries) holds no node
for longer."""


def window_warm(name: str) -> str:
    return f"{WINDOW_PREFIX}{name}"


def warm_window(warm: str | None) -> str | None:
    """The window name of a `window:<name>` hold, else None."""
    return warm.removeprefix(WINDOW_PREFIX) if warm and warm.startswith(WINDOW_PREFIX) else None


def warm_until(claim: NodeClaim) -> datetime | None:
    """When the warm hold on the claim ends by itself (its `warmUntil`); None for no hold or an end that cannot be
    read (the next prewarm tick that keeps the claim writes one)."""
    if claim.warm is None:
        return None
    return instant_attribute(claim, WARM_UNTIL_ATTRIBUTE)


class GpuCapacity:
    """Physical GPUs of instance types and of claims, from the catalog's instance types."""

    def __init__(self, instance_types: Iterable[InstanceType]) -> None:
        self._gpus = {t.name: float(t.gpus) for t in instance_types}
        self._claims: dict[str, tuple[NodeClaim, float]] = {}
        """Claim id → (the claim, its GPUs): a decision asks about each claim several times, and a caller that
        decides often keeps this object while the catalog stands. Claims are immutable: a changed claim is a new
        object, and is looked at again."""

    def of_type(self, name: str) -> float | None:
        return self._gpus.get(name)

    def of_claim(self, claim: NodeClaim) -> float:
        """A launched claim's type's GPUs; before launch, the fewest any candidate has (what is certain);
        a warm claim's own record when it has one."""
        cached = self._claims.get(claim.id)
        if cached is not None and cached[0] is claim:
            return cached[1]
        gpus = self._of_claim(claim)
        self._claims[claim.id] = (claim, gpus)
        return gpus

    def _of_claim(self, claim: NodeClaim) -> float:
        recorded = claim.attributes.get(WARM_GPUS_ATTRIBUTE)
        if recorded and not claim.instance_type:
            return float(recorded)
        names = [claim.instance_type] if claim.instance_type else list(claim.instance_types)
        known = [g for n in names if (g := self._gpus.get(n)) is not None]
        if known:
            return min(known)
        return float(recorded) if recorded else 0.0


def _claim_type(claim: NodeClaim) -> str | None:
    if claim.instance_type:
        return claim.instance_type
    return claim.instance_types[0] if len(claim.instance_types) == 1 else None


@dataclass(frozen=True)
class WarmNeed:
    """Warm capacity to launch for one holder: `gpus` GPUs, or `nodes` nodes of `instance_type`."""

    pool: str
    warm: str
    gpus: int = 0
    instance_type: str | None = None
    nodes: int = 0
    gpu_room: float | None = None
    """Budget: the new claims may hold at most this many GPUs (forecast; None = no cap)."""
    price_room: float | None = None
    """Budget: the new claims may cost at most this many USD/h (forecast; None = no cap)."""
    until: datetime | None = None
    reason: str = ""
    shapes: tuple[tuple[str, float], ...] = ()
    """(pod shape class, its GPUs) — the forecast's of the classes that come, or a GPU-count window's of the pool's
    recorded pods (`domain.pod_shapes`); the placeholders are split among them in proportion, so warm nodes are
    the types those pods need. Empty: one-GPU placeholders (the cheapest GPUs, whatever their CPU and memory)."""


@dataclass(frozen=True)
class WarmChange:
    """End a claim's warm hold (`warm` None: released to consolidation), hand it to another holder, or extend it
    (`warm` the claim's own, `until` later than its `warmUntil`)."""

    claim: NodeClaim
    warm: str | None
    reason: str
    until: datetime | None = None
    """The hold's end (`warmUntil`) from now on; None: unchanged, or none (released)."""

    @property
    def renewal(self) -> bool:
        return self.warm is not None and self.warm == self.claim.warm


@dataclass(frozen=True)
class PoolWarmth:
    """What one pool wants warm now, and what it had: the decision's summary line for the pool."""

    pool: str
    windows: Mapping[str, float]
    """Active window → its warm target in GPUs."""
    forecast: Forecast | None
    forecast_target: float
    """GPUs the forecast wants held warm: its capacity target (after the maxWarmGpus cap) less the
    capacity it does not hold itself."""
    supply: float
    """GPUs of the pool's live claims (registered and in flight), before this decision."""
    held: Mapping[str, float]
    """Holder → GPUs it held before this decision."""
    launch: float
    """GPUs asked for by this decision's needs (instance-type needs counted by their types)."""
    released: float
    notes: tuple[str, ...] = ()

    @property
    def target(self) -> float:
        return sum(self.windows.values()) + self.forecast_target

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "warmTargetGpus": round(self.target, 3),
            "windows": {k: round(v, 3) for k, v in self.windows.items()},
            "forecastTargetGpus": round(self.forecast_target, 3),
            "supplyGpus": round(self.supply, 3),
            "heldGpus": {k: round(v, 3) for k, v in self.held.items()},
            "launchGpus": round(self.launch, 3),
            "releasedGpus": round(self.released, 3),
        }
        if self.forecast is not None:
            out["forecast"] = self.forecast.to_json()
        if self.notes:
            out["notes"] = list(self.notes)
        return out


@dataclass(frozen=True)
class PrewarmDecision:
    now: datetime
    pools: tuple[PoolWarmth, ...] = ()
    needs: tuple[WarmNeed, ...] = ()
    changes: tuple[WarmChange, ...] = ()

    @property
    def releases(self) -> tuple[WarmChange, ...]:
        return tuple(c for c in self.changes if c.warm is None)

    @property
    def renewals(self) -> tuple[WarmChange, ...]:
        return tuple(c for c in self.changes if c.renewal)


@dataclass
class _Pool:
    """One pool's working state during a decision."""

    pool: NodePool
    live: list[NodeClaim]
    gpus: GpuCapacity
    windows: dict[str, float] = field(default_factory=dict)
    needs: list[WarmNeed] = field(default_factory=list)
    changes: list[WarmChange] = field(default_factory=list)
    closing: list[NodeClaim] = field(default_factory=list)
    """Window claims whose hold ends now, unless the forecast adopts them."""
    closing_reasons: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    forecast_target: float = 0.0

    def held(self, warm: str) -> list[NodeClaim]:
        return [c for c in self.live if c.warm == warm]


def decide(
    config: Config,
    now: datetime,
    claims: Sequence[NodeClaim],
    gpus: GpuCapacity,
    forecasts: Mapping[str, Forecast] | None = None,
    *,
    schedules: Sequence[WindowSchedule] | None = None,
    period: timedelta = timedelta(0),
    shapes: Mapping[str, Mapping[str, float]] | None = None,
    mixes: Mapping[str, Mapping[str, float]] | None = None,
) -> PrewarmDecision:
    """The warm capacity every pool should hold at `now`.

    `claims`: the cluster's claims (only live ones count); `forecasts`: pool → forecast, for pools to
    forecast (empty or None when prediction is off); `schedules`: the windows' schedules, built once by a
    caller that decides often (the backtest), else from `config`; `period`: how long until the next
    decision — windows are warmed that much before start − lead time, so their capacity is up by the
    start whenever the ticks fall; `shapes`: pool → pod shape class → its forecast GPUs, which shape the
    forecast's warm capacity (a pool absent from it gets the cheapest GPUs; one mapped to no class, no headroom);
    `mixes`: pool → pod shape class → its GPUs recorded over the history, in whose proportions a window that asks
    for a GPU count holds whole pods' nodes (a pool absent or mapped to no class: the cheapest GPUs).
    """
    schedules = list(schedules) if schedules is not None else window_schedules(config)
    forecasts = forecasts or {}
    pools = {p.name: _Pool(p, [c for c in claims if c.live and c.pool == p.name], gpus) for p in config.node_pools}
    for schedule in schedules:
        _window(pools[schedule.window.node_pool], schedule, now, period, (mixes or {}).get(schedule.window.node_pool))
    _orphans(pools, {s.name: s.window for s in schedules})
    summaries = []
    for state in pools.values():
        held = _held_summary(state)
        supply = sum(gpus.of_claim(c) for c in state.live)
        _forecast(state, config.predictive, forecasts.get(state.pool.name), now,
                  (shapes or {}).get(state.pool.name))
        summaries.append(_summary(state, forecasts.get(state.pool.name), supply, held))
    return PrewarmDecision(
        now,
        tuple(summaries),
        tuple(n for s in pools.values() for n in s.needs),
        tuple(c for s in pools.values() for c in s.changes),
    )


# Windows


def _window(state: _Pool, schedule: WindowSchedule, now: datetime, period: timedelta,
            mix: Mapping[str, float] | None) -> None:
    """A window's target: nodes by type, or a GPU count — held, when the pool's pods were recorded, as whole pods
    of their shapes in their proportions (`mix`), since the cheapest GPUs need not hold them (one GPU, 4 vCPUs and
    16 GiB, against pods that ask for 12 vCPUs); unrecorded, or a shortfall under one of those pods, as the
    cheapest GPUs."""
    window = schedule.window
    warm = window_warm(window.name)
    held = state.held(warm)
    occurrence = schedule.holding(now, early=period)
    if occurrence is None:
        for claim in held:
            state.closing.append(claim)
            state.closing_reasons[claim.id] = f"window {window.name} is not open"
        return
    reason = f"window {window.name} {occurrence.start.isoformat()} – {occurrence.end.isoformat()}"
    if window.warm.instance_types:
        state.windows[window.name] = _by_types(state, window, warm, held, occurrence.end, reason)
    else:
        state.windows[window.name] = _by_gpus(state, window, warm, held, occurrence.end, reason, mix)
    _extend(state, held, occurrence.end, f"held on: {reason}")


def _by_gpus(state: _Pool, window: ScalingWindow, warm: str, held: list[NodeClaim], until: datetime, reason: str,
             mix: Mapping[str, float] | None) -> float:
    target = float(window.warm.gpus or 0)
    have = sum(state.gpus.of_claim(c) for c in held)
    if have < target:
        shortfall = math.ceil(target - have)
        shapes = tuple(sorted((c, g) for c, g in (mix or {}).items() if g > 0))
        if shapes and not split_gpus(shortfall, shapes, state.pool):
            shapes = ()  # less than one of the pool's pods: the cheapest GPUs, so the target is met, not asked again
        state.needs.append(WarmNeed(state.pool.name, warm, gpus=shortfall, until=until, reason=reason,
                                    shapes=shapes))
        return target
    # Beyond the target (the target was lowered): let go of what the target does not need, largest first.
    for claim in sorted(held, key=lambda c: -state.gpus.of_claim(c)):
        size = state.gpus.of_claim(claim)
        if have - size >= target:
            have -= size
            state.changes.append(WarmChange(claim, None, f"window {window.name} holds more than its {target:g} GPUs"))
    return target


def _extend(state: _Pool, held: list[NodeClaim], until: datetime, reason: str) -> None:
    """A holder's claims it keeps (those not released by this decision) are held until `until`: a window's, its
    opening's end — a claim an earlier opening launched is held on to the end of the opening that now counts it,
    written once per opening; the forecast's, `FORECAST_HOLD` from now, written each tick. A claim whose end cannot
    be read gets one."""
    ending = {c.claim.id for c in state.changes}
    for claim in held:
        current = warm_until(claim)
        if claim.id not in ending and (current is None or current < until):
            state.changes.append(WarmChange(claim, claim.warm, reason, until=until))


def _by_types(
    state: _Pool, window: ScalingWindow, warm: str, held: list[NodeClaim], until: datetime, reason: str
) -> float:
    wanted = dict(window.warm.instance_types or {})
    by_type: dict[str | None, list[NodeClaim]] = {}
    for claim in held:
        by_type.setdefault(_claim_type(claim), []).append(claim)
    target = 0.0
    for name, count in wanted.items():
        size = state.gpus.of_type(name)
        if size is None:
            state.notes.append(f"window {window.name}: instance type {name} is not in the catalog")
            continue
        target += size * count
        have = by_type.pop(name, [])
        if len(have) < count:
            state.needs.append(WarmNeed(state.pool.name, warm, instance_type=name, nodes=count - len(have),
                                        until=until, reason=reason))
        for claim in have[count:]:
            state.changes.append(WarmChange(claim, None, f"window {window.name} holds more than {count} × {name}"))
    for claims in by_type.values():
        for claim in claims:
            state.changes.append(WarmChange(claim, None, f"window {window.name} no longer asks for this type"))
    return target


def _orphans(pools: Mapping[str, _Pool], windows: Mapping[str, ScalingWindow]) -> None:
    """Window claims whose window is gone from the configuration or now belongs to another pool."""
    for state in pools.values():
        for claim in state.live:
            name = warm_window(claim.warm)
            if name is None:
                continue
            window = windows.get(name)
            if window is None:
                state.closing.append(claim)
                state.closing_reasons[claim.id] = f"window {name} is no longer configured"
            elif window.node_pool != state.pool.name:
                state.closing.append(claim)
                state.closing_reasons[claim.id] = f"window {name} now warms pool {window.node_pool}"


# Forecast


def _forecast(state: _Pool, predictive: Predictive, forecast: Forecast | None, now: datetime,
              shapes: Mapping[str, float] | None) -> None:
    gpus = state.gpus
    own = state.held(FORECAST_WARM)
    if not predictive.enabled or forecast is None or not forecast.ok or forecast.gpus is None:
        why = ("prediction is off" if not predictive.enabled or forecast is None
               else f"no forecast ({forecast.reason or forecast.status.value})")
        for claim in own:
            state.changes.append(WarmChange(claim, None, why))
        _close(state, state.closing)
        return
    until = now + FORECAST_HOLD
    closing_ids = {c.id for c in state.closing}
    supply = sum(gpus.of_claim(c) for c in state.live if c.id not in closing_ids)
    have = sum(gpus.of_claim(c) for c in own)
    current = forecast.current if forecast.current is not None else 0.0
    if shapes is not None:
        # Headroom for the pods that come, in whole pods of their classes, on top of what the pods of now ask
        # for: free room anywhere in the pool (registered nodes, claims in flight, warm nodes) is headroom
        # already, so only what it lacks is bought. (Counting the pool's other claims as busy bought a second
        # node whenever pods landed on a warm one while room stood free elsewhere.) No class coming: none held.
        # Demand beyond the pool's claims is the packer's to place, not headroom to buy here.
        shapes = whole_pods(shapes, state.pool)
        base = min(current, supply)
        arriving = sum(shapes.values())
        ceiling = base + predictive.max_warm_gpus
        target = base + min(arriving, predictive.max_warm_gpus)
        if arriving > predictive.max_warm_gpus + 1e-9:
            state.notes.append(f"pods arriving ask for {arriving:.1f} GPUs; maxWarmGpus caps the headroom at "
                               f"{predictive.max_warm_gpus}")
    else:
        ceiling = current + predictive.max_warm_gpus
        target = min(forecast.gpus, ceiling)
        if forecast.gpus > target + 1e-9:
            state.notes.append(f"forecast {forecast.gpus:.1f} GPUs; maxWarmGpus {predictive.max_warm_gpus} over "
                               f"the current {current:g} caps capacity at {target:.1f}")
    state.forecast_target = max(0.0, target - (supply - have))
    if supply >= target:
        _close(state, state.closing)
        _shed(state, own, supply - target, now)
        _extend(state, own, until, "the forecast keeps it")
        return
    _extend(state, own, until, "the forecast keeps it")
    idle = min(have, max(0.0, supply - current))
    price = sum(_price(c) for c in own) * (idle / have if have else 0.0)
    cap_price = predictive.max_warm_price_per_hour
    # Adopt closing window claims before launching anything new.
    left = []
    for claim in sorted(state.closing, key=lambda c: -gpus.of_claim(c)):
        size = gpus.of_claim(claim)
        affordable = cap_price is None or price + _price(claim) <= cap_price
        if supply < target and idle + size <= predictive.max_warm_gpus and affordable:
            supply += size
            idle += size
            price += _price(claim)
            state.changes.append(WarmChange(claim, FORECAST_WARM, f"{state.closing_reasons[claim.id]}; "
                                            f"the forecast ({forecast.gpus:.1f} GPUs) keeps it warm", until=until))
        else:
            left.append(claim)
    _close(state, left)
    shortfall = math.ceil(target - supply - 1e-9)
    if shortfall <= 0:
        return
    price_room = None if cap_price is None else cap_price - price
    if price_room is not None and price_room <= 0:
        state.notes.append(f"forecast shortfall of {shortfall} GPUs: maxWarmPricePerHour {cap_price:g} is spent")
        return
    state.needs.append(WarmNeed(
        state.pool.name, FORECAST_WARM, gpus=shortfall, gpu_room=max(0.0, ceiling - supply),
        price_room=price_room, until=until,
        reason=f"forecast {forecast.gpus:.1f} GPUs at {forecast.target.isoformat()} against {supply:g} held",
        shapes=tuple(sorted((c, g) for c, g in (shapes or {}).items() if g > 0)),
    ))


def _shed(state: _Pool, own: list[NodeClaim], surplus: float, now: datetime) -> None:
    """Release forecast claims the target no longer needs, largest first, never below the target."""
    for claim in sorted(own, key=lambda c: (-state.gpus.of_claim(c), c.created_at)):
        size = state.gpus.of_claim(claim)
        if size <= surplus + 1e-9 and now - claim.created_at >= FORECAST_MIN_HOLD:
            surplus -= size
            state.changes.append(WarmChange(claim, None, "the forecast no longer needs it"))


def _close(state: _Pool, claims: Iterable[NodeClaim]) -> None:
    for claim in claims:
        state.changes.append(WarmChange(claim, None, state.closing_reasons.get(claim.id, "window closed")))


def _price(claim: NodeClaim) -> float:
    return claim.launched_price_per_hour if claim.launched_price_per_hour is not None else claim.price_per_hour


# Summary


def _held_summary(state: _Pool) -> dict[str, float]:
    held: dict[str, float] = {}
    for claim in state.live:
        if claim.warm:
            held[claim.warm] = held.get(claim.warm, 0.0) + state.gpus.of_claim(claim)
    return held


def _summary(state: _Pool, forecast: Forecast | None, supply: float, held: dict[str, float]) -> PoolWarmth:
    launch = 0.0
    for need in state.needs:
        if need.instance_type:
            launch += (state.gpus.of_type(need.instance_type) or 0.0) * need.nodes
        else:
            launch += need.gpus
    released = sum(state.gpus.of_claim(c.claim) for c in state.changes if c.warm is None)
    return PoolWarmth(state.pool.name, dict(state.windows), forecast, state.forecast_target, supply, held,
                      launch, released, tuple(state.notes))


# Asking the packer for warm capacity


def placeholder_pods(
    need: WarmNeed,
    pool: NodePool,
    stamp: str,
    *,
    devices: Mapping[str, int] | None = None,
    exclude_types: Sequence[str] = (),
    gpus: int | None = None,
    slices_per_gpu: int | None = None,
) -> list[PendingPod]:
    """Synthetic pods standing for warm demand, so the packer finds the cheapest way to hold it.

    Each GPU-count placeholder asks for one physical GPU in the pool's terms (`nvidia.com/gpu` 1, or `replicas`
    time-sliced devices, or the MIG profile's slices of one GPU — `slices_per_gpu`, those of the pool's own GPUs
    (`mig_slices_per_gpu`), else NVIDIA's table's for the first GPU that offers the profile — named `nvidia.com/gpu`
    with the single strategy), no CPU or memory: the packer then picks the types with the lowest price per GPU. An
    instance-type placeholder asks for all of one node's GPU `devices`, named as its pool's device plugin names them
    (`fit.gpu_devices`: a MIG node's slices, not its GPUs), and selects the type by name, so each becomes one node
    of it. Every placeholder selects the pool and tolerates its taints; `exclude_types` keeps partitioned GPUs (less
    than one GPU per device) out, and unless the pool itself says which architecture its nodes have, placeholders
    ask for amd64: warm capacity is for pods not yet seen, and a GPU pod that does not select arm64 rarely runs on
    it. A forecast need with `shapes` becomes whole pods of its shape classes instead (`pod_shapes.split_gpus`: each
    asks for its class's devices, CPU and memory), so the packer picks the types those pods need. `stamp` makes the
    uids, hence the packer's claim ids, unique per decision.
    """
    count = need.gpus if gpus is None else gpus
    tolerations = tuple(Toleration(key=t.key, operator="Exists", effect=t.effect) for t in pool.taints)
    selector = {L.NODE_POOL: pool.name}
    affinity: tuple[NodeSelectorTerm, ...] = ()
    if need.instance_type:
        selector[L.INSTANCE_TYPE] = need.instance_type
        requests = {name: str(count) for name, count in devices.items()} if devices else _one_gpu(pool, slices_per_gpu)
        count = need.nodes
    elif need.shapes and count > 0:
        return _shaped(need, pool, stamp, count, tolerations, selector, exclude_types)
    else:
        requests = _one_gpu(pool, slices_per_gpu)
        affinity = _placeholder_affinity(pool, exclude_types)
    holder = need.warm.replace(":", "-").replace("/", "-")
    return [
        PendingPod(
            uid=f"warm-{pool.name}-{holder}-{stamp}-{i}",
            namespace="gpu-autoscaler-warm",
            name=f"{holder}-{i}",
            requests=requests,
            node_selector=selector,
            required_node_affinity=affinity,
            tolerations=tolerations,
        )
        for i in range(count)
    ]


def _placeholder_affinity(pool: NodePool, exclude_types: Sequence[str]) -> tuple[NodeSelectorTerm, ...]:
    expressions = []
    if exclude_types:
        expressions.append(Requirement(key=L.INSTANCE_TYPE, operator="NotIn", values=tuple(sorted(exclude_types))))
    if not any(r.key == L.ARCH for r in pool.requirements):
        expressions.append(Requirement(key=L.ARCH, operator="In", values=("amd64",)))
    return (NodeSelectorTerm(match_expressions=tuple(expressions)),) if expressions else ()


def _shaped(need: WarmNeed, pool: NodePool, stamp: str, gpus: int, tolerations: tuple[Toleration, ...],
            selector: dict[str, str], exclude_types: Sequence[str]) -> list[PendingPod]:
    affinity = _placeholder_affinity(pool, exclude_types)
    holder = need.warm.replace(":", "-").replace("/", "-")
    pods: list[PendingPod] = []
    for cls, count in split_gpus(gpus, need.shapes, pool):
        requests = placeholder_requests(cls, pool)
        pods.extend(
            PendingPod(uid=f"warm-{pool.name}-{holder}-{stamp}-{cls}-{i}", namespace="gpu-autoscaler-warm",
                       name=f"{holder}-{cls}-{i}", requests=requests, node_selector=selector,
                       required_node_affinity=affinity, tolerations=tolerations)
            for i in range(count)
        )
    return pods


def mig_slices_per_gpu(pool: NodePool, instance_types: Iterable[InstanceType]) -> int | None:
    """Slices of a MIG pool's profile one GPU of the pool's own types gives: `1g.10gb` is four of an A100 40 GB and
    seven of an H100, so NVIDIA's table alone cannot say. Types are the pool's by its requirements on a node's
    labels but the zone and capacity type (`type_allowed`). Where its types differ, the fewest: a target a tick
    leaves short is made up on the next (warm capacity is counted in the claims' GPUs), while GPUs bought beyond
    it are held until released. None when no type of the pool offers the profile."""
    sharing = pool.gpu_sharing
    if sharing.mode != "mig" or not sharing.mig_profile:
        return None
    counts = [slices // int(t.gpus) for t in instance_types
              if t.gpus >= 1 and type_allowed(pool, t) and (slices := mig_slices(t, sharing.mig_profile))]
    return min(counts, default=None)


def _one_gpu(pool: NodePool, slices_per_gpu: int | None = None) -> dict[str, str]:
    sharing = pool.gpu_sharing
    if sharing.mode == "mig" and sharing.mig_profile:
        first = first_offering(sharing.mig_profile)
        per_gpu = slices_per_gpu or (first.profiles[sharing.mig_profile] if first is not None else 1)
        return {(GPU if sharing.mig_strategy == "single" else mig_resource(sharing.mig_profile)): str(per_gpu)}
    return {GPU: str(sharing.replicas)}


def largest_within_budget(
    need: WarmNeed,
    plan: Callable[[int], Sequence[NodeClaim]],
    gpus: GpuCapacity,
) -> list[NodeClaim]:
    """The claims for the most GPUs, up to `need.gpus`, whose GPUs and price fit the need's budget.

    `plan(n)` asks the packer for n GPUs. Claims are whole nodes, so n GPUs may come as more (an 8-GPU
    type for 6); the budget judges what is really bought. More GPUs never cost less to hold, so the
    largest n that fits is found by bisection: log2(n) packer calls at most beyond the first.
    """
    def fits(claims: Sequence[NodeClaim]) -> bool:
        held = sum(gpus.of_claim(c) for c in claims)
        price = sum(_price(c) for c in claims)
        return (need.gpu_room is None or held <= need.gpu_room + 1e-9) and (
            need.price_room is None or price <= need.price_room + 1e-9
        )

    claims = list(plan(need.gpus))
    if fits(claims) or need.gpus <= 1:
        return claims if fits(claims) else []
    low, high, best = 0, need.gpus, []
    while high - low > 1:
        middle = (low + high) // 2
        attempt = list(plan(middle))
        if fits(attempt):
            low, best = middle, attempt
        else:
            high = middle
    return best

"""Where every dollar of a run goes: each instance's cost split, as it accrues, into parts that add up to it.

An instance costs its price from launch to termination. Between two changes to it (a pod starts or stops,
it becomes Ready, a Spot warning comes, pre-warm takes or lets go of it) its state is constant, so the
interval's cost is split exactly by that state:

- booting: launch until the node is Ready — GPUs billed before anything can run on them;
- the pods' own work, each pod's GPU share at the cheapest USD per GPU-second that could hold it (`p*`, the
  lower bound's price: summed over a run this *is* the lower bound, since a pod accrues only while it runs);
- node overhead: the bound prices a pod on raw capacity, but kubelet and system reservations come off every
  node; `share × (p_alloc − p*)`, where `p_alloc` is the cheapest per GPU-second of a type whose *allocatable*
  holds the pod in the pool it runs in, is what no policy avoids (all run on the same nodes);
- price premium: what the pods' share of the node costs above that (`share × (price per GPU − p_alloc)`): a
  dearer type than the cheapest per GPU that could hold them, chosen to pack several pods, by capacity or Spot
  availability, a pool's requirements or a gang's single type;
- fragmentation: the unallocated GPUs of a node that runs pods;
- warm idle: an empty node that pre-warm holds (a window or the forecast);
- consolidation lag: an empty node nobody holds, kept until consolidation removes it;
- Spot interruption: a node under a Spot warning, less its pods' own work — capacity already lost.

A run that keeps the ledger gets the parts measured, not inferred: `other` (total cost less the parts) is
floating-point dust unless an instance accrues outside the ledger, and the report shows it so that can be seen.

The parts are kept per node pool as well (`PoolCost`), with each pool's instance types: a deployment's pools are
its own choices (a pool weighted first, a family left out), and what each of them costs is the first thing to
know before comparing policies on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpu_autoscaler.simulation.cloud import SimulatedInstance

__all__ = ["COST_PARTS", "CostLedger", "PoolCost", "TypeCost", "pool_costs"]

COST_PARTS = {
    "lowerBound": "the pods' GPU share × seconds run at the cheapest USD per GPU-second that could hold each",
    "booting": "instances from launch until their node is Ready",
    "warmIdle": "empty nodes held by pre-warm (a scaling window or the forecast)",
    "fragmentation": "GPUs left unallocated on nodes running pods",
    "nodeOverhead": "the pods' share priced up from the bound's raw capacity to the cheapest type whose allocatable "
                    "(less kubelet and system reservations) holds them",
    "pricePremium": "the pods' share of their node above the cheapest per-GPU price whose allocatable holds them",
    "consolidationLag": "empty nodes no one holds, until consolidation removes them",
    "spotInterruption": "nodes under a Spot interruption warning, less their pods' own work",
}
"""The parts of a run's cost, in the order they are reported: the bound, then each kind of waste."""


@dataclass
class _Instance:
    price_per_second: float
    gpus: float
    since: float
    parts: dict[str, float]
    """Its pool's parts, which it accrues into."""
    ready: bool = False
    noticed: bool = False
    warm: bool = False
    pods: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """Pod key → (GPU share, the bound's USD per GPU-second for it, the same on allocatable; 0 if none)."""


class CostLedger:
    """Accrues each instance's cost into `COST_PARTS` of its pool at every change of its state. Times are seconds."""

    def __init__(self) -> None:
        self._pools: dict[str, dict[str, float]] = {}
        self._instances: dict[str, _Instance] = {}
        self._pod_instance: dict[str, str] = {}

    def launched(self, instance_id: str, at: float, price_per_hour: float, gpus: float, *, pool: str) -> None:
        parts = self._pools.get(pool)
        if parts is None:
            parts = self._pools[pool] = dict.fromkeys(COST_PARTS, 0.0)
        self._instances[instance_id] = _Instance(price_per_hour / 3600, gpus, at, parts)

    def ready(self, instance_id: str, at: float) -> None:
        self._change(instance_id, at, ready=True)

    def noticed(self, instance_id: str, at: float) -> None:
        self._change(instance_id, at, noticed=True)

    def warm(self, instance_id: str, at: float, held: bool) -> None:
        found = self._instances.get(instance_id)
        if found is not None and found.warm != held:
            self._change(instance_id, at, warm=held)

    def pod_started(self, instance_id: str, pod: str, at: float, share: float, bound_per_gpu_second: float | None,
                    allocatable_per_gpu_second: float | None = None) -> None:
        """`bound_per_gpu_second`: the lower bound's price for the pod (None: no type holds it);
        `allocatable_per_gpu_second`: the cheapest whose allocatable holds it where it runs (None: the same)."""
        found = self._accrue(instance_id, at)
        if found is None:
            return
        bound = bound_per_gpu_second or 0.0
        on_allocatable = bound if allocatable_per_gpu_second is None else max(bound, allocatable_per_gpu_second)
        found.pods[pod] = (share, bound, on_allocatable)
        self._pod_instance[pod] = instance_id

    def pod_stopped(self, pod: str, at: float) -> None:
        instance_id = self._pod_instance.pop(pod, None)
        if instance_id is None:
            return
        found = self._accrue(instance_id, at)
        if found is not None:
            found.pods.pop(pod, None)

    def terminated(self, instance_id: str, at: float) -> None:
        if self._accrue(instance_id, at) is None:
            return
        for pod in self._instances.pop(instance_id).pods:
            self._pod_instance.pop(pod, None)

    def close(self, at: float) -> None:
        """The run ends: every instance still up is terminated now."""
        for instance_id in list(self._instances):
            self.terminated(instance_id, at)

    def breakdown(self, total: float) -> dict[str, float]:
        """The parts, then `other`: `total` less the parts (dust, unless something accrued outside the ledger)."""
        out = {part: sum(parts[part] for parts in self._pools.values()) for part in COST_PARTS}
        out["other"] = total - sum(out.values())
        return out

    def by_pool(self) -> dict[str, dict[str, float]]:
        """Each pool's parts (copies), pools in the order their first instance was launched."""
        return {pool: dict(parts) for pool, parts in self._pools.items()}

    def instance_ids(self) -> list[str]:
        return list(self._instances)

    def _change(self, instance_id: str, at: float, **state: bool) -> None:
        found = self._accrue(instance_id, at)
        if found is not None:
            for key, value in state.items():
                setattr(found, key, value)

    def _accrue(self, instance_id: str, at: float) -> _Instance | None:
        found = self._instances.get(instance_id)
        if found is None:
            return None
        seconds = at - found.since
        if seconds > 0:
            self._split(found, found.price_per_second * seconds, seconds)
        found.since = max(found.since, at)
        return found

    def _split(self, instance: _Instance, cost: float, seconds: float) -> None:
        parts = instance.parts
        if not instance.ready:
            parts["booting"] += cost
            return
        work = sum(share * bound for share, bound, _ in instance.pods.values()) * seconds
        parts["lowerBound"] += work
        if instance.noticed:
            parts["spotInterruption"] += cost - work
            return
        overhead = sum(share * (on_allocatable - bound) for share, bound, on_allocatable in instance.pods.values())
        parts["nodeOverhead"] += overhead * seconds
        allocated = min(sum(share for share, _, _ in instance.pods.values()), instance.gpus)
        used = cost * allocated / instance.gpus if instance.gpus > 0 else cost
        parts["pricePremium"] += used - work - overhead * seconds
        idle = cost - used
        if instance.pods:
            parts["fragmentation"] += idle
        elif instance.warm:
            parts["warmIdle"] += idle
        else:
            parts["consolidationLag"] += idle


@dataclass
class TypeCost:
    """One instance type and capacity type of a pool: its instances' cost, count and hours up."""

    cost: float = 0.0
    nodes: int = 0
    hours: float = 0.0


@dataclass
class PoolCost:
    """One node pool's share of a run: its parts (as `CostLedger.breakdown`'s) and its instance types."""

    parts: dict[str, float]
    types: dict[tuple[str, str], TypeCost] = field(default_factory=dict)
    """(instance type, capacity type) → what its instances cost."""

    @property
    def cost(self) -> float:
        return sum(t.cost for t in self.types.values())

    @property
    def nodes(self) -> int:
        return sum(t.nodes for t in self.types.values())

    def breakdown(self) -> dict[str, float]:
        """The parts, then `other`: the pool's cost less them."""
        return {**self.parts, "other": self.cost - sum(self.parts.values())}

    def to_json(self) -> dict[str, Any]:
        return {
            "cost": round(self.cost, 2),
            "nodesLaunched": self.nodes,
            "costBreakdown": {part: round(usd, 2) for part, usd in self.breakdown().items()},
            "instanceTypes": [
                {"instanceType": name, "capacityType": capacity, "cost": round(t.cost, 2), "nodesLaunched": t.nodes,
                 "hours": round(t.hours, 2)}
                for (name, capacity), t in sorted(self.types.items(), key=lambda kv: (-kv[1].cost, kv[0]))
            ],
        }


def pool_costs(instances: Iterable[SimulatedInstance], until: float,
               parts: Mapping[str, dict[str, float]]) -> dict[str, PoolCost]:
    """Each pool's cost, costliest pool first: its instances (up until `until` unless terminated) and `parts`, the
    ledger's split of them (`CostLedger.by_pool`)."""
    pools: dict[str, PoolCost] = {}
    for instance in instances:
        pool = pools.get(instance.pool)
        if pool is None:
            pool = pools[instance.pool] = PoolCost(parts.get(instance.pool) or dict.fromkeys(COST_PARTS, 0.0))
        kind = pool.types.setdefault((instance.instance_type.name, instance.capacity_type), TypeCost())
        kind.cost += instance.cost(until)
        kind.nodes += 1
        kind.hours += instance.seconds_up(until) / 3600
    return dict(sorted(pools.items(), key=lambda kv: (-kv[1].cost, kv[0])))

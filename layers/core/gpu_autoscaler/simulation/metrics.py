"""What a run measures, and the clairvoyant lower bound it is compared with.

- Cost: every instance from launch to termination at its offering's price.
- Lower bound: each pod's GPU-seconds as it ran (its GPU share — `num_gpu × gpu_milli / 1000` — times the
  seconds it ran) at the cheapest per-GPU-second price of any offering that could hold it (its CPU, memory
  and GPU devices within the instance's, its GPU model and x86-64 allowed, in the configured zones). Every
  node of every policy is such an offering for each pod on it, its pods' shares never add up to more than
  its GPUs (time-slicing hands out whole slices, never less than a pod's share), and it runs at least while
  they do — so no policy can cost less: the bound is below every policy's cost by construction.
- GPU allocation: the trace's GPU-hours of the pods running ÷ GPU-hours of the instances provisioned.
- Waits: per pod that ran, its seconds pending (every time it was, an interruption's too) before running.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_autoscaler.domain.packing.fit import allocatable, fits

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    from gpu_autoscaler.config import NodePool, Overhead
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.simulation.costs import PoolCost
    from gpu_autoscaler.simulation.trace import TracePod

__all__ = ["GpuPrices", "RunResult", "Timeline", "holds", "percentile"]


class GpuPrices:
    """The cheapest USD per GPU-second of an offering that can hold a pod, per pod shape."""

    def __init__(self, catalog: Catalog, zones: Collection[str]) -> None:
        self.types: list[tuple[InstanceType, float]] = []
        """The x86-64 GPU types offered in `zones`, each with its cheapest USD per GPU-second there."""
        for t in catalog.gpu_types():
            if t.architecture != "x86_64" or t.gpus <= 0:
                continue
            prices = [o.price_per_hour for o in catalog.offerings_for(t.name) if o.zone in zones]
            if prices:
                self.types.append((t, min(prices) / t.gpus / 3600))
        self._cache: dict[tuple[object, ...], float | None] = {}
        self._allocatable_cache: dict[tuple[object, ...], float | None] = {}

    def per_gpu_second_allocatable(self, pod: TracePod, requests: Mapping[str, int], pool: NodePool,
                                   overhead: Overhead) -> float | None:
        """The same, on what a node of each type in `pool` offers pods (its allocatable, reservations off) for
        the pod's requests as shaped for that pool: the cost decomposition's node overhead."""
        key = (pod.cpu_milli, pod.memory_mib, pod.gpus, pod.gpu_milli, pod.gpu_names, pool.name)
        if key not in self._allocatable_cache:
            fitting = [
                price for t, price in self.types
                if (not pod.gpu_names or (t.gpu_model or "").lower() in pod.gpu_names)
                and fits(requests, allocatable(t, pool, overhead).as_dict())
            ]
            self._allocatable_cache[key] = min(fitting) if fitting else None
        return self._allocatable_cache[key]

    def per_gpu_second(self, pod: TracePod) -> float | None:
        key = (pod.cpu_milli, pod.memory_mib, pod.gpus, pod.gpu_names)
        if key not in self._cache:
            fitting = [price for t, price in self.types if holds(t, pod)]
            self._cache[key] = min(fitting) if fitting else None
        return self._cache[key]


def holds(instance_type: InstanceType, pod: TracePod) -> bool:
    """The bound's test of whether a type could hold a pod: raw capacity (CPU, memory, GPU devices) and the
    pod's GPU model, before any pool's requirements or any node's reservations."""
    t = instance_type
    return (t.vcpu * 1000 >= pod.cpu_milli and t.memory_mib >= pod.memory_mib and t.gpu_devices >= pod.gpus
            and (not pod.gpu_names or (t.gpu_model or "").lower() in pod.gpu_names))


@dataclass
class Timeline:
    """Step functions of the run, one point per change: provisioned and requested GPUs, USD/h."""

    times: list[float] = field(default_factory=list)
    provisioned: list[float] = field(default_factory=list)
    requested: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)

    def record(self, at: float, provisioned: float, requested: float, rate: float) -> None:
        if self.times and self.times[-1] == at:
            self.provisioned[-1], self.requested[-1], self.rate[-1] = provisioned, requested, rate
            return
        if self.times and self.provisioned[-1] == provisioned and self.requested[-1] == requested \
                and self.rate[-1] == rate:
            return
        self.times.append(at)
        self.provisioned.append(provisioned)
        self.requested.append(requested)
        self.rate.append(rate)

    def cumulative_cost(self) -> np.ndarray:
        """USD spent by each point's time."""
        times = np.asarray(self.times)
        rates = np.asarray(self.rate)
        if times.size == 0:
            return times
        spent = np.concatenate([[0.0], np.cumsum(rates[:-1] * np.diff(times) / 3600)])
        return spent


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, float), q)) if len(values) else 0.0


@dataclass
class RunResult:
    """One policy's run, summarised."""

    name: str
    cost: float
    lower_bound: float
    gpu_hours_provisioned: float
    gpu_hours_allocated: float
    waits: list[float]
    interruptions: int
    never_ran: dict[str, int]
    """Pods the trace ran that never started here, by reason."""
    cancelled: dict[str, int]
    """Pods the trace itself deleted while pending (never ran there) that never started here either, by reason."""
    pods_ran: int
    pods: int
    nodes_launched: int
    spot_share: float
    """Share of the cost spent on Spot."""
    capacity_errors: int
    launch_failures: int
    consolidations: int
    evictions: int
    end: float
    seconds: float
    timeline: Timeline
    policy: dict[str, Any] = field(default_factory=dict)
    cost_breakdown: dict[str, float] = field(default_factory=dict)
    """The cost split into `costs.COST_PARTS` plus `other`, adding up to `cost`."""
    cost_by_pool: dict[str, PoolCost] = field(default_factory=dict)
    """Each node pool's cost, split the same way, with its instance types; costliest first."""

    @property
    def gpu_allocation(self) -> float:
        return self.gpu_hours_allocated / self.gpu_hours_provisioned if self.gpu_hours_provisioned > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        ratio = self.cost / self.lower_bound if self.lower_bound > 0 else math.inf
        return {
            "name": self.name,
            "cost": round(self.cost, 2),
            "lowerBound": round(self.lower_bound, 2),
            "costToLowerBound": round(ratio, 3) if math.isfinite(ratio) else None,
            "gpuAllocation": round(self.gpu_allocation, 4),
            "waitP50": round(percentile(self.waits, 50), 1),
            "waitP95": round(percentile(self.waits, 95), 1),
            "waitP99": round(percentile(self.waits, 99), 1),
            "interruptions": self.interruptions,
            "neverRan": {"count": sum(self.never_ran.values()), "reasons": dict(sorted(
                self.never_ran.items(), key=lambda kv: (-kv[1], kv[0])))},
            "cancelledWhilePending": {"count": sum(self.cancelled.values()), "reasons": dict(sorted(
                self.cancelled.items(), key=lambda kv: (-kv[1], kv[0])))},
            "podsRan": self.pods_ran,
            "pods": self.pods,
            "gpuHoursProvisioned": round(self.gpu_hours_provisioned, 2),
            "gpuHoursAllocated": round(self.gpu_hours_allocated, 2),
            "nodesLaunched": self.nodes_launched,
            "spotCostShare": round(self.spot_share, 4),
            "insufficientCapacityErrors": self.capacity_errors,
            "launchFailures": self.launch_failures,
            "consolidations": self.consolidations,
            "evictions": self.evictions,
            "simulatedDays": round(self.end / 86400, 3),
            "runSeconds": round(self.seconds, 2),
            "costBreakdown": {part: round(usd, 2) for part, usd in self.cost_breakdown.items()},
            "costByPool": {pool: cost.to_json() for pool, cost in self.cost_by_pool.items()},
            "policy": self.policy,
        }

"""The policies a simulation compares, and how a trace pod looks to each of them.

Every policy runs the same pipeline (packer, fleet, interruptions, drains, consolidation, pre-warm); what
differs is the configuration it runs with and the packing method:

- `ours`: the given configuration, as the Lambdas would run it.
- `ours-no-prediction`: the same with `predictive.enabled` off (scaling windows stay: they are schedule,
  not prediction).
- `karpenter-like`: Karpenter's scheduler — first-fit decreasing by CPU then memory, the cheapest type that fits
  each node (`domain.packing.baseline`) — over the same pools, with no GPU sharing (every pod takes whole GPUs),
  no scaling windows and no prediction; an empty node goes once `consolidateAfter` has passed
  (`emptyKeepLeadTimes` 0: Karpenter has no such wait), every node with pods is weighed for consolidation
  (`underutilizedBelow` null: Karpenter has no utilization threshold), and a new node is the cheapest type for the
  pods at hand (`spareRoomWorth` 0: Karpenter buys no room for pods to come). Consolidation is Karpenter's: a
  node, or a group of nodes, goes only if its pods fit on the other nodes plus at most one new node
  (`max_replacements` 1: `computeConsolidation` in kubernetes-sigs/karpenter
  pkg/controllers/disruption/consolidation.go rejects a candidate set whose pods need more than one new NodeClaim,
  "Can't remove without creating N candidates"), strictly cheaper than what it replaces; spot is replaced by spot
  only with the pool's `disruption.spotToSpot` (Karpenter's `SpotToSpotConsolidation` feature gate, off by
  default) and, for one node, 15 cheaper types. Our own policies may replace a node by several smaller ones.
- `karpenter-overlay`: karpenter-like with the pools' GPU sharing kept, as Karpenter runs when a NodeOverlay
  (alpha, `karpenter.sh/v1alpha1`) advertises the time-sliced `nvidia.com/gpu` replicas a type's device plugin
  will offer: the fair baseline wherever pods share GPUs, so in the default set when they would
  (`default_policies`).
- `fixed-node-group`: a Cluster-Autoscaler node group: one instance type, On-Demand, first-fit packing, no
  sharing, no windows, no prediction, empty or underused nodes removed after 10 minutes (CA's
  `scale-down-unneeded-time`; `emptyKeepLeadTimes` 0), a node with pods only while they request under half its
  GPUs (CA's `scale-down-gpu-utilization-threshold`, 0.5: `underutilizedBelow`'s default; `intoSunkRoom` off).
  The type is given, or the cheapest per GPU among those that hold at least 99 % of the trace's GPU pods
  (`choose_fixed_type`).

How a trace pod asks for a GPU depends on the configuration, as it would in a real cluster: a whole-GPU
pod asks for `nvidia.com/gpu: n` and tolerates the taints of the pools without sharing; a fractional pod
(one GPU, `gpu_milli` < 1000) goes to the first time-slicing pool, if there is one, asking for
⌈milli × replicas / 1000⌉ of its time-sliced devices (never less than its share); without one it takes a
whole GPU. Pods are x86-64 containers (`kubernetes.io/arch: amd64`) and carry the trace's GPU-model
constraint as a node affinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.domain.packing.baseline import first_fit_decreasing
from gpu_autoscaler.domain.packing.binpack import pack
from gpu_autoscaler.domain.packing.fit import allocatable, fits, pod_requests
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.pods import PendingPod, PodGroup
from gpu_autoscaler.models.requirements import NodeSelectorTerm, Requirement
from gpu_autoscaler.models.resources import GPU
from gpu_autoscaler.models.taints import Toleration

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpu_autoscaler.config import Config, NodePool
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.domain.packing.solver import Packer
    from gpu_autoscaler.models.taints import Taint
    from gpu_autoscaler.simulation.trace import TracePod

__all__ = ["FIXED_COVERAGE", "FIXED_POOL", "KNOWN_POLICIES", "OPTIONAL_POLICIES", "POLICY_NAMES", "Policy",
           "PodShaper", "build_policy", "choose_fixed_type", "default_policies"]

PolicyName = Literal["ours", "ours-no-prediction", "karpenter-like", "fixed-node-group", "karpenter-overlay"]
POLICY_NAMES: tuple[PolicyName, ...] = ("ours", "ours-no-prediction", "karpenter-like", "fixed-node-group")
"""The four every run compares by default (`default_policies` adds karpenter-overlay where pods share GPUs)."""
OPTIONAL_POLICIES: tuple[PolicyName, ...] = ("karpenter-overlay",)
"""Beyond the four: run by name (`--policy`), or where `default_policies` says the run needs it."""
KNOWN_POLICIES: tuple[PolicyName, ...] = POLICY_NAMES + OPTIONAL_POLICIES
FIXED_POOL = "node-group"
FIXED_COVERAGE = 0.99
"""Share of the trace's GPU pods the fixed node group's type must hold."""
_NAMESPACE = "trace"


@dataclass(frozen=True)
class Policy:
    name: str
    config: Config
    packer: Packer
    description: str
    instance_type: str | None = None
    """The node group's one type (`fixed-node-group`)."""
    max_replacements: int | None = None
    """Consolidation's bound on new nodes per decision (`consolidate`'s; 1 for the karpenter-like policies)."""

    @property
    def prewarm(self) -> bool:
        return bool(self.config.scaling_windows) or self.config.predictive.enabled

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "description": self.description,
                               "packer": "first-fit-decreasing" if self.packer is first_fit_decreasing else "binpack",
                               "nodePools": [p.name for p in self.config.node_pools],
                               "scalingWindows": [w.name for w in self.config.scaling_windows],
                               "predictive": self.config.predictive.enabled}
        if self.instance_type:
            out["instanceType"] = self.instance_type
        if self.max_replacements is not None:
            out["maxReplacements"] = self.max_replacements
        return out


def default_policies(config: Config, pods: Sequence[TracePod]) -> tuple[PolicyName, ...]:
    """The four, and karpenter-overlay when a pool time-slices GPUs and a pod asks for part of one. There Karpenter
    would share GPUs too, given a NodeOverlay, so karpenter-like alone — a whole GPU for every fraction — would
    flatter ours; a report that leaves the fair baseline out must be asked for so (`--policy`)."""
    if PodShaper(config).shared is not None and any(pod.fractional for pod in pods):
        return (*POLICY_NAMES, "karpenter-overlay")
    return POLICY_NAMES


def build_policy(name: str, base: Config, catalog: Catalog, pods: Sequence[TracePod],
                 fixed_type: str | None = None) -> Policy:
    """One policy's configuration and packer, derived from the given configuration."""
    data = base.model_dump(by_alias=True, mode="json", exclude_none=True)
    if name == "ours":
        return Policy(name, base, pack, "the given configuration")
    if name == "ours-no-prediction":
        data["predictive"] = {**data.get("predictive", {}), "enabled": False}
        return Policy(name, parse_config(data), pack, "the given configuration with predictive pre-warm off")
    if name in ("karpenter-like", "karpenter-overlay"):
        overlay = name == "karpenter-overlay"
        for pool in data["nodePools"]:
            # Karpenter removes an empty node once consolidateAfter has passed.
            pool.setdefault("disruption", {})["emptyKeepLeadTimes"] = 0
            # Karpenter launches the cheapest type that holds a node's pods, with no regard for pods to come.
            pool["spareRoomWorth"] = 0
            # Karpenter weighs every node with pods for consolidation, however much of it they use.
            pool["disruption"]["underutilizedBelow"] = None
            if not overlay:
                pool["gpuSharing"] = {"mode": "none"}
        data["scalingWindows"] = []
        data["predictive"] = {**data.get("predictive", {}), "enabled": False}
        sharing = "with the pools' GPU sharing advertised by a NodeOverlay" if overlay else "without GPU sharing"
        return Policy(name, parse_config(data), first_fit_decreasing,
                      f"first-fit decreasing (CPU, then memory), cheapest fitting type; the same pools {sharing}, "
                      "no windows or prediction; consolidation launches at most one node per decision",
                      max_replacements=1)
    if name == "fixed-node-group":
        chosen = fixed_type or choose_fixed_type(base, catalog, pods)
        if chosen not in catalog:
            raise ValueError(f"fixed-node-group: instance type '{chosen}' is not in the catalog")
        data["nodePools"] = [{
            "name": FIXED_POOL,
            "capacityTypes": ["on-demand"],
            "requirements": [{"key": L.INSTANCE_TYPE, "operator": "In", "values": [chosen]}],
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "10m",
                           "emptyKeepLeadTimes": 0, "intoSunkRoom": False},
        }]
        data["scalingWindows"] = []
        data["predictive"] = {**data.get("predictive", {}), "enabled": False}
        return Policy(name, parse_config(data), first_fit_decreasing,
                      f"one node group of {chosen} (On-Demand), first-fit, scale-down after 10 min", chosen)
    raise ValueError(f"unknown policy '{name}'; known: {', '.join(KNOWN_POLICIES)}")


def choose_fixed_type(base: Config, catalog: Catalog, pods: Sequence[TracePod]) -> str:
    """The node group a person would pick for the trace: among the On-Demand x86-64 GPU types on which at least
    `FIXED_COVERAGE` of the trace's GPU pods fit (as whole-GPU pods), the cheapest per GPU; if none covers that
    many, the one covering the most. Pods that fit no node of it never run, and the report says so."""
    zones = set(base.zones)
    probe = parse_config({**base.model_dump(by_alias=True, mode="json", exclude_none=True),
                          "nodePools": [{"name": FIXED_POOL}], "scalingWindows": []})
    pool = probe.node_pools[0]
    shaper = PodShaper(probe)
    shapes: dict[tuple[object, ...], tuple[dict[str, int], tuple[str, ...], int]] = {}
    for pod in pods:
        key = (pod.cpu_milli, pod.memory_mib, pod.gpus, pod.gpu_names)
        found = shapes.get(key)
        shapes[key] = (found[0], found[1], found[2] + 1) if found else (
            pod_requests(shaper.pending(pod)).as_dict(), pod.gpu_names, 1)
    ranked: list[tuple[bool, float, int, str]] = []
    for t in catalog.gpu_types():
        prices = [o.price_per_hour for o in catalog.offerings_for(t.name)
                  if o.capacity_type == "on-demand" and o.zone in zones]
        if not prices or t.architecture != "x86_64" or t.gpus < t.gpu_devices:
            continue
        room = allocatable(t, pool, probe.overhead)
        name = (t.gpu_model or "").lower()
        count = sum(n for req, names, n in shapes.values() if fits(req, room) and (not names or name in names))
        covers = count >= FIXED_COVERAGE * len(pods)
        ranked.append((not covers, min(prices) / t.gpus if covers else -count, count, t.name))
    if not ranked:
        raise ValueError("fixed-node-group: no On-Demand x86-64 GPU type in the catalog")
    return min(ranked)[3]


class PodShaper:
    """A trace pod as a pending pod of one configuration (see the module's rules)."""

    def __init__(self, config: Config) -> None:
        pools = sorted(config.node_pools, key=lambda p: (-p.weight, p.name))
        self.shared: NodePool | None = next((p for p in pools if p.gpu_sharing.mode == "time-slicing"), None)
        whole = [p for p in pools if p.gpu_sharing.mode == "none"]
        self.whole_tolerations = _tolerations([t for p in whole for t in p.taints])
        self.not_whole = tuple(sorted(p.name for p in pools if p.gpu_sharing.mode != "none"))
        self.shared_tolerations = _tolerations(self.shared.taints) if self.shared else ()

    def pending(self, pod: TracePod) -> PendingPod:
        expressions = [Requirement(key=L.ARCH, operator="In", values=("amd64",))]
        if pod.gpu_names:
            expressions.append(Requirement(key=L.INSTANCE_GPU_NAME, operator="In", values=pod.gpu_names))
        selector: dict[str, str] = {}
        if pod.fractional and self.shared is not None:
            replicas = self.shared.gpu_sharing.replicas
            devices = max(1, math.ceil(pod.gpu_milli * replicas / 1000))
            selector[L.NODE_POOL] = self.shared.name
            tolerations = self.shared_tolerations
        else:
            devices = pod.gpus
            tolerations = self.whole_tolerations
            if self.not_whole:
                expressions.append(Requirement(key=L.NODE_POOL, operator="NotIn", values=self.not_whole))
        return PendingPod(
            uid=f"{pod.name}-{pod.index}",
            namespace=_NAMESPACE,
            name=pod.name,
            requests={"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi", GPU: str(devices)},
            node_selector=selector,
            required_node_affinity=(NodeSelectorTerm(match_expressions=tuple(expressions)),),
            tolerations=tolerations,
            pod_group=PodGroup(name=pod.gang, min_member=pod.gang_size) if pod.gang else None,
        )


def _tolerations(taints: Sequence[Taint]) -> tuple[Toleration, ...]:
    out: dict[tuple[str, str], Toleration] = {}
    for taint in taints:
        if taint.effect != "PreferNoSchedule":
            out.setdefault((taint.key, taint.effect), Toleration(key=taint.key, operator="Exists", effect=taint.effect))
    return tuple(out.values())

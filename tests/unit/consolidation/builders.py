"""Builders for consolidation tests: a cluster of our nodes (Node + registered claim) and the pods on them.

The catalog, pools and solver are the packing tests' (`tests.unit.packing.builders`); `wide_spot_catalog`
adds twenty single-GPU spot types for the spot-to-spot rule.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.catalog import Catalog
from gpu_autoscaler.domain.consolidation import (
    ConsolidationNode,
    ConsolidationResult,
    consolidate,
    node_pods,
    protected_daemons,
)
from gpu_autoscaler.domain.packing import Solver
from gpu_autoscaler.models.catalog import InstanceType, Offering
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint, Toleration
from tests.unit.packing.builders import GPU_TAINT, NOW, make_catalog, make_config, make_pool, make_type

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config

__all__ = [
    "NOW",
    "Cluster",
    "make_config",
    "make_pool",
    "pool_config",
    "wide_spot_catalog",
]

TAINT = Taint(**GPU_TAINT)
TOLERATION = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
_serial = itertools.count(1)


def pool_config(**disruption: Any) -> Config:
    """One pool `gpu` (spot and on-demand, GPU taint) with the given `disruption` settings; budgets 100% and every
    node with pods weighed (`underutilizedBelow` None) unless given, so a test sees every decision."""
    settings: dict[str, Any] = {"budgets": [{"nodes": "100%"}], "underutilizedBelow": None, **disruption}
    return make_config(make_pool(disruption=settings))


def wide_spot_catalog(cheap_types: int = 20) -> Catalog:
    """The packing catalog plus `cheap_types` one-GPU spot types, each cheaper than a g5.12xlarge on spot."""
    types = [make_type(n) for n in ("g5.xlarge", "g5.12xlarge", "g5.48xlarge")]
    offerings = list(make_catalog(("g5.xlarge", "g5.12xlarge", "g5.48xlarge")).all_offerings())
    for i in range(cheap_types):
        name = f"g9.x{i}large"
        types.append(InstanceType(name=name, vcpu=8, memory_mib=32768, gpus=1, gpu_devices=1, gpu_model="L4",
                                  gpu_manufacturer="NVIDIA", gpu_memory_mib=24576, max_pods=58))
        for zone in ("us-east-1a", "us-east-1b"):
            offerings.append(Offering(instance_type=name, zone=zone, capacity_type="spot",
                                      price_per_hour=round(0.30 + 0.01 * i, 4), interruption_band=1))
            offerings.append(Offering(instance_type=name, zone=zone, capacity_type="on-demand",
                                      price_per_hour=round(0.90 + 0.01 * i, 4)))
    return Catalog(types, offerings)


@dataclass
class Cluster:
    """Nodes of ours (each a Node and its Registered claim) and pods, built up by a test."""

    config: Config
    catalog: Catalog = field(default_factory=make_catalog)
    clock: FixedClock = field(default_factory=lambda: FixedClock(NOW))
    nodes: list[ClusterNode] = field(default_factory=list)
    claims: dict[str, NodeClaim] = field(default_factory=dict)
    """Node name → its claim."""
    pods: list[ClusterPod] = field(default_factory=list)
    blocked: set[str] = field(default_factory=set)
    empty_since: dict[str, Any] = field(default_factory=dict)
    pods_changed: dict[str, Any] = field(default_factory=dict)
    """Node name → its last pod event (none given: unknown, its creation counts)."""

    def node(self, instance_type: str = "g5.12xlarge", *, capacity_type: str = "on-demand",
             zone: str = "us-east-1a", age: timedelta = timedelta(hours=2), pool: str = "gpu",
             empty_for: timedelta | None = timedelta(hours=1), node_annotations: dict[str, str] | None = None,
             **claim: Any) -> str:
        n = next(_serial)
        name = f"ip-10-0-0-{n}.ec2.internal"
        instance_id = f"i-{n:017x}"
        self.nodes.append(ClusterNode(
            name=name, provider_id=f"aws:///{zone}/{instance_id}", taints=(TAINT,), ready=True,
            labels={"karpenter.sh/nodepool": pool, "kubernetes.io/arch": "amd64"},
            created_at=self.clock.now() - age, annotations=node_annotations or {},
        ))
        price = self.catalog.price((instance_type, zone, capacity_type))
        values: dict[str, Any] = {
            "cluster": self.config.cluster_name, "id": f"nc-{name.split('.')[0]}", "pool": pool,
            "capacity_type": capacity_type, "zones": (zone,), "instance_types": (instance_type,),
            "price_per_hour": price or 1.0, "state": ClaimState.REGISTERED, "created_at": self.clock.now() - age,
            "instance_id": instance_id, "instance_type": instance_type, "zone": zone,
            "launched_price_per_hour": price, "node_name": name,
        }
        values.update(claim)
        self.claims[name] = NodeClaim(**values)
        if empty_for is not None:
            self.empty_since[name] = self.clock.now() - empty_for
        return name

    def update_node(self, name: str, *taints: Taint, **update: Any) -> None:
        """The Node as it now stands: `update`'s fields replaced, `taints` put on it beside its own."""
        i = next(i for i, n in enumerate(self.nodes) if n.name == name)
        if taints:
            update["taints"] = (*self.nodes[i].taints, *taints)
        self.nodes[i] = self.nodes[i].model_copy(update=update)

    def pod(self, node: str | None, gpus: int = 1, cpu: str = "1", memory: str = "4Gi", **fields: Any) -> ClusterPod:
        n = next(_serial)
        requests = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
        values: dict[str, Any] = {
            "uid": f"pod-{n}", "namespace": "team", "name": f"web-{n}", "node_name": node,
            "requests": Resources.from_quantities(requests), "tolerations": (TOLERATION,),
            "owner_kind": "ReplicaSet", "phase": "Running" if node else "Pending", "labels": {"app": "web"},
        }
        values.update(fields)
        pod = ClusterPod(**values)
        self.pods.append(pod)
        return pod

    def pods_on(self, node: str, count: int, **kwargs: Any) -> list[ClusterPod]:
        return [self.pod(node, **kwargs) for _ in range(count)]

    def solver(self) -> Solver:
        return Solver(self.config, self.catalog, self.clock)

    def items(self) -> list[ConsolidationNode]:
        out = []
        for node in self.nodes:
            members = node_pods(node, self.pods, self.blocked)
            since = None if members else self.empty_since.get(node.name)
            out.append(ConsolidationNode(node, self.claims.get(node.name), members, since,
                                         pods_changed_at=self.pods_changed.get(node.name),
                                         protected_daemons=protected_daemons(node, self.pods)))
        return out

    def consolidate(self, **kwargs: Any) -> ConsolidationResult:
        return consolidate(self.config, self.solver(), self.items(), claims=list(self.claims.values()), **kwargs)

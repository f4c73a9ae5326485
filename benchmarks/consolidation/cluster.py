"""Seeded fragmented clusters: grown by the packer in waves, then thinned by departures.

A cluster as it looks after a day: workloads arrived in bursts, each burst packed onto new nodes by the
real solver (the packing benchmark's workloads and pools), then whole workloads finished and others scaled
down, leaving nodes partly used and some empty. Every node is ours, Registered, Ready and old enough; every
pod may move (no do-not-disrupt, no PDB): the benchmark measures packing quality, not the safety rules.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from benchmarks.packing.scenarios import POOLS, _pods_for, pools_config
from gpu_autoscaler.domain.consolidation import ConsolidationNode, node_pods
from gpu_autoscaler.domain.packing import pod_requests
from gpu_autoscaler.domain.packing.fit import allocatable
from gpu_autoscaler.domain.packing.results import REQUESTS_ATTRIBUTE, requests_attribute
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
from gpu_autoscaler.models.resources import Resources

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.packing import Solver
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.pods import PendingPod

__all__ = ["NOW", "FragmentedCluster", "consolidation_config", "fragmented_cluster"]

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
THEME_ROTATION = ("inference", "multi-gpu", "mixed", "fractional", "constrained", "inference", "mixed", "mig")


def consolidation_config() -> Config:
    """The packing benchmark's pools, each consolidating freely: budgets of 100%, spot-to-spot allowed."""
    pools = []
    for entry in POOLS.values():
        pool: dict[str, Any] = copy.deepcopy(entry)
        pool["disruption"] = {"consolidateAfter": "5m", "spotToSpot": True, "budgets": [{"nodes": "100%"}]}
        pools.append(pool)
    return pools_config(nodePools=pools)


@dataclass(frozen=True)
class FragmentedCluster:
    seed: int
    nodes: tuple[ConsolidationNode, ...]

    @property
    def price_per_hour(self) -> float:
        return sum(n.claim.launched_price_per_hour or 0.0 for n in self.nodes if n.claim is not None)

    @property
    def pods(self) -> list[PendingPod]:
        """The pods still running, as the packer would see them pending (what the optimum repacks)."""
        return [entry.pod for n in self.nodes for entry in n.pods]


def _cluster_pod(pod: PendingPod, node: str) -> ClusterPod:
    return ClusterPod(
        uid=pod.uid, namespace=pod.namespace, name=pod.name, node_name=node, requests=pod.resources,
        node_selector=pod.node_selector, required_node_affinity=pod.required_node_affinity,
        tolerations=pod.tolerations, priority=pod.priority, owner_kind="ReplicaSet", phase="Running",
    )


def _cheapest_zone(solver: Solver, instance_type: str, zones: tuple[str, ...], capacity_type: str) -> str:
    prices = {z: solver.index.catalog.price((instance_type, z, capacity_type)) for z in zones}
    return min(zones, key=lambda z: (prices[z] is None, prices[z] or 0.0, z))


def _as_in_flight(node: _Node) -> NodeClaim:
    """A node as the solver sees a claim in flight: its free room is what its pods leave (kube-scheduler
    places new pods there first, as the packer plans them)."""
    used = Resources()
    for pod in node.pods:
        used = used + pod_requests(pod)
    return node.claim.model_copy(update={
        "state": ClaimState.LAUNCHED,
        "attributes": {**node.claim.attributes, REQUESTS_ATTRIBUTE: requests_attribute(used)},
    })


@dataclass
class _Node:
    claim: NodeClaim
    node: ClusterNode
    pods: list[PendingPod]


def _depart(rng: random.Random, nodes: list[_Node], finish: float, stay: float) -> None:
    """Whole workloads finish with probability `finish`; of the others each replica stays with `stay`."""
    workloads = sorted({p.name.rsplit("-", 1)[0] for n in nodes for p in n.pods})
    finished = {w for w in workloads if rng.random() < finish}
    for n in nodes:
        n.pods = [p for p in n.pods if p.name.rsplit("-", 1)[0] not in finished and rng.random() < stay]


def fragmented_cluster(solver: Solver, seed: int, *, waves: int = 8, wave_pods: int = 100,
                       finish: float = 0.3, stay: float = 0.75, min_nodes: int = 50) -> FragmentedCluster:
    """At least `waves` bursts of `wave_pods` pods — more until the cluster ends with `min_nodes` nodes — each
    placed by `solver` on the free room of the nodes there and on new nodes, with departures after each
    (whole workloads finish with probability `finish`, other replicas stay with `stay`); empty nodes are
    removed after each wave but the last."""
    rng = random.Random(seed)
    config = solver.config
    nodes: list[_Node] = []
    serial = 0
    wave = 0
    while wave < waves or len(nodes) < min_nodes:
        if wave >= 4 * waves:
            raise RuntimeError(f"cluster {seed}: under {min_nodes} nodes after {wave} waves")
        theme = THEME_ROTATION[(seed + wave) % len(THEME_ROTATION)]
        pods = [p.model_copy(update={"pod_group": None}) for p in _pods_for(rng, theme, wave_pods, f"c{seed}w{wave}")]
        by_uid = {p.uid: p for p in pods}
        plan = solver.solve(pods, claims=[_as_in_flight(n) for n in nodes])
        by_claim = {n.claim.id: n for n in nodes}
        for claim_id, uids in plan.existing.items():
            by_claim[claim_id].pods.extend(by_uid[u] for u in uids)
        born = NOW - timedelta(hours=1) - timedelta(minutes=10) * (4 * waves - wave)
        for claim in plan.claims:
            serial += 1
            name = f"ip-10-0-{serial // 250}-{serial % 250}.ec2.internal"
            instance_id = f"i-{seed:04x}{serial:012x}"
            first = claim.instance_types[0]
            zone = _cheapest_zone(solver, first, claim.zones, claim.capacity_type)
            pool = config.pool(claim.pool)
            # Registered and initialized, as a node the device plugin has advertised its GPUs on: consolidation
            # (like Karpenter) leaves a node alone until its extended resources are allocatable.
            room = allocatable(solver.index.catalog.instance_type(first), pool, config.overhead)
            node = ClusterNode(name=name, provider_id=f"aws:///{zone}/{instance_id}", taints=tuple(pool.taints),
                               labels=dict(pool.labels), ready=True, created_at=born, allocatable=room)
            registered = claim.model_copy(update={
                "state": ClaimState.REGISTERED, "instance_id": instance_id, "instance_type": first,
                "instance_types": (first,), "zone": zone, "zones": (zone,), "node_name": name, "created_at": born,
                "launched_price_per_hour": solver.index.catalog.price((first, zone, claim.capacity_type)),
            })
            nodes.append(_Node(registered, node, [by_uid[u] for u in claim.pods]))
        _depart(rng, nodes, finish, stay)
        wave += 1
        if wave < waves or len([n for n in nodes if n.pods]) < min_nodes:
            nodes = [n for n in nodes if n.pods]
    out = []
    for n in nodes:
        members = node_pods(n.node, [_cluster_pod(p, n.node.name) for p in n.pods])
        since = None if members else NOW - timedelta(hours=1)
        out.append(ConsolidationNode(n.node, n.claim, members, empty_since=since))
    return FragmentedCluster(seed, tuple(out))

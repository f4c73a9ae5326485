"""What `status` shows, computed from plain data: claims, instances, queue depths, nodes and pods.

No AWS and no Kubernetes client here: the command reads them (`gpu_autoscaler.cli.account`, the Kubernetes
adapter) and hands the results over, so the arithmetic is tested on builders.

Cost (`status --cost`): each node's USD/h (its claim's price) is split among the pods bound to it by their share
of the node's GPUs; on a node whose pods request no GPU, by their share of its CPU. What no pod requests is the
node's idle cost, shown apart. Per day is per hour × 24 (a rate, not a forecast).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.models.claims import IN_FLIGHT_STATES, ClaimState
from gpu_autoscaler.models.labels import INSTANCE_GPU_COUNT, NODE_POOL
from gpu_autoscaler.models.resources import GPU

if TYPE_CHECKING:
    from datetime import datetime

    from gpu_autoscaler.cli.account import AccountSnapshot
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod

__all__ = ["LIVE", "cost_report", "status_report"]

LIVE = (ClaimState.LAUNCHED, ClaimState.REGISTERED, ClaimState.DRAINING)
"""Claims whose instance is (or may be) running and billed."""
HOUR = timedelta(hours=1)
CPU = "cpu"


def _price(claim: NodeClaim) -> float:
    return claim.launched_price_per_hour if claim.launched_price_per_hour is not None else claim.price_per_hour


def _since(moment: datetime | None, now: datetime) -> float | None:
    return round((now - moment).total_seconds(), 1) if moment is not None else None


def _drains_last_hour(claims: list[NodeClaim], now: datetime) -> Counter[str]:
    """Draining transitions in the last hour, by cause: consolidation, or an interruption (Spot, rebalance,
    health, reservation, state change)."""
    causes: Counter[str] = Counter()
    for claim in claims:
        for step in claim.history:
            if step.state is ClaimState.DRAINING and now - step.at <= HOUR:
                causes["consolidations" if "consolidat" in step.reason.lower() else "interruptions"] += 1
    return causes


def status_report(
    snapshot: AccountSnapshot, nodes: list[ClusterNode] | None, pods: list[ClusterPod] | None, now: datetime,
) -> dict[str, Any]:
    """Per pool: claims by state, GPUs, USD/h, warm capacity, claims in flight; cluster-wide: pending GPU pods,
    dead letters. `nodes`/`pods` are None when the Kubernetes API was not reachable (those fields are null)."""
    pools: dict[str, dict[str, Any]] = {}
    by_pool: dict[str, list[NodeClaim]] = defaultdict(list)
    for claim in snapshot.claims:
        by_pool[claim.pool].append(claim)
    node_pool = {n.name: n.labels.get(NODE_POOL, "") for n in nodes or []}
    allocated: Counter[str] = Counter()
    for pod in pods or []:
        if pod.node_name in node_pool:
            allocated[node_pool[pod.node_name]] += pod.requests.gpus
    for pool, claims in sorted(by_pool.items()):
        live = [c for c in claims if c.state in LIVE]
        pool_nodes = [n for n in nodes or [] if n.labels.get(NODE_POOL) == pool]
        drains = _drains_last_hour(claims, now)
        pools[pool] = {
            "claims": dict(Counter(str(c.state) for c in claims if c.state is not ClaimState.TERMINATED)),
            "nodes": len(pool_nodes) if nodes is not None else None,
            "gpus": None if nodes is None else {
                "physical": sum(int(float(n.labels.get(INSTANCE_GPU_COUNT, "0"))) for n in pool_nodes),
                "slots": sum(n.allocatable.gpus for n in pool_nodes),
                "allocated": allocated[pool],
            },
            "usdPerHour": round(sum(_price(c) for c in live), 4),
            "warm": [{"claim": c.id, "why": c.warm, "state": str(c.state)} for c in claims
                     if c.warm and c.state is not ClaimState.TERMINATED],
            "inFlight": [{"claim": c.id, "state": str(c.state), "ageSeconds": _since(c.created_at, now)}
                         for c in claims if c.state in IN_FLIGHT_STATES],
            "interruptionsLastHour": drains["interruptions"],
            "consolidationsLastHour": drains["consolidations"],
        }
    pending = [p for p in pods or [] if p.node_name is None and p.requests.gpus > 0]
    waits = [w for w in (_since(p.created_at, now) for p in pending) if w is not None]
    return {
        "pools": pools,
        "usdPerHour": round(sum(p["usdPerHour"] for p in pools.values()), 4),
        "pendingGpuPods": None if pods is None else {"count": len(pending), "oldestSeconds": max(waits, default=None)},
        "instances": dict(Counter(i.state for i in snapshot.instances)),
        "deadLetters": {q: n for q, n in snapshot.queue_depths.items() if q.endswith("dlq")},
        "kubernetes": nodes is not None,
    }


def cost_report(
    claims: list[NodeClaim], nodes: list[ClusterNode], pods: list[ClusterPod], *, by: str, key: str | None = None,
) -> dict[str, Any]:
    """USD per hour and per day by namespace (`by="namespace"`) or by a pod label's value (`by="label"`, `key`),
    with each node's unrequested share as `idle`."""
    price_of = {c.instance_id: _price(c) for c in claims if c.instance_id and c.state in LIVE}
    bound: dict[str, list[ClusterPod]] = defaultdict(list)
    for pod in pods:
        if pod.node_name:
            bound[pod.node_name].append(pod)
    teams: dict[str, float] = defaultdict(float)
    idle = 0.0
    unpriced = []
    for node in nodes:
        price = price_of.get(node.instance_id or "")
        if price is None:
            unpriced.append(node.name)
            continue
        on_node = bound.get(node.name, [])
        resource = GPU if any(p.requests.gpus for p in on_node) and node.allocatable.gpus else CPU
        total = float(node.allocatable[resource])
        spent = 0.0
        for pod in on_node:
            share = pod.requests[resource] / total if total else 0.0
            team = pod.namespace if by == "namespace" else pod.labels.get(key or "", "<none>")
            teams[team] += price * share
            spent += price * share
        idle += max(0.0, price - spent)
    rows = [{"team": team, "usdPerHour": round(usd, 4), "usdPerDay": round(usd * 24, 2)}
            for team, usd in sorted(teams.items(), key=lambda item: -item[1])]
    return {
        "by": by if by == "namespace" else f"label {key}",
        "teams": rows,
        "idle": {"usdPerHour": round(idle, 4), "usdPerDay": round(idle * 24, 2)},
        "totalUsdPerHour": round(sum(teams.values()) + idle, 4),
        "nodesWithoutPrice": unpriced,
    }

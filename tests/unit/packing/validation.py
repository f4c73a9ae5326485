"""An independent check that a plan is valid, written from the rules rather than from the solver.

Used by the rule tests and the property tests: every pod is accounted for exactly once; every candidate
type of every claim, in every zone of the claim where it is offered, holds all the claim's pods (requests
plus overhead, labels, taints, pool requirements); gangs are whole, in one zone, and share one candidate
list where the pool asks for EFA; pool limits hold, counting live claims as the solver's contract says. One
tier's nodes (`binpack` and the passes after it) are checked by `assert_valid`: every pod once, no node over.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.domain.packing.fit import allocatable, fits, pod_requests
from gpu_autoscaler.domain.packing.results import claim_requests
from gpu_autoscaler.domain.user_data import node_labels as registered_labels
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import tolerates_all

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.domain.packing.kinds import Kinds, Opened
    from gpu_autoscaler.domain.packing.results import Plan
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.pods import PendingPod


def node_labels(catalog: Catalog, config: Config, pool_name: str, instance_type: str, zone: str,
                capacity_type: str) -> dict[str, str]:
    """What the node would carry: the labels its kubelet is started with (`user_data.node_labels`), and those
    the kubelet and the cloud node controller add from the instance, stable and deprecated keys alike (kubernetes
    pkg/kubelet/kubelet_node_status.go; k8s.io/cloud-provider controllers/node)."""
    pool = config.pool(pool_name)
    kind = catalog.instance_type(instance_type)
    labels, _ = registered_labels(pool, capacity_type, instance_type=kind)  # type: ignore[arg-type]
    arch = kind.labels[L.ARCH]
    return {**labels, L.ZONE: zone, L.REGION: config.region, L.OS: "linux", L.ARCH: arch,
            L.INSTANCE_TYPE: instance_type, "failure-domain.beta.kubernetes.io/zone": zone,
            "failure-domain.beta.kubernetes.io/region": config.region, "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": arch, "beta.kubernetes.io/instance-type": instance_type}


def pod_matches(pod: PendingPod, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in pod.node_selector.items()):
        return False
    return not pod.required_node_affinity or any(t.matches(labels) for t in pod.required_node_affinity)


def check_plan(plan: Plan, pods: Sequence[PendingPod], config: Config, catalog: Catalog,
               live: Sequence[NodeClaim] = (), unavailable: set[tuple[str, str, str]] | None = None) -> None:
    by_uid = {p.uid: p for p in pods}
    seen = Counter(
        [u for c in plan.claims for u in c.pods]
        + [u for uids in plan.existing.values() for u in uids]
        + [u.pod for u in plan.unschedulable]
        + list(plan.covered)
    )
    assert set(seen) == set(by_uid), f"pods missing or invented: {set(by_uid) ^ set(seen)}"
    assert all(n == 1 for n in seen.values()), f"pods placed twice: {[u for u, n in seen.items() if n > 1]}"
    for claim in plan.claims:
        check_claim(claim, [by_uid[u] for u in claim.pods], config, catalog, unavailable or set())
    live_by_id = {c.id: c for c in live}
    for claim_id, uids in plan.existing.items():
        check_in_flight(live_by_id[claim_id], [by_uid[u] for u in uids], config, catalog)
    check_gangs(plan, pods, config)
    check_limits(plan, config, catalog, live)


def check_claim(claim: NodeClaim, pods: list[PendingPod], config: Config, catalog: Catalog,
                unavailable: set[tuple[str, str, str]]) -> None:
    pool = config.pool(claim.pool)
    assert claim.pods and claim.instance_types and claim.zones
    assert len(claim.instance_types) <= 60
    assert set(claim.zones) <= set(config.zones)
    assert claim.capacity_type in pool.capacity_types
    assert all(tolerates_all(p.tolerations, pool.taints) for p in pods), f"{claim.id}: a pod does not tolerate"
    total = Resources()
    for pod in pods:
        total = total + pod_requests(pod)
    prices = []
    for name in claim.instance_types:
        alloc = allocatable(catalog.instance_type(name), pool, config.overhead)
        assert fits(total, alloc), f"{claim.id}: {name} cannot hold {total} (allocatable {alloc})"
        offered = [z for z in claim.zones if catalog.offering((name, z, claim.capacity_type)) is not None
                   and (name, z, claim.capacity_type) not in unavailable]
        assert offered, f"{claim.id}: {name} is offered in none of {claim.zones}"
        for zone in offered:
            labels = node_labels(catalog, config, claim.pool, name, zone, claim.capacity_type)
            assert all(r.matches(labels) for r in pool.requirements), f"{claim.id}: {name} breaks pool requirements"
            assert all(pod_matches(p, labels) for p in pods), f"{claim.id}: {name} in {zone} breaks a pod's selector"
        prices.append(min(catalog.price((name, z, claim.capacity_type)) or 0 for z in offered))
    assert prices == sorted(prices), f"{claim.id}: candidates not cheapest first: {prices}"
    assert abs(claim.price_per_hour - prices[0]) < 1e-9


def check_in_flight(claim: NodeClaim, pods: list[PendingPod], config: Config, catalog: Catalog) -> None:
    """Pods put on a claim in flight fit its room left on every type it may become, and match its labels."""
    assert claim.state in (ClaimState.PENDING, ClaimState.LAUNCHED) and claim.gang is None
    assert all(p.gang is None for p in pods)
    pool = config.pool(claim.pool)
    total = claim_requests(claim)
    for pod in pods:
        total = total + pod_requests(pod)
    names = [claim.instance_type] if claim.instance_type else list(claim.instance_types)
    zones = [claim.zone] if claim.zone else list(claim.zones)
    assert all(tolerates_all(p.tolerations, pool.taints) for p in pods)
    for name in names:
        assert fits(total, allocatable(catalog.instance_type(name), pool, config.overhead)), f"{claim.id} overfull"
        for zone in zones:
            labels = node_labels(catalog, config, claim.pool, name, zone, claim.capacity_type)
            assert all(pod_matches(p, labels) for p in pods), f"{claim.id}: a pod's selector fails on {name}/{zone}"


def check_gangs(plan: Plan, pods: Sequence[PendingPod], config: Config) -> None:
    members = Counter(p.gang for p in pods if p.gang and p.uid not in plan.covered)
    placed: dict[str, list[NodeClaim]] = plan.gangs()
    unschedulable = {u.pod for u in plan.unschedulable}
    for gang, claims in placed.items():
        uids = [u for c in claims for u in c.pods]
        assert len(uids) == members[gang], f"gang {gang} placed in part"
        assert all(p.gang == gang for p in pods if p.uid in set(uids)), f"gang {gang}'s claims hold other pods"
        assert len({c.zones for c in claims}) == 1 and len(claims[0].zones) == 1, f"gang {gang} spans zones"
        if config.pool(claims[0].pool).efa:
            assert len({c.instance_types for c in claims}) == 1, f"EFA gang {gang} has several candidate lists"
    for gang in members:
        if gang not in placed:
            assert all(p.uid in unschedulable for p in pods if p.gang == gang and p.uid not in plan.covered), (
                f"gang {gang} placed in part")


def check_limits(plan: Plan, config: Config, catalog: Catalog, live: Sequence[NodeClaim]) -> None:
    """A pool gets new claims only within its limits, live claims counted (each at the most it may cost)."""
    for pool in config.node_pools:
        new = [c for c in plan.claims if c.pool == pool.name]
        if not new:
            continue
        gpus, price = _usage([c for c in live if c.pool == pool.name and c.state is not ClaimState.TERMINATED],
                             catalog)
        new_gpus, new_price = _usage(new, catalog)
        if pool.limits.gpus is not None:
            assert gpus + new_gpus <= pool.limits.gpus + 1e-9, f"pool {pool.name}: over its GPU limit"
        if pool.limits.price_per_hour is not None:
            assert price + new_price <= pool.limits.price_per_hour + 1e-9, f"pool {pool.name}: over its USD/h limit"


def _usage(claims: Sequence[NodeClaim], catalog: Catalog) -> tuple[float, float]:
    gpus = 0.0
    price = 0.0
    for claim in claims:
        names = [claim.instance_type] if claim.instance_type else list(claim.instance_types)
        gpus += max(catalog.instance_type(n).gpus for n in names)
        offered = [catalog.price((n, z, claim.capacity_type)) for n in names for z in claim.zones]
        price += max([claim.price_per_hour, *(p for p in offered if p is not None)])
    return gpus, price


# One tier: nodes opened by `binpack` (and the passes after it) for a demand of pod classes.


def cost(opened: list[Opened], k: Kinds) -> float:
    return float(sum(k.price[e.kind] * e.copies for e in opened))


def assert_valid(opened: list[Opened], demand: np.ndarray, req: np.ndarray, k: Kinds) -> None:
    placed = sum((e.counts * e.copies for e in opened), np.zeros_like(demand))
    assert (placed == demand).all()
    for e in opened:
        assert e.copies > 0
        assert ((e.counts @ req) <= k.cap[e.kind]).all()
        assert k.feasible[e.counts > 0, e.kind].all()

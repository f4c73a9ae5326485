"""The consolidation search's solve memo (`domain.consolidation_memo`): a question asked again gets the plan it got
before (its new claims made now), and a change to anything the solve reads asks the solver afresh."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.domain.consolidation import consolidate
from gpu_autoscaler.domain.consolidation_memo import SolveMemo, claim_print, pod_print, question, solve_memo
from gpu_autoscaler.domain.packing import Solver
from gpu_autoscaler.domain.per_object import PerObject
from gpu_autoscaler.models.claims import ClaimState, NodeClaim, StateTransition
from gpu_autoscaler.models.pods import PendingPod, PodGroup
from gpu_autoscaler.models.taints import Toleration
from tests.unit.consolidation.builders import NOW, Cluster, pool_config

if TYPE_CHECKING:
    from gpu_autoscaler.domain.consolidation_models import ConsolidationResult


def _half_empty() -> tuple[Cluster, str, str]:
    """A half-empty 8-GPU node (replaced by a cheaper one) and a 4-GPU node with room for one more pod."""
    cluster = Cluster(pool_config())
    big = cluster.node("g5.48xlarge")
    cluster.pods_on(big, 1, gpus=4, cpu="16", memory="64Gi")
    small = cluster.node("g5.12xlarge")
    cluster.pods_on(small, 3, gpus=1)
    return cluster, big, small


class _Counting(Solver):
    """A solver that counts its solves."""

    solves = 0

    def solve(self, *args: Any, **kwargs: Any) -> Any:
        self.solves += 1
        return super().solve(*args, **kwargs)


def _run(cluster: Cluster, solver: Solver, **kwargs: Any) -> ConsolidationResult:
    return consolidate(cluster.config, solver, cluster.items(), claims=list(cluster.claims.values()), **kwargs)


def _fresh(cluster: Cluster, **kwargs: Any) -> ConsolidationResult:
    return _run(cluster, Solver(cluster.config, cluster.catalog, cluster.clock), **kwargs)


def test_a_pass_asked_again_gets_the_same_answer_without_a_solve() -> None:
    cluster, big, _ = _half_empty()
    solver = _Counting(cluster.config, cluster.catalog, cluster.clock)
    first = _run(cluster, solver)
    asked = solver.solves
    assert asked > 0 and first.decisions and big in first.decisions[0].nodes
    assert first.decisions[0].replacements, "a decision with new claims: the part a plan from the memo restamps"
    again = _run(cluster, solver)
    assert solver.solves == asked, "every question was asked before"
    assert again == first == _fresh(cluster)


def test_a_plan_from_the_memo_is_made_now() -> None:
    """The one thing a solve takes from its clock: a new claim's `created_at`."""
    cluster, _, _ = _half_empty()
    solver = _Counting(cluster.config, cluster.catalog, cluster.clock)
    _run(cluster, solver)
    asked = solver.solves
    cluster.clock.advance(timedelta(minutes=1))
    later = _run(cluster, solver)
    assert solver.solves == asked
    assert later == _fresh(cluster)
    made = [c.created_at for d in later.decisions for c in d.replacements]
    assert made and set(made) == {NOW + timedelta(minutes=1)}


def _changes() -> list[tuple[str, Any]]:
    """Changes to the picture, each to something a solve reads; each must be asked afresh."""
    def pod_on_small(cluster: Cluster, big: str, small: str) -> dict[str, Any]:
        cluster.pod(small, gpus=1)  # the destination's used room
        return {}

    def pod_gone(cluster: Cluster, big: str, small: str) -> dict[str, Any]:
        cluster.pods.remove(next(p for p in cluster.pods if p.node_name == small))
        return {}

    def candidate_pod(cluster: Cluster, big: str, small: str) -> dict[str, Any]:
        old = next(p for p in cluster.pods if p.node_name == big)
        cluster.pods[cluster.pods.index(old)] = old.model_copy(update={"priority": 5})
        return {}

    def claim_field(cluster: Cluster, big: str, small: str) -> dict[str, Any]:
        claim = cluster.claims[small]
        cluster.claims[small] = claim.model_copy(update={"attributes": {**claim.attributes, "x": "y"}})
        return {}

    def claim_in_flight(cluster: Cluster, big: str, small: str) -> dict[str, Any]:
        cluster.claims["in-flight"] = NodeClaim(
            cluster=cluster.config.cluster_name, id="nc-in-flight", pool="gpu", capacity_type="on-demand",
            zones=("us-east-1a",), instance_types=("g5.xlarge",), price_per_hour=1.0, state=ClaimState.LAUNCHED,
            created_at=NOW, attributes={"requests": '{"nvidia.com/gpu":1}'})
        return {}

    def unavailable(cluster: Cluster, big: str, small: str) -> dict[str, Any]:
        return {"unavailable": [("g5.12xlarge", "us-east-1a", "spot")]}

    def quotas(cluster: Cluster, big: str, small: str) -> dict[str, Any]:
        return {"quotas": {"g/on-demand": 10_000}}

    return [(f.__name__, f) for f in (pod_on_small, pod_gone, candidate_pod, claim_field, claim_in_flight,
                                      unavailable, quotas)]


@pytest.mark.parametrize(("name", "change"), _changes())
def test_a_change_to_what_a_solve_reads_is_asked_afresh(name: str, change: Any) -> None:
    cluster, big, small = _half_empty()
    solver = _Counting(cluster.config, cluster.catalog, cluster.clock)
    _run(cluster, solver)
    asked = solver.solves
    kwargs = change(cluster, big, small)
    result = _run(cluster, solver, **kwargs)
    assert solver.solves > asked, f"{name}: answered from the memo"
    assert result == _fresh(cluster, **kwargs)


def test_what_the_account_s_other_instances_use_is_part_of_the_question() -> None:
    """The same quotas with another workload filling them: not the plan of the question without it."""
    cluster, big, _ = _half_empty()
    solver = _Counting(cluster.config, cluster.catalog, cluster.clock)
    quotas = {"g/on-demand": 10_000, "g/spot": 10_000}
    roomy = _run(cluster, solver, quotas=quotas)
    asked = solver.solves
    full = {"g/on-demand": 10_000, "g/spot": 10_000}
    crowded = _run(cluster, solver, quotas=quotas, outside=full)
    assert solver.solves > asked, "answered from the memo"
    assert crowded == _fresh(cluster, quotas=quotas, outside=full)
    assert roomy.decisions[0].replacements and not any(d.replacements for d in crowded.decisions)


def _claim() -> NodeClaim:
    return NodeClaim(cluster="c", id="nc-1", pool="gpu", capacity_type="on-demand", zones=("us-east-1a",),
                     instance_types=("g5.xlarge",), price_per_hour=1.0, created_at=NOW)


_OTHER_VALUES: dict[str, Any] = {
    "cluster": "d", "id": "nc-2", "pool": "other", "capacity_type": "spot", "zones": ("us-east-1b",),
    "instance_types": ("g5.2xlarge",), "price_per_hour": 1.5, "pods": ("p",), "gang": "g",
    "state": ClaimState.LAUNCHED, "created_at": NOW + timedelta(seconds=1), "updated_at": NOW,
    "history": (StateTransition(state=ClaimState.LAUNCHED, at=NOW),), "instance_id": "i-1",
    "instance_type": "g5.xlarge", "zone": "us-east-1a", "launched_price_per_hour": 1.0, "reservation_id": "cr-1",
    "node_name": "n", "reason": "r", "warm": "forecast", "attributes": {"a": "b"}, "version": 3,
}


@pytest.mark.parametrize("field", sorted(NodeClaim.model_fields))
def test_every_field_of_a_claim_is_in_its_print(field: str) -> None:
    """A field added to NodeClaim without a value here fails: the memo must key on it too."""
    claim = _claim()
    changed = claim.model_copy(update={field: _OTHER_VALUES[field]})
    assert getattr(changed, field) != getattr(claim, field)
    assert claim_print(changed) != claim_print(claim)


_POD_VALUES: dict[str, Any] = {
    "uid": "u2", "namespace": "ns", "name": "other", "created_at": NOW, "requests": {"cpu": "2"},
    "node_selector": {"a": "b"}, "required_node_affinity": None, "tolerations": (Toleration(key="k"),),
    "priority": 1, "pod_group": PodGroup(name="g", min_member=2), "annotations": {"a": "b"},
    "volume_zones": ("us-east-1a",), "topology_spread": None, "pod_anti_affinity": None, "device_requests": None,
    "host_ports": None, "pod_affinity": None, "unplannable": "no", "preferred_node_affinity": None,
}


@pytest.mark.parametrize("field", sorted(PendingPod.model_fields))
def test_every_field_of_a_pod_is_in_its_print(field: str) -> None:
    pod = PendingPod(uid="u1", name="p", requests={"cpu": "1"})
    value = _POD_VALUES[field]
    if value is None:  # a tuple of nested models: taken from a pod read from its wire form
        value = _nested(field)
    changed = pod.model_copy(update={field: value})
    assert getattr(changed, field) != getattr(pod, field)
    assert pod_print(changed) != pod_print(pod)


def _nested(field: str) -> Any:
    pod = PendingPod.model_validate({
        "uid": "u", "name": "n",
        "requiredNodeAffinity": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}],
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}],
        "podAntiAffinity": [{"topologyKey": "kubernetes.io/hostname"}],
        "deviceRequests": [{"deviceClassName": "gpu.nvidia.com", "count": 1}],
        "hostPorts": [{"hostPort": 8000}],
        "podAffinity": [{"topologyKey": "kubernetes.io/hostname"}],
        "preferredNodeAffinity": [{"weight": 1, "preference": {"matchExpressions": [
            {"key": "k", "operator": "Exists"}]}}],
    })
    return getattr(pod, field)


def test_each_part_of_a_question_is_in_its_key() -> None:
    cluster, _, _ = _half_empty()
    solver = cluster.solver()
    pod = PendingPod(uid="u1", name="p", requests={"cpu": "1"})
    base = ([pod], [("full", "x")], [("g5.xlarge", "us-east-1a", "spot")], "s", {"q": 1})
    key = question(*base, solver, new_nodes=True)
    assert question(*base, solver, new_nodes=False) != key
    variants = [
        ([pod, PendingPod(uid="u2", name="p", requests={"cpu": "1"})], *base[1:]),
        (base[0], [("full", "y")], *base[2:]),
        (base[0], [("full", "x"), ("full", "x")], *base[2:]),
        (*base[:2], [], *base[3:]),
        (*base[:3], "t", base[4]),
        (*base[:4], {"q": 2}),
        (*base[:4], None),
    ]
    for variant in variants:
        assert question(*variant, solver, new_nodes=True) != key, variant
    assert question(*base, solver, new_nodes=True) == key


def test_the_memo_is_bounded_least_recently_used_first_out() -> None:
    from gpu_autoscaler.domain.packing.results import Plan
    memo = SolveMemo(limit=2)
    memo.put(("a",), Plan())
    memo.put(("b",), Plan())
    assert memo.get(("a",), NOW) is not None
    memo.put(("c",), Plan())
    assert memo.get(("b",), NOW) is None and memo.get(("a",), NOW) is not None and len(memo) == 2


def test_each_solver_has_its_own_memo() -> None:
    cluster, _, _ = _half_empty()
    assert solve_memo(cluster.solver()) is not solve_memo(cluster.solver())


def test_a_node_shown_as_a_claim_in_flight_is_keyed_on_all_its_view_is_made_of() -> None:
    """`GroupNode.as_in_flight` reads the claim, price, used and capacity: a change to any is another key,
    also one taken in the pass (`take`)."""
    from dataclasses import replace

    from gpu_autoscaler.domain.consolidation_group import GroupNode
    from gpu_autoscaler.models.resources import Resources

    cluster, _, _ = _half_empty()
    item = cluster.items()[1]
    node = GroupNode(item, None, 5.0, Resources({"cpu": 1000}), Resources({"cpu": 4000, "memory": 10}))
    key = node.shown()
    claim = item.claim
    assert claim is not None
    variants = [
        GroupNode(item, None, 5.5, node.used, node.capacity),
        GroupNode(item, None, 5.0, Resources({"cpu": 2000}), node.capacity),
        GroupNode(item, None, 5.0, node.used, Resources({"cpu": 4000, "memory": 11})),
        GroupNode(replace(item, claim=claim.model_copy(update={"zone": "us-east-1b"})), None, 5.0, node.used,
                  node.capacity),
    ]
    for other in variants:
        assert other.shown() != key
    node.take(Resources({"cpu": 1}))
    assert node.shown() != key


def test_a_value_per_object_is_computed_once_per_object_and_forgotten_past_its_limit() -> None:
    """`PerObject` keeps what it computed for the very object (not an equal one: its id is only reused once the
    object is gone, and the object is held), and clears itself past its limit rather than grow."""
    calls: list[str] = []

    def compute(pod: PendingPod) -> str:
        calls.append(pod.name)
        return pod.name.upper()

    kept: PerObject[PendingPod, str] = PerObject(compute, limit=2)
    a, b, c = (PendingPod(uid=n, namespace="ml", name=n, requests={"nvidia.com/gpu": "1"}) for n in ("a", "b", "c"))
    assert [kept(a), kept(a), kept(b)] == ["A", "A", "B"] and calls == ["a", "b"]
    twin = a.model_copy()
    assert kept(twin) == "A" and calls == ["a", "b", "a"], "an equal object is another object"
    kept(c)  # past the limit: cleared, then kept
    assert kept(a) == "A" and calls[-2:] == ["c", "a"]

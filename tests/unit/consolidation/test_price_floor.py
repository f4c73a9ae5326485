"""The price floor of a single node's replacement (`domain.consolidation_floor`): a node whose stranded pods (those
that fit on no other node's free room) no cheaper type holds is "no saving" without a solve, and the floor never
turns away a node the solver would have removed or replaced."""

from __future__ import annotations

import random
import tracemalloc
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_autoscaler.domain.catalog import Catalog, OfferingKey
from gpu_autoscaler.domain.consolidation import consolidate
from gpu_autoscaler.domain.consolidation_floor import FreeRooms, TypeRooms
from gpu_autoscaler.domain.consolidation_group import GroupJudge
from gpu_autoscaler.domain.packing import Solver
from gpu_autoscaler.domain.packing.fit import fits
from gpu_autoscaler.models.catalog import InstanceType, Offering
from gpu_autoscaler.models.resources import Resources
from tests.unit.consolidation.builders import Cluster, make_config, make_pool, pool_config
from tests.unit.packing.builders import TYPES, make_offerings, make_type

if TYPE_CHECKING:
    import pytest

    from gpu_autoscaler.domain.consolidation_models import ConsolidationResult


class _Counting(Solver):
    """A solver that counts its solves and the node packings they ask for."""

    solves = 0
    packed = 0

    def solve(self, *args: Any, **kwargs: Any) -> Any:
        self.solves += 1
        return super().solve(*args, **kwargs)

    def pack(self, *args: Any, **kwargs: Any) -> Any:
        self.packed += 1
        return super().pack(*args, **kwargs)


def _run(cluster: Cluster, **kwargs: Any) -> tuple[ConsolidationResult, int]:
    solver = _Counting(cluster.config, cluster.catalog, cluster.clock)
    result = consolidate(cluster.config, solver, cluster.items(), claims=list(cluster.claims.values()), **kwargs)
    return result, solver.solves


def _without_floor(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> ConsolidationResult:
    with monkeypatch.context() as patched:
        patched.setattr(GroupJudge, "_priced_out", lambda self, n: None)
        return _run(cluster, **kwargs)[0]


def _on_demand_cluster() -> Cluster:
    """g5.12xlarge and g6.xlarge On-Demand only: no spot offering below the 4-GPU type's price."""
    names = ("g5.12xlarge", "g6.xlarge")
    catalog = Catalog([make_type(n) for n in names],
                      [o for o in make_offerings(names) if o.capacity_type == "on-demand"])
    return Cluster(make_config(make_pool(capacityTypes=["on-demand"],
                                         disruption={"budgets": [{"nodes": "100%"}], "underutilizedBelow": None})),
                   catalog)


def test_a_node_whose_pods_fit_nowhere_cheaper_is_no_saving_without_a_solve(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four GPUs and 40 vCPUs: nothing is cheaper than the spot g5.12xlarge holding them, and the other node (not a
    candidate itself) has no room for them. The pool opts in to spot-to-spot: without it, a Spot node is only
    deleted (`test_a_spot_node_without_spot_to_spot_is_only_deleted_in_a_pool_that_may_launch_spot`)."""
    cluster = Cluster(pool_config(spotToSpot=True))
    snug = cluster.node("g5.12xlarge", capacity_type="spot")
    cluster.pod(snug, gpus=4, cpu="40", memory="64Gi")
    full = cluster.node("g6.xlarge", capacity_type="spot", node_annotations={"karpenter.sh/do-not-disrupt": "true"})
    cluster.pod(full, gpus=1)
    result, solves = _run(cluster)
    assert result.decisions == ()
    assert result.skipped[snug].startswith("no saving: 1 of its pods fit on no other node")
    assert solves == 0
    assert _without_floor(cluster, monkeypatch).skipped[snug].startswith("no saving")


def test_with_one_replacement_allowed_the_stranded_pods_are_priced_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two one-GPU pods on a g5.12xlarge, On-Demand only: each alone fits a g6.xlarge, together only a type no cheaper
    than the node. With one replacement allowed (Karpenter's rule) the floor answers; with any number the solver
    replaces the node by two small ones."""
    cluster = _on_demand_cluster()
    node = cluster.node("g5.12xlarge")
    cluster.pods_on(node, 2, gpus=1, cpu="3", memory="12Gi")
    one, solves = _run(cluster, max_replacements=1)
    assert one.decisions == () and solves == 0
    assert one.skipped[node].startswith("no saving")
    assert "too many replacements" in _without_floor(cluster, monkeypatch, max_replacements=1).skipped[node]
    many, solves = _run(cluster)
    assert solves > 0 and len(many.decisions) == 1 and len(many.decisions[0].replacements) == 2


def _spot_node_whose_cheapest_home_is_on_demand(**disruption: Any) -> tuple[Cluster, str, list[OfferingKey]]:
    """A Spot g5.12xlarge (2.38 USD/h) with one small GPU pod; a g6.xlarge that only On-Demand offers (0.80); the
    g5.12xlarge's Spot offerings marked unavailable (insufficient capacity): the solver's cheapest placement of
    the pod is a new On-Demand node. Returns the cluster, the node and the unavailable offerings."""
    names = ("g5.12xlarge", "g6.xlarge")
    offerings = [o for o in make_offerings(names) if o.instance_type == "g5.12xlarge" or o.capacity_type != "spot"]
    settings = {"budgets": [{"nodes": "100%"}], "underutilizedBelow": None, **disruption}
    cluster = Cluster(make_config(make_pool(disruption=settings)),
                      Catalog([make_type(n) for n in names], offerings))
    node = cluster.node("g5.12xlarge", capacity_type="spot")
    cluster.pod(node, gpus=1, cpu="3", memory="12Gi")
    unavailable: list[OfferingKey] = [(o.instance_type, o.zone, "spot") for o in offerings if o.capacity_type == "spot"]
    return cluster, node, unavailable


def test_a_spot_node_without_spot_to_spot_is_only_deleted_in_a_pool_that_may_launch_spot() -> None:
    """Karpenter: "For spot nodes, Karpenter has deletion consolidation enabled by default" (the disruption docs);
    `computeConsolidation` sends every all-Spot candidate set whose replacement may be Spot to the spot-to-spot path,
    refused without the feature gate, whichever capacity type the cheapest replacement would have had. So the
    node stays, although an On-Demand g6.xlarge would be cheaper, and no solve is needed: its pod fits on no
    other node, so any plan needs a new one."""
    cluster, node, unavailable = _spot_node_whose_cheapest_home_is_on_demand()
    result, solves = _run(cluster, unavailable=unavailable)
    assert result.decisions == ()
    assert result.skipped[node].startswith("spot-to-spot"), result.skipped[node]
    assert solves == 0


def test_with_spot_to_spot_a_spot_node_is_replaced_by_spot_only() -> None:
    """With the gate on, Karpenter requires the replacement of Spot candidates to be Spot
    (`computeSpotToSpotConsolidation` adds `karpenter.sh/capacity-type In [spot]`), so where only On-Demand holds
    the pod, as here, the node stays rather than being replaced by On-Demand."""
    cluster, node, unavailable = _spot_node_whose_cheapest_home_is_on_demand(spotToSpot=True)
    result, _ = _run(cluster, unavailable=unavailable)
    assert result.decisions == ()
    assert result.skipped[node].startswith("spot-to-spot"), result.skipped[node]


def test_a_spot_node_only_deleted_is_solved_onto_the_other_nodes_without_opening_one() -> None:
    """Two one-GPU pods on a Spot g5.12xlarge, and another node (not a candidate) with one GPU free: each pod alone
    fits there, so the floor leaves the node to the solver, but not both. Any plan needs a new node, and the node
    may only be deleted: the solver is asked where the pods go on the nodes that stay, and packs no new node."""
    cluster = Cluster(pool_config())
    node = cluster.node("g5.12xlarge", capacity_type="spot")
    cluster.pods_on(node, 2, gpus=1, cpu="1", memory="4Gi")
    other = cluster.node("g5.12xlarge", capacity_type="spot",
                         node_annotations={"karpenter.sh/do-not-disrupt": "true"})
    cluster.pods_on(other, 3, gpus=1, cpu="1", memory="4Gi")
    solver = _Counting(cluster.config, cluster.catalog, cluster.clock)
    result = consolidate(cluster.config, solver, cluster.items(), claims=list(cluster.claims.values()))
    assert result.decisions == ()
    assert result.skipped[node].startswith("spot-to-spot"), result.skipped[node]
    assert solver.solves == 1 and solver.packed == 0


def test_a_spot_node_with_spot_to_spot_is_priced_against_spot_too() -> None:
    """A Spot g5.xlarge (0.41 USD/h) and sixteen one-GPU Spot types at 0.20–0.26 (On-Demand 0.90 and up): with
    spot-to-spot the node is replaced by the cheapest fifteen; without it the node is only deleted, and its pod
    fits on no other node: the floor answers."""
    types = [make_type("g5.xlarge")]
    offerings = make_offerings(("g5.xlarge",))
    for i in range(16):
        name = f"g9.x{i}large"
        types.append(InstanceType(name=name, vcpu=8, memory_mib=32768, gpus=1, gpu_devices=1, gpu_model="L4",
                                  gpu_manufacturer="NVIDIA", gpu_memory_mib=24576, max_pods=58))
        offerings += [Offering(instance_type=name, zone="us-east-1a", capacity_type="spot",
                               price_per_hour=round(0.20 + 0.004 * i, 4), interruption_band=1),
                      Offering(instance_type=name, zone="us-east-1a", capacity_type="on-demand",
                               price_per_hour=round(0.90 + 0.01 * i, 4))]
    for spot_to_spot in (True, False):
        cluster = Cluster(pool_config(spotToSpot=spot_to_spot), Catalog(types, offerings))
        node = cluster.node("g5.xlarge", capacity_type="spot")
        cluster.pod(node, gpus=1, cpu="3", memory="12Gi")
        result, solves = _run(cluster)
        if spot_to_spot:
            assert solves == 1 and result.decisions[0].replacements[0].capacity_type == "spot"
        else:
            assert solves == 0 and result.skipped[node].startswith("spot-to-spot")


def test_only_the_stranded_pods_are_priced(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a g5.12xlarge (On-Demand only), a two-GPU pod with room on another node and a one-GPU pod with none: the
    two together need a type no cheaper than the node, the stranded one alone a g6.xlarge. The floor leaves it to
    the solver, which moves one and replaces the node by the small type for the other."""
    cluster = _on_demand_cluster()
    node = cluster.node("g5.12xlarge")
    cluster.pod(node, gpus=2, cpu="1", memory="4Gi")
    cluster.pod(node, gpus=1, cpu="3", memory="4Gi")
    other = cluster.node("g5.12xlarge", node_annotations={"karpenter.sh/do-not-disrupt": "true"})
    cluster.pod(other, gpus=2, cpu="46", memory="64Gi")
    result, solves = _run(cluster, max_replacements=1)
    assert solves > 0
    assert len(result.decisions) == 1 and result.decisions[0].nodes == (node,)
    assert [c.instance_types[0] for c in result.decisions[0].replacements] == ["g6.xlarge"]
    assert result == _without_floor(cluster, monkeypatch, max_replacements=1)


def test_a_pod_with_room_on_another_node_is_not_stranded() -> None:
    """The four-GPU pod fits on the half-empty g5.48xlarge: the floor says nothing, the solver moves it."""
    cluster = Cluster(pool_config())
    snug = cluster.node("g5.12xlarge", capacity_type="spot")
    cluster.pod(snug, gpus=4, cpu="40", memory="64Gi")
    roomy = cluster.node("g5.48xlarge", capacity_type="spot")
    cluster.pod(roomy, gpus=4, cpu="40", memory="64Gi")
    result, solves = _run(cluster)
    assert solves > 0
    assert [d.nodes for d in result.decisions] == [(snug,)] and result.decisions[0].action == "delete"


def _two_one_gpu_nodes(extra: list[InstanceType], extra_offerings: list[Offering]) -> tuple[Cluster, str, str]:
    """Two On-Demand g5.xlarge (1.006 USD/h each), each with a one-GPU pod of 3 vCPUs: neither has room for the
    other's pod, and no type cheaper than a g5.xlarge holds one."""
    names = ("g5.xlarge", "g5.12xlarge")
    catalog = Catalog([make_type(n) for n in names] + extra,
                      [o for o in make_offerings(names) if o.capacity_type == "on-demand"] + extra_offerings)
    cluster = Cluster(make_config(make_pool(capacityTypes=["on-demand"],
                                            disruption={"budgets": [{"nodes": "100%"}], "underutilizedBelow": None})),
                      catalog)
    a, b = cluster.node("g5.xlarge"), cluster.node("g5.xlarge")
    cluster.pod(a, gpus=1, cpu="3", memory="8Gi")
    cluster.pod(b, gpus=1, cpu="3", memory="8Gi")
    return cluster, a, b


def test_a_pair_whose_every_part_is_priced_out_is_not_solved(monkeypatch: pytest.MonkeyPatch) -> None:
    """The multi-node search's pair: each node alone is priced out, and the two pods together need a g5.12xlarge
    (5.672 USD/h) where the pair costs 2.012. No solve at all; without the group floor the search solves the
    pair and finds what the floor knew."""
    cluster, a, b = _two_one_gpu_nodes([], [])
    result, solves = _run(cluster, max_replacements=1)
    assert result.decisions == () and solves == 0
    with monkeypatch.context() as patched:
        patched.setattr(GroupJudge, "priced_out", lambda self, group: False)
        unfloored, solves = _run(cluster, max_replacements=1)
    assert solves == 1 and unfloored == result


def test_a_floor_is_computed_once_per_group_until_a_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pair above: the multi-node search prices each node as a part of the pair, and the single-node phase
    asks for one of them again, with no decision in between: each group's stranded pods are found once."""
    cluster, a, b = _two_one_gpu_nodes([], [])
    asked: list[tuple[str, ...]] = []
    priced_out = GroupJudge._priced_out

    def asking(self: GroupJudge, group: Any) -> str | None:
        asked.append(tuple(sorted(n.name for n in group)))
        return priced_out(self, group)

    computed: list[tuple[str, ...]] = []
    stranded = FreeRooms.stranded

    def counted(self: FreeRooms, pods: Any, own: Any) -> Any:
        computed.append(tuple(sorted(n.name for n in own)))
        return stranded(self, pods, own)

    monkeypatch.setattr(GroupJudge, "_priced_out", asking)
    monkeypatch.setattr(FreeRooms, "stranded", counted)
    result, solves = _run(cluster, max_replacements=1)
    assert result.decisions == () and solves == 0
    # the pair's three parts, then one of its nodes alone (which one: the candidates' order among equals)
    assert sorted(set(asked)) == sorted([(a,), (b,), tuple(sorted((a, b)))]) and len(asked) == 4
    assert sorted(computed) == sorted(set(asked))


def test_a_pair_that_one_cheaper_node_holds_is_left_to_the_solver() -> None:
    """As above, with a two-GPU type at 1.50 USD/h: each node alone is still priced out, the pair is not, and the
    search replaces both nodes by the one cheaper node."""
    double = InstanceType(name="g9.2gpu", vcpu=16, memory_mib=65536, gpus=2, gpu_devices=2, gpu_model="A10G",
                          gpu_manufacturer="NVIDIA", gpu_memory_mib=49152, max_pods=58)
    offering = Offering(instance_type="g9.2gpu", zone="us-east-1a", capacity_type="on-demand", price_per_hour=1.5)
    cluster, a, b = _two_one_gpu_nodes([double], [offering])
    result, solves = _run(cluster, max_replacements=1)
    assert solves == 1
    assert [(sorted(d.nodes), [c.instance_types[0] for c in d.replacements]) for d in result.decisions] == [
        (sorted((a, b)), ["g9.2gpu"])]


def test_a_pair_not_all_spot_is_priced_against_spot_too() -> None:
    """A Spot g5.xlarge (0.41 USD/h) and an On-Demand g5.2xlarge (1.212) in a pool without spot-to-spot, one GPU pod
    on each. Each alone is priced out (the Spot one is only deleted, and its pod fits on no other node; the other's
    6-vCPU pod fits nothing cheaper than its node), but a Spot replacement of the two is allowed (not every node of
    the pair is Spot): a two-GPU type at 1.40 Spot holds both, and the search takes it."""
    double = InstanceType(name="g9.2gpu", vcpu=16, memory_mib=65536, gpus=2, gpu_devices=2, gpu_model="A10G",
                          gpu_manufacturer="NVIDIA", gpu_memory_mib=49152, max_pods=58)
    offerings = [o for o in make_offerings(("g5.xlarge", "g5.2xlarge"), zones=("us-east-1a",))
                 if o.instance_type == "g5.xlarge" or o.capacity_type == "on-demand"]
    offerings += [Offering(instance_type="g9.2gpu", zone="us-east-1a", capacity_type="spot", price_per_hour=1.4,
                           interruption_band=1),
                  Offering(instance_type="g9.2gpu", zone="us-east-1a", capacity_type="on-demand", price_per_hour=3.0)]
    cluster = Cluster(pool_config(), Catalog([make_type("g5.xlarge"), make_type("g5.2xlarge"), double], offerings))
    spot = cluster.node("g5.xlarge", capacity_type="spot")
    cluster.pod(spot, gpus=1, cpu="2", memory="4Gi")
    on_demand = cluster.node("g5.2xlarge")
    cluster.pod(on_demand, gpus=1, cpu="6", memory="4Gi")
    result, _ = _run(cluster, max_replacements=1)
    assert [(sorted(d.nodes), [(c.capacity_type, c.instance_types[0]) for c in d.replacements])
            for d in result.decisions] == [(sorted((spot, on_demand)), [("spot", "g9.2gpu")])]


def test_type_rooms_give_the_cheapest_type_holding_requests_in_any_pool() -> None:
    cluster = Cluster(pool_config())
    rooms = TypeRooms(cluster.config, cluster.catalog)
    spot = {name: row[9] if row[9] is not None else row[8] for name, row in TYPES.items()}
    assert rooms.cheapest(Resources({"nvidia.com/gpu": 1, "cpu": 1000, "pods": 1})) == spot["g6f.large"]
    one_gpu = Resources({"nvidia.com/gpu": 1, "cpu": 3000, "pods": 1})
    assert rooms.cheapest(one_gpu) == min(spot["g6.xlarge"], spot["g5.xlarge"]), "a g6f.large has 2 vCPUs"
    four_gpus = Resources({"nvidia.com/gpu": 4, "cpu": 40000, "pods": 1})
    assert rooms.cheapest(four_gpus) == spot["g5.12xlarge"]
    assert rooms.cheapest(Resources({"nvidia.com/gpu": 9, "pods": 1})) == float("inf")
    assert rooms.cheapest(Resources({"example.com/fpga": 1, "pods": 1})) == float("inf"), "nothing has it"


def test_free_rooms_compare_only_what_a_pod_asks_for_and_leave_out_its_own_node() -> None:
    own, other = object(), object()
    rooms = FreeRooms([(own, {"nvidia.com/gpu": 4, "cpu": 8000, "pods": 10}),
                       (other, {"nvidia.com/gpu": 1, "cpu": -500, "memory": 4096, "pods": 10})])
    gpu_only = Resources({"nvidia.com/gpu": 1, "pods": 1})
    with_cpu = Resources({"nvidia.com/gpu": 1, "cpu": 100, "pods": 1})
    assert rooms.stranded([gpu_only], [own]) == [], "the other node's overcommitted CPU does not keep it off"
    assert rooms.stranded([with_cpu], [own]) == [with_cpu]
    assert rooms.stranded([with_cpu], [other]) == [], "its own node aside, the first node has room"
    assert rooms.with_room([with_cpu]) == 0b01, "a bit per row: the first node only"
    assert rooms.with_room([with_cpu, gpu_only]) == 0b11
    assert rooms.with_room([Resources({"nvidia.com/gpu": 2, "pods": 1})]) == 0b01
    assert rooms.with_room([Resources({"example.com/fpga": 1, "pods": 1})]) == 0, "no node has it"
    assert rooms.row(own) == 0 and rooms.row(object()) is None


_ROOM_NAMES = ("cpu", "memory", "nvidia.com/gpu", "pods", "example.com/fpga")
_ROOM = st.dictionaries(st.sampled_from(_ROOM_NAMES), st.integers(-4, 12), max_size=5)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(free=st.lists(_ROOM, max_size=12), pods=st.lists(_ROOM.map(lambda r: {k: abs(v) for k, v in r.items()}),
                                                        min_size=1, max_size=6),
       own=st.sets(st.integers(0, 11), max_size=3))
def test_free_rooms_answer_as_fits_does_node_by_node(free: list[dict[str, int]], pods: list[dict[str, int]],
                                                    own: set[int]) -> None:
    """The bit masks against `fit.fits` asked of each node in turn: ties, over-committed room (negative) and
    resources a node does not list (zero) included."""
    nodes = [object() for _ in free]
    rooms = FreeRooms(list(zip(nodes, free, strict=True)))
    asked = [Resources(pod) for pod in pods]
    for pod in asked:
        expected = sum(1 << i for i, room in enumerate(free) if fits(pod, room))
        assert rooms.holding(pod) == expected
    assert rooms.with_room(asked) == sum(1 << i for i, room in enumerate(free) if any(fits(p, room) for p in asked))
    mine = [nodes[i] for i in own if i < len(nodes)]
    assert rooms.stranded(asked, mine) == [
        p for p in asked if not any(fits(p, room) for i, room in enumerate(free) if nodes[i] not in mine)]


def test_free_rooms_of_thousands_of_nodes_answer_as_fits_does_in_bounded_memory() -> None:
    """Past 256 nodes a resource keeps every ⌈n/256⌉th mask, not one per node (one per node: a 218 MB peak here)."""
    rng = random.Random(7)
    free = [{"cpu": rng.randint(-500, 96_000), "memory": rng.randint(0, 400_000), "nvidia.com/gpu": rng.randint(0, 8),
             "pods": rng.randint(0, 110)} for _ in range(20_000)]
    nodes = [object() for _ in free]
    tracemalloc.start()
    try:
        rooms = FreeRooms(list(zip(nodes, free, strict=True)))
        asked = [Resources({"cpu": rng.randint(1, 64_000), "memory": rng.randint(1, 200_000),
                            "nvidia.com/gpu": rng.randint(0, 4), "pods": 1}) for _ in range(20)]
        held = [rooms.holding(pod) for pod in asked]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40_000_000, f"{peak / 1e6:.0f} MB"
    for n in (511, 20_000):  # 511: one node short of a step of two, rounded up
        some = FreeRooms(list(zip(nodes[:n], free[:n], strict=True)))
        some.holding(Resources({"cpu": 1, "memory": 1, "nvidia.com/gpu": 1, "pods": 1}))
        assert [len(ranked.marks) <= 257 for ranked in some._by_resource.values()] == [True] * 4
    for pod, mask in zip(asked[:5], held[:5], strict=True):
        assert mask == sum(1 << i for i, room in enumerate(free) if fits(pod, room))


_NAMES = ("g5.xlarge", "g5.2xlarge", "g5.12xlarge", "g5.48xlarge", "g6.xlarge")
_NODE = st.tuples(st.sampled_from(_NAMES), st.sampled_from(("spot", "on-demand")),
                  st.lists(st.tuples(st.integers(1, 4), st.integers(1, 40), st.integers(1, 64)), max_size=4))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(nodes=st.lists(_NODE, min_size=1, max_size=6), one=st.booleans(), spot_to_spot=st.booleans())
def test_the_floor_never_turns_away_a_node_the_solver_would_take(
        nodes: list[tuple[str, str, list[tuple[int, int, int]]]], one: bool, spot_to_spot: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Random clusters, each node's pods within its GPUs, vCPUs and memory: the same decisions and the same nodes
    left alone with and without the floor; where the reasons differ, the floor's is its own "no saving"."""
    cluster = Cluster(pool_config(spotToSpot=spot_to_spot))
    for name, capacity_type, pods in nodes:
        node = cluster.node(name, capacity_type=capacity_type)
        vcpu, memory, gpus = TYPES[name][:3]
        for pod_gpus, cpu, gib in pods:
            if pod_gpus <= gpus and cpu < vcpu - 1 and gib * 1024 < memory * 0.8:
                gpus, vcpu, memory = gpus - pod_gpus, vcpu - cpu, memory - gib * 1024
                cluster.pod(node, gpus=pod_gpus, cpu=str(cpu), memory=f"{gib}Gi")
    kwargs = {"max_replacements": 1} if one else {}
    with_floor, _ = _run(cluster, **kwargs)
    without = _without_floor(cluster, monkeypatch, **kwargs)
    assert with_floor.decisions == without.decisions
    assert with_floor.skipped.keys() == without.skipped.keys()
    for node, why in with_floor.skipped.items():
        if why != without.skipped[node]:
            assert "fit on no other node" in why, (why, without.skipped[node])


_ON_DEMAND_NAMES = ("g5.xlarge", "g5.2xlarge", "g5.12xlarge", "g6.xlarge")
_ONE_POD_NODE = st.tuples(st.sampled_from(("g5.2xlarge", "g6.xlarge", "g6.xlarge", "g5.12xlarge")),
                          st.integers(1, 4), st.integers(1, 6))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(nodes=st.lists(_ONE_POD_NODE, min_size=2, max_size=5), one=st.booleans(),
       budget=st.sampled_from((2, 3, 5)), double_price=st.sampled_from((1.5, 3.0)))
def test_the_group_floor_never_turns_away_a_group_the_solver_would_take(
        nodes: list[tuple[str, int, int]], one: bool, budget: int, double_price: float,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On-Demand only, one pod a node (as many GPUs as asked up to the node's, a few vCPUs), a two-GPU type at
    1.50 or 3.00 USD/h (cheaper or not than two one-GPU nodes), and a budget of 2, 3 or 5 nodes (the multi-node
    search's largest group): the same decisions and the same nodes left alone with and without the floors,
    single and group alike."""
    double = InstanceType(name="g9.2gpu", vcpu=16, memory_mib=65536, gpus=2, gpu_devices=2, gpu_model="A10G",
                          gpu_manufacturer="NVIDIA", gpu_memory_mib=49152, max_pods=58)
    catalog = Catalog([make_type(n) for n in _ON_DEMAND_NAMES] + [double],
                      [o for o in make_offerings(_ON_DEMAND_NAMES) if o.capacity_type == "on-demand"]
                      + [Offering(instance_type="g9.2gpu", zone="us-east-1a", capacity_type="on-demand",
                                  price_per_hour=double_price)])
    cluster = Cluster(make_config(make_pool(capacityTypes=["on-demand"], disruption={
        "budgets": [{"nodes": str(budget)}], "underutilizedBelow": None})), catalog)
    for name, gpus, cpu in nodes:
        vcpu, _, most = TYPES[name][:3]
        cluster.pod(cluster.node(name), gpus=min(gpus, most), cpu=str(min(cpu, vcpu - 2)), memory="4Gi")
    kwargs = {"max_replacements": 1} if one else {}
    with_floor, _ = _run(cluster, **kwargs)
    with monkeypatch.context() as patched:
        patched.setattr(GroupJudge, "_priced_out", lambda self, group: None)
        without = _run(cluster, **kwargs)[0]
    assert with_floor.decisions == without.decisions
    assert with_floor.skipped.keys() == without.skipped.keys()

"""Consolidation, rule by rule, on the pure decision: what is removed or replaced, what is never touched."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from gpu_autoscaler.config import Disruption
from gpu_autoscaler.domain.catalog import Catalog
from gpu_autoscaler.domain.consolidation import (
    SPOT_TO_SPOT_MIN_TYPES,
    ConsolidationNode,
    Decision,
    consolidate,
    empty_wait,
    pod_set,
    pods_changed_at,
)
from gpu_autoscaler.domain.drain import DRAIN_TAINT
from gpu_autoscaler.domain.fleet import CAPACITY_TYPE_PINNED_ATTRIBUTE
from gpu_autoscaler.domain.packing.results import REQUESTS_ATTRIBUTE, requests_attribute
from gpu_autoscaler.domain.prewarm import FORECAST_HOLD, WARM_UNTIL_ATTRIBUTE
from gpu_autoscaler.models.catalog import InstanceType, Offering
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.labels import DO_NOT_DISRUPT
from gpu_autoscaler.models.requirements import NodeSelectorTerm, PreferredSchedulingTerm, Requirement
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint
from tests.unit.consolidation.builders import NOW, Cluster, make_config, make_pool, pool_config, wide_spot_catalog
from tests.unit.packing.builders import TYPES, make_catalog


def by_reason(result, reason: str):
    return [d for d in result.decisions if d.reason == reason]


def touched(result) -> set[str]:
    return {n for d in result.decisions for n in d.nodes}


# Empty nodes


def test_an_empty_node_goes_once_empty_for_consolidate_after() -> None:
    cluster = Cluster(pool_config(consolidateAfter="10m", emptyKeepLeadTimes=0))
    old = cluster.node(empty_for=timedelta(minutes=11))
    fresh = cluster.node(empty_for=timedelta(minutes=3))
    result = cluster.consolidate()
    [decision] = result.decisions
    assert (decision.reason, decision.action, decision.nodes) == ("Empty", "delete", (old,))
    assert decision.saving == pytest.approx(TYPES["g5.12xlarge"][8])
    assert decision.replacements == ()
    assert result.skipped[fresh].startswith("empty: not yet")


def test_an_empty_node_stays_two_lead_times_by_default_however_short_consolidate_after() -> None:
    """Removing an empty node and buying one back for the next pod costs a boot and that pod's wait: it is kept
    for what that would cost (the pool's lead time twice) before it goes."""
    disruption = {"consolidateAfter": "1m", "budgets": [{"nodes": "100%"}]}
    config = make_config(make_pool(leadTime="5m", disruption=disruption))
    cluster = Cluster(config)
    kept = cluster.node(empty_for=timedelta(minutes=9))
    gone = cluster.node(empty_for=timedelta(minutes=11))
    result = cluster.consolidate()
    assert [d.nodes for d in result.decisions] == [(gone,)]
    assert result.skipped[kept].startswith("empty: not yet for 0:10:00")
    assert empty_wait(config.node_pools[0]) == timedelta(minutes=10)


# Underutilized: delete onto others' room, replace, several into one


def test_a_node_whose_pods_fit_on_another_nodes_free_room_is_removed() -> None:
    cluster = Cluster(pool_config())
    lonely = cluster.node("g5.12xlarge")
    cluster.pod(lonely)
    roomy = cluster.node("g5.48xlarge", age=timedelta(minutes=5))  # too young to go, but takes pods
    cluster.pods_on(roomy, 3)
    result = cluster.consolidate()
    [decision] = result.decisions
    assert (decision.reason, decision.action, decision.nodes) == ("Underutilized", "delete", (lonely,))
    assert set(decision.destinations) == {roomy}
    assert decision.saving == pytest.approx(TYPES["g5.12xlarge"][8])


def _booting(cluster: Cluster, name: str, gpus: int) -> None:
    """The node as its device plugin leaves it until it registers: Ready, its GPUs not allocatable yet, its claim
    made for `gpus` of them."""
    cluster.update_node(name, allocatable=Resources({"cpu": 47000, "memory": 180 * 2**30, "pods": 200}))
    claim = cluster.claims[name]
    cluster.claims[name] = claim.model_copy(update={"attributes": {
        **claim.attributes, REQUESTS_ATTRIBUTE: requests_attribute({"nvidia.com/gpu": gpus})}})


def test_a_node_not_initialized_yet_takes_no_pods_moved_off_another() -> None:
    """Karpenter refuses a command whose scheduling simulation puts a pod onto a node not initialized yet
    (`SimulateScheduling`, pkg/controllers/disruption/helpers.go): the pass leaves the node alone until it is."""
    cluster = Cluster(pool_config())
    lonely = cluster.node("g5.12xlarge")
    cluster.pod(lonely)
    booting = cluster.node("g5.48xlarge", age=timedelta(minutes=5))
    cluster.pods_on(booting, 3)
    _booting(cluster, booting, 8)
    result = cluster.consolidate()
    assert all(booting not in d.destinations for d in result.decisions)
    assert lonely not in touched(result)
    assert result.skipped[lonely].startswith(f"uninitialized: its pods would go onto {booting}")
    _booting(cluster, booting, 0)  # its claim asked for no GPU: initialized, and no GPU is allocatable there
    result = cluster.consolidate()
    assert all(booting not in d.destinations for d in result.decisions)


def test_pods_on_their_way_to_a_node_keep_their_room_on_it() -> None:
    """Karpenter schedules the pending pods in the same simulation as the moving ones: they compete for the room.
    Here the room a node's pods on their way will take (what its claim was made for, less those of its pods already
    there) is not free for the moving pods."""
    cluster = Cluster(pool_config())
    lonely = cluster.node("g5.12xlarge")
    cluster.pods_on(lonely, 2)
    awaited = cluster.node("g5.12xlarge", age=timedelta(minutes=5))
    cluster.update_node(awaited, allocatable=Resources({"cpu": 48000, "memory": 192 * 2**30, "pods": 234,
                                                        "ephemeral-storage": 2**40, "nvidia.com/gpu": 4}))
    arrived = cluster.pod(awaited)
    claim = cluster.claims[awaited]
    cluster.claims[awaited] = claim.model_copy(update={"pods": (arrived.uid, "pod-b", "pod-c"), "attributes": {
        **claim.attributes,
        REQUESTS_ATTRIBUTE: requests_attribute({"nvidia.com/gpu": 3, "cpu": 3000, "memory": 12 * 2**30, "pods": 3})}})

    def items(incoming: int) -> list[ConsolidationNode]:
        return [replace(item, incoming=incoming) if item.node.name == awaited else item for item in cluster.items()]

    [decision] = consolidate(cluster.config, cluster.solver(), items(0), claims=list(cluster.claims.values())
                             ).decisions
    assert decision.action == "delete" and len(decision.destinations[awaited]) == 2  # four GPUs, one taken
    [decision] = consolidate(cluster.config, cluster.solver(), items(2), claims=list(cluster.claims.values())
                             ).decisions
    assert len(decision.destinations[awaited]) == 1 and len(decision.replacements) == 1  # two more on their way


def test_a_node_whose_pods_request_half_its_gpus_is_not_underused_unless_the_pool_weighs_every_node() -> None:
    """Cluster Autoscaler's scale-down GPU utilization threshold (0.5 by default): a node whose pods request half
    its GPUs or more is not weighed at all; one under half is. `underutilizedBelow: null` weighs every node, as
    Karpenter does."""
    assert Disruption().underutilized_below == 0.5

    def scene(**disruption: object) -> tuple[Cluster, str, str]:
        cluster = Cluster(pool_config(**disruption))
        busy = cluster.node("g5.12xlarge")
        cluster.pods_on(busy, 2)  # 2 of its 4 GPUs
        lonely = cluster.node("g5.12xlarge")
        cluster.pod(lonely)  # 1 of 4
        roomy = cluster.node("g5.48xlarge", age=timedelta(minutes=5))  # too young to go, but takes pods
        cluster.pods_on(roomy, 2)  # 2 of 8: room for all three pods
        return cluster, busy, lonely

    cluster, busy, lonely = scene(underutilizedBelow=0.5)
    result = cluster.consolidate()
    assert touched(result) == {lonely}
    assert result.skipped[busy] == "busy: its pods request 50% of its GPUs, not under the pool's underutilizedBelow 50%"
    cluster, busy, lonely = scene()  # pool_config weighs every node
    assert touched(cluster.consolidate()) == {busy, lonely}


def test_a_busy_node_whose_gpus_cost_four_times_the_cheapest_free_gpu_is_weighed_all_the_same() -> None:
    """Cluster Autoscaler's threshold keeps a busy node's room for the next arrivals; it must not keep pods on an
    On-Demand H100 node (6.88 USD per GPU-hour) while Spot A10G room (0.59) stands free: moving them saves more than
    buying that room back would cost. Room only 3.4 times cheaper (On-Demand A10G, 2.04) leaves it busy."""

    def scene(room_capacity_type: str) -> tuple[Cluster, str, str]:
        cluster = Cluster(pool_config(underutilizedBelow=0.5))
        dear = cluster.node("p5.48xlarge")
        cluster.pods_on(dear, 4)  # 4 of its 8 GPUs: busy by the threshold
        roomy = cluster.node("g5.48xlarge", capacity_type=room_capacity_type, age=timedelta(minutes=5))
        cluster.pods_on(roomy, 2)  # too young to go; 6 GPUs free
        return cluster, dear, roomy

    cluster, dear, roomy = scene("spot")
    [decision] = cluster.consolidate().decisions
    assert (decision.reason, decision.action, decision.nodes) == ("Underutilized", "delete", (dear,))
    assert set(decision.destinations) == {roomy}
    cluster, dear, roomy = scene("on-demand")
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[dear] == "busy: its pods request 50% of its GPUs, not under the pool's underutilizedBelow 50%"


def _beside(name: str, **sharing: object) -> Cluster:
    """A cluster of the default pool and a second one sharing its GPUs, both under Cluster Autoscaler's threshold."""
    disruption = {"budgets": [{"nodes": "100%"}], "underutilizedBelow": 0.5}
    shared = make_pool(name, weight=1, taints=[{"key": f"gpu-autoscaler/{name}", "value": "true",
                                                "effect": "NoSchedule"}], gpuSharing=sharing, disruption=disruption)
    return Cluster(make_config(make_pool(disruption=disruption), shared))


def test_time_sliced_slots_are_not_cheap_gpus() -> None:
    """A time-sliced node advertises each GPU as `replicas` slots: priced per slot, every whole-GPU node beside a
    time-slicing pool would look four times dearer and lose Cluster Autoscaler's threshold."""
    cluster = _beside("gpu-shared", mode="time-slicing", replicas=4)
    busy = cluster.node("g5.xlarge", capacity_type="spot")
    cluster.pod(busy)  # its one GPU: busy
    sliced = cluster.node("g5.xlarge", capacity_type="spot", pool="gpu-shared", age=timedelta(minutes=5))
    cluster.pod(sliced)  # 1 of its 4 slots: 0.10 USD per slot, 0.41 per GPU like the busy node's
    result = cluster.consolidate()
    assert result.skipped[busy].startswith("busy: its pods request 100% of its GPUs")


def test_mig_slices_are_not_cheap_gpus() -> None:
    """With the `single` strategy the device plugin advertises each MIG slice as `nvidia.com/gpu` (seven 1g.5gb
    slices to an A100): priced per slice, a Spot p4d.24xlarge would be a 0.13 USD GPU and every whole-GPU node
    beside it would look dear and lose Cluster Autoscaler's threshold. Per physical GPU it is 0.91, and an
    On-Demand A10G (1.006) is not four times that."""
    cluster = _beside("gpu-mig", mode="mig", migStrategy="single", migProfile="1g.5gb")
    busy = cluster.node("g5.xlarge")
    cluster.pod(busy)  # its one GPU: busy
    sliced = cluster.node("p4d.24xlarge", capacity_type="spot", pool="gpu-mig", age=timedelta(minutes=5))
    cluster.pod(sliced)  # 1 of its 56 slices
    result = cluster.consolidate()
    assert result.skipped[busy].startswith("busy: its pods request 100% of its GPUs")


def test_whole_gpus_in_a_mig_pool_are_priced_as_gpus() -> None:
    """A GPU without MIG (the A10G) keeps advertising whole GPUs in a MIG pool: its node's price per GPU is its
    price over its GPUs, not over the A100 slices a GPU of the pool's profile would have made of it (0.41 USD a
    GPU-hour, not seven times that: not dear beside Spot A10G room at 0.59)."""
    cluster = _beside("gpu-mig", mode="mig", migStrategy="single", migProfile="1g.5gb")
    busy = cluster.node("g5.xlarge", capacity_type="spot", pool="gpu-mig")
    cluster.pod(busy)  # its one GPU: busy
    roomy = cluster.node("g5.48xlarge", capacity_type="spot", age=timedelta(minutes=5))
    cluster.pods_on(roomy, 2)  # too young to go; 6 GPUs free at 0.59 USD each
    result = cluster.consolidate()
    assert result.skipped[busy].startswith("busy: its pods request 100% of its GPUs")


def test_a_fraction_of_a_gpu_is_not_a_cheap_gpu() -> None:
    """A g6f.large's one device is an eighth of an L4: 0.202 USD an hour is 1.62 a GPU, dearer than an On-Demand
    A10G (1.006), which a free g6f device must not make look four times dearer than the cheapest free GPU."""
    cluster = Cluster(pool_config(underutilizedBelow=0.5))
    busy = cluster.node("g5.xlarge")
    cluster.pod(busy)  # its one GPU: busy
    cluster.node("g6f.large", age=timedelta(minutes=5), empty_for=None)  # too young to go; its device free
    result = cluster.consolidate()
    assert result.skipped[busy].startswith("busy: its pods request 100% of its GPUs")


def test_a_busy_node_goes_into_sunk_room_but_not_into_room_a_cheaper_node_would_not_have() -> None:
    """Room on a node that stays (kept by the search, or busy itself) whose pods no cheaper new node would hold is paid
    for as long as they run: a busy node (over `underutilizedBelow`) whose pods all fit there is deleted. Room the pods
    of a dearer node do not need (a cheaper type would hold them) was bought for the next arrivals, and the threshold
    keeps it for them."""

    def scene(held_type: str, capacity_type: str, cpu: str = "1") -> tuple[Cluster, str, str]:
        cluster = Cluster(pool_config(underutilizedBelow=0.5))
        held = cluster.node(held_type, capacity_type=capacity_type)
        cluster.pod(held, cpu=cpu)  # 1 of its GPUs: under half, so weighed, and kept (see below)
        busy = cluster.node("g5.xlarge")
        cluster.pod(busy)  # its one GPU: busy
        return cluster, held, busy

    # Only a g5.48xlarge (or a dearer p5.48xlarge) has 150 vCPUs: the pod keeps its Spot node (only deleted, and the
    # pod fits on no other node), whose 7 free GPUs are sunk.
    cluster, held, busy = scene("g5.48xlarge", "spot", cpu="150")
    result = cluster.consolidate()
    [decision] = result.decisions
    assert (decision.reason, decision.action, decision.nodes) == ("Underutilized", "delete", (busy,))
    assert set(decision.destinations) == {held}
    assert decision.saving == pytest.approx(TYPES["g5.xlarge"][8])
    assert result.skipped[held].startswith("spot-to-spot: the pool does not opt in")
    # A Spot g5.12xlarge whose one pod fits nowhere else stays (Spot is only deleted), but a g5.xlarge would hold that
    # pod: its room is not sunk, and the busy node stays busy.
    cluster, held, busy = scene("g5.12xlarge", "spot")
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[busy] == ("busy: its pods request 100% of its GPUs, not under the pool's "
                                    "underutilizedBelow 50%")
    # A busy node's sunk room takes pods too: 4 of the g5.48xlarge's GPUs asked for (not under half), 4 free.
    cluster = Cluster(pool_config(underutilizedBelow=0.5))
    held = cluster.node("g5.48xlarge", capacity_type="spot")
    cluster.pod(held, gpus=4, cpu="150")
    busy = cluster.node("g5.xlarge")
    cluster.pod(busy)
    [decision] = cluster.consolidate().decisions
    assert (decision.action, decision.nodes, set(decision.destinations)) == ("delete", (busy,), {held})
    # Cluster Autoscaler's rule alone: a node over the threshold never goes.
    cluster = Cluster(pool_config(underutilizedBelow=0.5, intoSunkRoom=False))
    held = cluster.node("g5.48xlarge", capacity_type="spot")
    cluster.pod(held, cpu="150")
    busy = cluster.node("g5.xlarge")
    cluster.pod(busy)
    assert cluster.consolidate().decisions == ()


def test_a_pass_like_one_that_found_no_sunk_room_is_skipped_only_while_nothing_it_reads_has_changed() -> None:
    """`into_sunk_room` remembers the last pass that found nothing, by its node objects; the same nodes with other
    offerings marked unavailable are another question. Here the Spot g5.12xlarge's one pod has a cheaper home (a
    g5.xlarge) until every smaller offering is out of capacity: then its room is sunk, and the busy node goes."""
    cluster = Cluster(pool_config(underutilizedBelow=0.5))
    held = cluster.node("g5.12xlarge", capacity_type="spot")
    cluster.pod(held)
    busy = cluster.node("g5.xlarge")
    cluster.pod(busy)
    solver, items, claims = cluster.solver(), cluster.items(), list(cluster.claims.values())
    assert consolidate(cluster.config, solver, items, claims=claims).decisions == ()
    assert consolidate(cluster.config, solver, items, claims=claims).decisions == (), "the same nodes: nothing"
    smaller = [o.key for o in cluster.catalog.all_offerings() if o.instance_type not in ("g5.12xlarge", "g5.48xlarge")]
    [decision] = consolidate(cluster.config, solver, items, claims=claims, unavailable=smaller).decisions
    assert (decision.action, decision.nodes, set(decision.destinations)) == ("delete", (busy,), {held})


def test_a_busy_node_whose_pods_fit_sunk_room_one_by_one_but_not_together_costs_no_solve() -> None:
    """Whether a node's room is sunk is a solve the first time its shape is asked, and so is a deletion: neither is
    asked for a busy node whose pods, each fitting the hosts' room, do not fit it added up. Here the Spot
    g5.48xlarge's 150-vCPU pod leaves it ~42 vCPUs: three 11-vCPU pods of a busy g5.12xlarge go there, four do not."""

    def scene(pods: int) -> tuple[Cluster, str, str]:
        cluster = Cluster(pool_config(underutilizedBelow=0.5))
        held = cluster.node("g5.48xlarge", capacity_type="spot")
        cluster.pod(held, cpu="150")
        busy = cluster.node("g5.12xlarge")
        for _ in range(pods):
            cluster.pod(busy, cpu="11")
        return cluster, held, busy

    def solved(cluster: Cluster) -> tuple[tuple[Decision, ...], list[str]]:
        solver, sources = cluster.solver(), []
        solve = solver.solve

        def spy(pods, **kwargs):
            sources.append(kwargs.get("source", ""))
            return solve(pods, **kwargs)

        solver.solve = spy  # type: ignore[method-assign]
        result = consolidate(cluster.config, solver, cluster.items(), claims=list(cluster.claims.values()))
        return result.decisions, sources

    cluster, held, busy = scene(3)
    [decision], sources = solved(cluster)
    assert (decision.action, decision.nodes, set(decision.destinations)) == ("delete", (busy,), {held})
    assert any(s.startswith("consolidate:sunk:") for s in sources), "the held node's room was asked about"
    cluster, held, busy = scene(4)
    decisions, sources = solved(cluster)
    assert decisions == ()
    busy_claim = cluster.claims[busy].id
    assert not [s for s in sources if s.startswith("consolidate:sunk:") or busy_claim in s], sources


def test_a_node_over_committed_in_one_resource_does_not_hide_the_sunk_room_of_another() -> None:
    """A node whose pods ask more of a resource than it has (here a GPU over its eight) takes no pod (the solver gives
    it no room), and its deficit is not room less than none when the hosts' free room is added up: the busy
    g5.2xlarge's two pods, one GPU and 5 vCPUs, fit the one GPU the busy g5.48xlarge has free, beside it."""
    cluster = Cluster(pool_config(underutilizedBelow=0.5))
    one_free = cluster.node("g5.48xlarge", capacity_type="spot")
    cluster.pod(one_free, gpus=7, cpu="150")
    over = cluster.node("g5.48xlarge", capacity_type="spot")
    cluster.pod(over, gpus=9, cpu="100")
    busy = cluster.node("g5.2xlarge")
    cluster.pod(busy, gpus=1, cpu="1")
    cluster.pod(busy, gpus=0, cpu="4")  # fits the over-committed node's CPU too, on its own
    [decision] = cluster.consolidate().decisions
    assert (decision.action, decision.nodes, set(decision.destinations)) == ("delete", (busy,), {one_free})


def test_an_old_node_waits_consolidate_after_from_its_last_pod_event_not_from_its_creation() -> None:
    """Karpenter's consolidateAfter counts from the node's last pod event (`status.lastPodEventTime`): a node
    two hours old whose pods changed a minute ago is left alone; once unchanged that long, it goes."""
    cluster = Cluster(pool_config(consolidateAfter="5m"))
    lonely = cluster.node("g5.12xlarge")
    cluster.pod(lonely)
    roomy = cluster.node("g5.48xlarge", age=timedelta(minutes=5))  # too young to go, but takes pods
    cluster.pods_on(roomy, 3)
    cluster.pods_changed[lonely] = NOW - timedelta(minutes=1)
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[lonely].startswith("too young: under the pool's consolidateAfter since its last pod")
    cluster.pods_changed[lonely] = NOW - timedelta(minutes=5)
    [decision] = cluster.consolidate().decisions
    assert (decision.reason, decision.action, decision.nodes) == ("Underutilized", "delete", (lonely,))


def test_pod_events_are_pods_bound_or_gone_daemonsets_aside_and_terminating_counts_as_gone() -> None:
    cluster = Cluster(pool_config())
    node = cluster.node()
    running = cluster.pod(node, started_at=NOW - timedelta(minutes=7))
    daemon = cluster.pod(node, owner_kind="DaemonSet", started_at=NOW - timedelta(minutes=1))
    before = pod_set([running, daemon])
    assert pod_set([running]) == before, "a DaemonSet pod is no pod event"
    assert pod_set([running.model_copy(update={"deletion_timestamp": NOW})]) == pod_set([]), "terminating: gone"
    assert pod_set([running.model_copy(update={"phase": "Succeeded"})]) == pod_set([]), "finished: gone"
    assert pods_changed_at(None, None, before, [running, daemon], NOW) == NOW - timedelta(minutes=7)
    earlier = NOW - timedelta(minutes=3)
    assert pods_changed_at(earlier, before, before, [running, daemon], NOW) == earlier
    assert pods_changed_at(earlier, before, pod_set([]), [], NOW) == NOW


def test_a_half_empty_node_is_replaced_by_one_cheaper_node_whatever_the_fleet_picks() -> None:
    cluster = Cluster(pool_config())
    big = cluster.node("g5.48xlarge")
    [pod] = cluster.pods_on(big, 1, gpus=4, cpu="16", memory="64Gi")
    result = cluster.consolidate()
    [decision] = result.decisions
    assert (decision.reason, decision.action) == ("Underutilized", "replace")
    [replacement] = decision.replacements
    assert replacement.pods == (pod.uid,)
    assert replacement.state is ClaimState.PENDING
    assert replacement.attributes["replaces"] == cluster.claims[big].id
    before = TYPES["g5.48xlarge"][8]
    assert decision.price_before == pytest.approx(before)
    assert decision.saving > 0
    for name in replacement.instance_types:
        for zone in replacement.zones:
            price = cluster.catalog.price((name, zone, replacement.capacity_type))
            assert price is not None and price < before


def test_several_nodes_go_into_one_cheaper_node() -> None:
    cluster = Cluster(pool_config())
    nodes = [cluster.node("g5.12xlarge") for _ in range(3)]
    for name in nodes:
        cluster.pod(name, gpus=2, cpu="8", memory="32Gi")
    result = cluster.consolidate()
    [decision] = result.decisions
    assert decision.reason == "Underutilized" and set(decision.nodes) == set(nodes)
    assert len(decision.replacements) == 1
    assert decision.replacements[0].instance_types[0] == "g5.48xlarge"
    assert decision.price_after < decision.price_before


def _split_cluster() -> tuple[Cluster, str]:
    """An on-demand 8-GPU node holding two 30-vCPU pods: together they fit on no 4-GPU node (48 vCPU), so the
    cheapest placement, when no room is bought for pods to come, is two g5.12xlarge (2 × $5.672/h), not the
    g5.48xlarge ($16.288/h)."""
    disruption = {"budgets": [{"nodes": "100%"}]}
    config = make_config(make_pool(capacityTypes=["on-demand"], spareRoomWorth=0, disruption=disruption))
    cluster = Cluster(config, catalog=make_catalog(("g5.12xlarge", "g5.48xlarge")))
    big = cluster.node("g5.48xlarge")
    cluster.pods_on(big, 2, gpus=1, cpu="30")
    return cluster, big


def test_a_node_is_replaced_by_several_cheaper_nodes() -> None:
    cluster, big = _split_cluster()
    [decision] = cluster.consolidate().decisions
    assert (decision.action, decision.nodes) == ("replace", (big,))
    assert [c.instance_types[0] for c in decision.replacements] == ["g5.12xlarge", "g5.12xlarge"]


def test_with_max_replacements_1_a_node_whose_pods_need_two_new_nodes_stays() -> None:
    """Karpenter's rule, for the simulator's karpenter-like baselines: a candidate whose pods would need more than
    one new NodeClaim is not consolidated ("Can't remove without creating N candidates", `computeConsolidation`,
    kubernetes-sigs/karpenter pkg/controllers/disruption/consolidation.go)."""
    cluster, big = _split_cluster()
    result = cluster.consolidate(max_replacements=1)
    assert result.decisions == ()
    assert result.skipped[big].startswith("too many replacements: its pods need 2 new nodes")


def test_with_max_replacements_1_multi_node_consolidation_launches_at_most_one_node() -> None:
    """The same rule for a group (Karpenter's multi-node consolidation calls the same `computeConsolidation`): two
    8-GPU nodes of one 30-vCPU pod each are cheapest as two g5.12xlarge; bounded, one node's pod moves onto the
    other's room instead. Which of the two goes is the candidates' order (equal use and price: by name, and the
    names come from a counter the whole test session shares), so either may."""
    cluster, big = _split_cluster()
    cluster.pods.clear()
    first = cluster.pod(big, cpu="30")
    other = cluster.node("g5.48xlarge")
    second = cluster.pod(other, cpu="30")
    [unbounded] = cluster.consolidate().decisions
    assert set(unbounded.nodes) == {big, other} and len(unbounded.replacements) == 2
    [bounded] = cluster.consolidate(max_replacements=1).decisions
    assert bounded.action == "delete" and bounded.nodes in {(big,), (other,)}
    kept, moved = (other, first.uid) if bounded.nodes == (big,) else (big, second.uid)
    assert bounded.destinations == {kept: (moved,)}


def test_full_nodes_are_not_swapped_for_their_own_type_to_carry_off_one_removable_node() -> None:
    """Issue 19, the chaos soak: one node whose pod fits on a spare node's room, taken in one group with full
    nodes, made a 'saving' of exactly that node while every full node was replaced by a new one of its own type at
    its own price (30 launches for one node's worth, every tick). As Karpenter's multi-node consolidation
    (`filterOutSameInstanceType`), a replacement of a type the group holds must be cheaper than that node, or the
    removable node is just deleted on its own."""
    config = pool_config(spotToSpot=True, consolidateAfter="10m")
    cluster = Cluster(config, catalog=make_catalog(("g5.xlarge", "g5.12xlarge")))
    spare = cluster.node("g5.12xlarge", capacity_type="spot", age=timedelta(minutes=5))  # too young to go
    cluster.pod(spare, cpu="8")
    small = cluster.node("g5.12xlarge", capacity_type="spot")
    cluster.pod(small, cpu="8")  # fits on the spare node, not beside a full node's 40 vCPU
    full = [cluster.node("g5.12xlarge", capacity_type="spot") for _ in range(3)]
    for name in full:
        cluster.pod(name, cpu="40")
    result = cluster.consolidate()
    assert [(d.action, d.nodes) for d in result.decisions] == [("delete", (small,))]
    assert set(result.decisions[0].destinations) == {spare}
    assert not touched(result) & set(full)


def test_two_half_full_nodes_become_one_by_a_delete_not_by_a_new_node_of_their_type() -> None:
    """Issue 19, the throttling soak: nodes left half full (their second pod bound elsewhere) were merged pairwise
    into new nodes of their own type; one goes onto the other's free room instead, and nothing is launched."""
    cluster = Cluster(pool_config(spotToSpot=True), catalog=make_catalog(("g5.xlarge", "g5.12xlarge")))
    halves = [cluster.node("g5.12xlarge", capacity_type="spot") for _ in range(2)]
    for name in halves:
        cluster.pod(name, gpus=2, cpu="8", memory="32Gi")
    [decision] = cluster.consolidate().decisions
    assert (decision.action, decision.replacements) == ("delete", ())
    assert {*decision.nodes, *decision.destinations} == set(halves)


def _repack_catalog() -> Catalog:
    """Two on-demand types priced like g6.48xlarge and g6e.24xlarge on Spot: 8 GPUs, or 4 with as much memory, for
    about the same price."""
    types = [InstanceType(name="g6.48xlarge", vcpu=192, memory_mib=786432, gpus=8, gpu_devices=8, gpu_model="L4",
                          gpu_manufacturer="NVIDIA", gpu_memory_mib=196608, max_pods=345),
             InstanceType(name="g6e.24xlarge", vcpu=96, memory_mib=786432, gpus=4, gpu_devices=4, gpu_model="L40S",
                          gpu_manufacturer="NVIDIA", gpu_memory_mib=196608, max_pods=345)]
    offerings = [Offering(instance_type=name, zone="us-east-1a", capacity_type="on-demand", price_per_hour=price)
                 for name, price in (("g6.48xlarge", 4.0), ("g6e.24xlarge", 3.9))]
    return Catalog(types, offerings)


def test_a_group_repacked_onto_fewer_nodes_of_a_type_it_holds_is_not_taken_for_a_swap() -> None:
    """The consolidation benchmark's cluster 2: an 8-GPU node full of two 4-GPU pods, two 4-GPU high-memory nodes
    each with a 340 GiB pod and small ones, and a node of small pods become two 8-GPU nodes, each holding one pod of
    each kind. A replacement re-buys the 8-GPU node's type at its price but carries other pods than it: no swap, and
    the group saves one node's price more than without that node (a swap is a replacement carrying every pod of a
    node of its own type, as in the tests above)."""
    cluster = Cluster(pool_config(), catalog=_repack_catalog())
    spare = cluster.node("g6e.24xlarge")
    cluster.pods_on(spare, 2, cpu="2", memory="32Gi")  # the emptiest: leads the candidates
    wide = cluster.node("g6.48xlarge")
    cluster.pods_on(wide, 2, gpus=4, cpu="16", memory="64Gi")
    deep = [cluster.node("g6e.24xlarge") for _ in range(2)]
    for name in deep:
        cluster.pod(name, cpu="8", memory="340Gi")
        cluster.pods_on(name, 2, cpu="2", memory="32Gi")
    result = cluster.consolidate()
    assert sum(len(d.replacements) for d in result.decisions) <= 2
    assert sum(d.saving for d in result.decisions) == pytest.approx(3 * 3.9 + 4.0 - 2 * 4.0)
    assert touched(result) == {spare, wide, *deep}


def test_a_repack_that_launches_as_many_nodes_as_it_drains_is_not_taken() -> None:
    """Two 8-GPU nodes, each with a 4-GPU pod and a one-GPU pod, would cost less as one 8-GPU node of both 4-GPU pods
    and two one-GPU nodes, but that re-buys their type to drain two nodes with three launches: a repack is taken only
    when it leaves fewer nodes than it drains (each launch a boot and a chance of Spot reclaim; Karpenter, with its one
    replacement, would not take it either)."""
    catalog = _repack_catalog()
    small = InstanceType(name="g6.xlarge", vcpu=4, memory_mib=16384, gpus=1, gpu_devices=1, gpu_model="L4",
                         gpu_manufacturer="NVIDIA", gpu_memory_mib=24576, max_pods=58)
    catalog = Catalog([*(catalog.instance_type(n) for n in ("g6.48xlarge", "g6e.24xlarge")), small],
                      [*catalog.all_offerings(), Offering(instance_type="g6.xlarge", zone="us-east-1a",
                                                          capacity_type="on-demand", price_per_hour=0.41)])
    cluster = Cluster(pool_config(), catalog=catalog)
    halves = [cluster.node("g6.48xlarge") for _ in range(2)]
    for name in halves:
        cluster.pod(name, gpus=4, cpu="16", memory="64Gi")
        cluster.pod(name)
    result = cluster.consolidate()
    assert result.decisions == ()
    assert all(result.skipped[name].startswith("no saving") for name in halves)


def test_a_node_with_nothing_cheaper_for_its_pods_stays() -> None:
    cluster = Cluster(pool_config(spotToSpot=True))  # without it, a Spot node is only deleted
    snug = cluster.node("g6.xlarge", capacity_type="spot")
    cluster.pod(snug)
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[snug].startswith("no saving")


def test_pods_keep_their_constraints_when_the_packer_places_them() -> None:
    cluster = Cluster(pool_config())
    big = cluster.node("g5.48xlarge")
    cluster.pod(big, node_selector={"karpenter.k8s.aws/instance-gpu-name": "a10g"})
    [decision] = cluster.consolidate().decisions
    [replacement] = decision.replacements
    assert all(name.startswith("g5.") for name in replacement.instance_types)  # not the cheaper L4 of g6


def test_a_pod_is_not_moved_away_from_the_zone_its_volumes_attach_in() -> None:
    """A pod whose EBS volume lives in us-east-1a, alone on a node there, and a young node with room in
    us-east-1b: kube-scheduler's VolumeBinding filter refuses every 1b node for it, so the move would leave it
    Pending. Karpenter's consolidation simulates scheduling through the provisioner, which carries the pods'
    volume topology (`VolumeTopology.Inject`, pkg/controllers/provisioning/scheduling/volumetopology.go)."""
    cluster = Cluster(pool_config())
    lonely = cluster.node("g5.12xlarge", zone="us-east-1a")
    roomy = cluster.node("g5.48xlarge", zone="us-east-1b", age=timedelta(minutes=5))
    cluster.pods_on(roomy, 3, labels={"app": "other"})
    cluster.pod(lonely, volume_claims=("data-notebook-0",), volume_zones=("us-east-1a",), owner_kind="StatefulSet")
    result = cluster.consolidate()
    assert not any(roomy in d.destinations for d in result.decisions), result.decisions
    assert all(c.zones == ("us-east-1a",) for d in result.decisions for c in d.replacements), result.decisions


def test_a_pod_preferring_on_demand_is_moved_onto_on_demand_only() -> None:
    """Karpenter's consolidation simulates the moved pods through the provisioning scheduler, preferences taken as
    required first (disruption helpers.go `SimulateScheduling`; preferences.go `Relax` only when nothing fits): a
    pod that prefers On-Demand on a half-empty On-Demand node is replaced onto a cheaper On-Demand node, not onto
    the pool's Spot, and is not moved onto a Spot node's room."""
    cluster = Cluster(pool_config())
    big = cluster.node("g5.48xlarge")
    roomy = cluster.node("g5.48xlarge", capacity_type="spot", age=timedelta(minutes=5))
    cluster.pods_on(roomy, 4, gpus=1, labels={"app": "other"})
    prefer = PreferredSchedulingTerm.model_validate({"weight": 1, "preference": {"matchExpressions": [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}})
    pod = cluster.pod(big, gpus=4, cpu="16", memory="64Gi", preferred_node_affinity=(prefer,))
    result = cluster.consolidate()
    decision = next(d for d in result.decisions if big in d.nodes)
    assert roomy not in decision.destinations, decision
    assert [(c.capacity_type, c.pods) for c in decision.replacements] == [("on-demand", (pod.uid,))]


def _family(*families: str) -> tuple[NodeSelectorTerm, ...]:
    return (NodeSelectorTerm(match_expressions=(
        Requirement(key="karpenter.k8s.aws/instance-family", operator="In", values=families),)),)


def test_pods_with_different_affinities_on_one_node_are_weighed_together() -> None:
    cluster = Cluster(pool_config())
    big = cluster.node("g5.48xlarge")
    strict = cluster.pod(big, required_node_affinity=_family("g5"))
    loose = cluster.pod(big, required_node_affinity=_family("g5", "g6"))
    [decision] = cluster.consolidate().decisions
    assert (decision.action, decision.nodes) == ("replace", (big,))
    placed = {uid: c for c in decision.replacements for uid in c.pods}
    assert set(placed) == {strict.uid, loose.uid}
    assert all(name.startswith("g5.") for name in placed[strict.uid].instance_types)
    assert all(name.startswith(("g5.", "g6.")) for name in placed[loose.uid].instance_types)


def test_nodes_alike_but_for_their_pods_order_are_judged_alike() -> None:
    cluster = Cluster(pool_config(spotToSpot=True))  # judged on price: without it, Spot nodes are only deleted
    first, second = cluster.node("g6.xlarge", capacity_type="spot"), cluster.node("g6.xlarge", capacity_type="spot")
    for node, order in ((first, ("g6", "g5")), (second, ("g5", "g6"))):
        for family in order:
            cluster.pod(node, gpus=0, cpu="1500m", memory="1Gi",
                        required_node_affinity=_family(family) if family == "g6" else _family("g6", family))
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[first].startswith("no saving")
    assert result.skipped[second] == result.skipped[first]


def test_when_empty_policy_removes_empty_nodes_only() -> None:
    cluster = Cluster(pool_config(consolidationPolicy="WhenEmpty"))
    empty = cluster.node()
    busy = cluster.node("g5.48xlarge")
    cluster.pod(busy)
    assert touched(cluster.consolidate()) == {empty}


# Never touched


def test_a_node_with_a_do_not_disrupt_pod_survives() -> None:
    cluster = Cluster(pool_config())
    guarded = cluster.node("g5.48xlarge")
    cluster.pod(guarded, annotations={DO_NOT_DISRUPT: "true"})
    cluster.pod(guarded)
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[guarded].startswith("do-not-disrupt")


def test_a_do_not_disrupt_daemonset_pod_keeps_its_node_a_pod_on_its_way_out_does_not() -> None:
    """Karpenter's `ValidatePodsDisruptable`: DaemonSet and mirror pods may block disruption with the annotation;
    a pod that is terminating or finished protects nothing (`IsDisruptable`)."""
    cluster = Cluster(pool_config(consolidateAfter="10m", emptyKeepLeadTimes=0))
    daemon = cluster.node()
    cluster.pod(daemon, gpus=0, owner_kind="DaemonSet", annotations={DO_NOT_DISRUPT: "true"})
    leaving = cluster.node("g5.48xlarge")
    cluster.pod(leaving, owner_kind="StatefulSet", deletion_timestamp=NOW - timedelta(seconds=5),
                annotations={DO_NOT_DISRUPT: "true"})
    done = cluster.node()
    cluster.pod(done, gpus=0, owner_kind="DaemonSet", phase="Succeeded", annotations={DO_NOT_DISRUPT: "true"})
    result = cluster.consolidate()
    assert result.skipped[daemon].startswith("do-not-disrupt: pod team/")
    assert touched(result) == {leaving, done}


def test_a_node_whose_pod_a_disruption_budget_protects_survives() -> None:
    cluster = Cluster(pool_config())
    protected = cluster.node("g5.48xlarge")
    pod = cluster.pod(protected)
    cluster.blocked.add(pod.uid)
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[protected].startswith("pdb")


def test_young_nodes_and_nodes_with_pods_on_their_way_survive() -> None:
    cluster = Cluster(pool_config(minNodeAge="10m", consolidateAfter="1m"))
    young = cluster.node(age=timedelta(minutes=5))
    awaited = cluster.node()
    items = [
        item if item.node.name != awaited else ConsolidationNode(item.node, item.claim, item.pods,
                                                                 item.empty_since, incoming=2)
        for item in cluster.items()
    ]
    result = consolidate(cluster.config, cluster.solver(), items)
    assert result.decisions == ()
    assert result.skipped[young].startswith("too young")
    assert result.skipped[awaited].startswith("incoming")


def test_a_replacement_waits_for_the_pods_of_the_nodes_it_replaces() -> None:
    cluster = Cluster(pool_config(minNodeAge="0s", consolidateAfter="0s"))
    old = cluster.node("g5.48xlarge")
    cluster.pod(old, gpus=4, cpu="16", memory="64Gi")
    cluster.claims[old] = cluster.claims[old].model_copy(update={"state": ClaimState.DRAINING})
    new = cluster.node(attributes={"replaces": cluster.claims[old].id}, age=timedelta(minutes=1))
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[new].startswith("incoming: it replaces")
    del cluster.claims[old]  # drained and gone
    cluster.nodes = [n for n in cluster.nodes if n.name != old]
    assert touched(cluster.consolidate()) == {new}


def test_warm_capacity_survives_while_its_window_holds_it_and_not_after() -> None:
    cluster = Cluster(pool_config())
    until = (NOW + timedelta(hours=1)).isoformat()
    window = cluster.node(warm="window:peak", attributes={WARM_UNTIL_ATTRIBUTE: until})
    forecast = cluster.node(warm="forecast", attributes={WARM_UNTIL_ATTRIBUTE: until})
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[window] == "warm: held by window:peak"
    assert result.skipped[forecast] == "warm: held by forecast"
    cluster.clock.advance(timedelta(minutes=30))
    cluster.claims[forecast] = cluster.claims[forecast].model_copy(update={"warm": None})  # released
    assert touched(cluster.consolidate()) == {forecast}
    cluster.clock.advance(timedelta(minutes=31))  # the window has closed
    assert touched(cluster.consolidate()) == {window, forecast}


def test_a_forecast_hold_no_prewarm_tick_renews_ends_by_itself() -> None:
    """Prewarm failing for good (its configuration, its permissions, a bug: Lambda drops a failed tick after its
    retries) must not hold the forecast's nodes for ever: the hold ends at the `warmUntil` the last tick wrote."""
    cluster = Cluster(pool_config())
    until = NOW + FORECAST_HOLD
    forecast = cluster.node(warm="forecast", attributes={WARM_UNTIL_ATTRIBUTE: until.isoformat()})
    unrenewed = cluster.node(warm="forecast")  # held before holds had an end: the next tick gives it one
    result = cluster.consolidate()
    assert result.skipped[forecast] == "warm: held by forecast"
    assert touched(result) == {unrenewed}
    cluster.clock.advance(FORECAST_HOLD + timedelta(minutes=1))  # no prewarm tick since
    assert touched(cluster.consolidate()) == {forecast, unrenewed}


def test_nodes_not_ours_not_ready_or_being_drained_are_left_alone() -> None:
    cluster = Cluster(pool_config())
    theirs = cluster.node()
    del cluster.claims[theirs]
    draining = cluster.node()
    cluster.claims[draining] = cluster.claims[draining].model_copy(update={"state": ClaimState.DRAINING})
    cordoned = cluster.node()
    cluster.update_node(cordoned, unschedulable=True)
    assert cluster.consolidate().decisions == ()


# Budgets


def test_budgets_hold_with_many_candidates() -> None:
    for nodes, expected in (("3", 3), ("10%", 2), ("25%", 5)):
        cluster = Cluster(pool_config(budgets=[{"nodes": nodes}]))
        for _ in range(20):
            cluster.node()
        result = cluster.consolidate()
        assert len(touched(result)) == expected, nodes
        assert sum(why.startswith("budget") for why in result.skipped.values()) == 20 - expected


def test_nodes_already_draining_use_up_the_budget() -> None:
    cluster = Cluster(pool_config(budgets=[{"nodes": "3"}]))
    for _ in range(10):
        cluster.node()
    for name in list(cluster.claims)[:2]:
        cluster.claims[name] = cluster.claims[name].model_copy(update={"state": ClaimState.DRAINING})
    assert len(cluster.consolidate().decisions) == 1


def test_a_percentage_budget_is_of_the_initialized_nodes() -> None:
    """Karpenter's `BuildDisruptionBudgetMapping` counts only initialized nodes towards a pool's total, so that
    replacements still booting do not round a percentage up into more disruptions of the nodes that serve."""
    cluster = Cluster(pool_config(budgets=[{"nodes": "20%"}]))
    for _ in range(5):
        cluster.node()
    booting = [cluster.node(attributes={"requests": '{"nvidia.com/gpu": 1}'}) for _ in range(3)]
    for name in booting:
        cluster.update_node(name, ready=False)
    tainted = cluster.node()
    cluster.update_node(tainted, Taint(key="node.cloudprovider.kubernetes.io/uninitialized", value="true",
                                       effect="NoSchedule"))
    result = cluster.consolidate()
    assert len(touched(result)) == 1  # 20 % of the 5 initialized nodes, not of 9
    assert touched(result).isdisjoint({*booting, tainted})


def test_an_initialized_node_that_is_not_ready_uses_up_the_budget() -> None:
    """Karpenter counts a NotReady node among those being disrupted: while a node is down, voluntary disruption
    takes fewer of the others. It was initialized (its GPUs are allocatable), so it counts in the total too."""
    cluster = Cluster(pool_config(budgets=[{"nodes": "2"}]))
    for _ in range(5):
        cluster.node()
    down = cluster.node(attributes={"requests": '{"nvidia.com/gpu": 1}'})
    cluster.update_node(down, Taint(key="node.kubernetes.io/unreachable", value="", effect="NoSchedule"),
                        ready=False, allocatable=Resources.from_quantities({"nvidia.com/gpu": "4"}))
    result = cluster.consolidate()
    assert len(touched(result)) == 1
    assert down not in touched(result)


def test_a_warm_node_still_booting_uses_up_no_budget() -> None:
    """A claim held warm records no requests: its node, registered NotReady and tainted uninitialized as EKS
    registers one, was never initialized, so Karpenter neither counts it nor counts it as disrupting
    (`helpers.go` skips nodes not `Initialized()`). Counted as a NotReady node, it took the budget of "1" and the
    empty node beside it stayed."""
    cluster = Cluster(pool_config(budgets=[{"nodes": "1"}]))
    empty = cluster.node()
    booting = cluster.node(attributes={})
    cluster.update_node(booting, Taint(key="node.cloudprovider.kubernetes.io/uninitialized", value="true",
                                       effect="NoSchedule"),
                        Taint(key="node.kubernetes.io/not-ready", value="", effect="NoSchedule"), ready=False)
    assert touched(cluster.consolidate()) == {empty}


def test_multi_node_consolidation_stays_within_the_budget() -> None:
    cluster = Cluster(pool_config(budgets=[{"nodes": "3"}]))
    for _ in range(10):
        cluster.pod(cluster.node("g5.12xlarge"))
    result = cluster.consolidate()
    assert 0 < len(touched(result)) <= 3


def test_a_budget_bounds_only_its_reasons_and_only_while_its_schedule_holds() -> None:
    config = pool_config(budgets=[{"nodes": "0", "reasons": ["Empty"]}, {"nodes": "100%"}])
    cluster = Cluster(config)
    empty = cluster.node()
    busy = cluster.node("g5.48xlarge")
    cluster.pod(busy)
    result = cluster.consolidate()
    assert touched(result) == {busy}
    assert result.skipped[empty].startswith("budget")
    # Business hours (09:00-17:00 UTC): nothing; NOW is 10:00 UTC.
    office = pool_config(budgets=[{"nodes": "0", "schedule": "0 9 * * *", "duration": "8h"}, {"nodes": "100%"}])
    cluster = Cluster(office)
    cluster.node()
    assert cluster.consolidate().decisions == ()
    cluster.clock.advance(timedelta(hours=8))
    assert len(cluster.consolidate().decisions) == 1


# Drift


def test_a_node_on_an_old_image_is_replaced_as_drifted() -> None:
    cluster = Cluster(pool_config())
    old = cluster.node("g6.xlarge", capacity_type="spot", attributes={"imageId": "ami-0000000000000000a"})
    cluster.pod(old)
    [decision] = cluster.consolidate().decisions
    assert (decision.reason, decision.action, decision.nodes) == ("Drifted", "replace", (old,))
    assert "image ami-0000000000000000a" in decision.detail
    assert len(decision.replacements) == 1


def test_a_node_outside_its_pools_requirements_or_settings_drifts() -> None:
    config = pool_config()
    pool = config.node_pools[0].model_copy(update={"requirements": [
        Requirement(key="karpenter.k8s.aws/instance-family", operator="In", values=("g6",))]})
    narrowed = config.model_copy(update={"node_pools": [pool]})
    cluster = Cluster(narrowed)
    g5 = cluster.node("g5.xlarge", capacity_type="spot")
    cluster.pod(g5)
    changed = cluster.node("g6.xlarge", capacity_type="spot", attributes={"poolHash": "0000000000000000"})
    cluster.pod(changed)
    result = cluster.consolidate()
    drifted = {n: d for d in by_reason(result, "Drifted") for n in d.nodes}
    assert set(drifted) == {g5, changed}
    assert "no longer meets" in drifted[g5].detail
    assert "settings" in drifted[changed].detail


def test_drift_waits_for_its_budget() -> None:
    cluster = Cluster(pool_config(budgets=[{"nodes": "0", "reasons": ["Drifted"]}, {"nodes": "100%"}]))
    old = cluster.node("g6.xlarge", capacity_type="spot", attributes={"imageId": "ami-0000000000000000a"})
    cluster.pod(old)
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[old].startswith("budget") and "Drifted" in result.skipped[old]


def test_the_nodes_of_a_pool_gone_from_the_configuration_are_replaced_or_deleted_whatever_the_budgets() -> None:
    """Karpenter's NodeClaims are owned by their NodePool: deleting it deletes them, drained but not budgeted. Here
    they drift: each replaced where its pods need room, deleted when empty, none held by a budget (the pool whose
    budgets would bound them is gone) nor by its warm hold (prewarm no longer tends that pool); do-not-disrupt and
    PodDisruptionBudgets still keep a node until they allow it."""
    cluster = Cluster(pool_config(budgets=[{"nodes": "0"}]))
    busy = [cluster.node("g5.12xlarge", pool="retired", warm="forecast") for _ in range(3)]
    for name in busy:
        cluster.pod(name, gpus=4, cpu="16", memory="64Gi")
    empty = cluster.node("g5.12xlarge", pool="retired", age=timedelta(minutes=1))
    guarded = cluster.node("g5.12xlarge", pool="retired")
    cluster.pod(guarded, annotations={DO_NOT_DISRUPT: "true"})
    result = cluster.consolidate()
    drifted = {n: d for d in by_reason(result, "Drifted") for n in d.nodes}
    assert set(drifted) == {*busy, empty} and len(result.decisions) == 4
    assert all(drifted[n].action == "replace" and "pool retired is no longer configured" in drifted[n].detail
               for n in busy)
    assert all(c.pool == "gpu" for n in busy for c in drifted[n].replacements)
    assert drifted[empty].action == "delete"
    assert result.skipped[guarded].startswith("do-not-disrupt")


def _graced(grace: str | None) -> Cluster:
    """One pool whose budgets allow everything, with `terminationGracePeriod` `grace`."""
    pool = make_pool(disruption={"budgets": [{"nodes": "100%"}], "underutilizedBelow": None},
                     **({"terminationGracePeriod": grace} if grace else {}))
    return Cluster(make_config(pool))


def test_a_termination_grace_period_lets_drift_start_past_pods_that_block_eviction() -> None:
    """Karpenter's Eventual class (drift): with the NodePool's terminationGracePeriod set, a do-not-disrupt or
    PDB-blocked pod does not keep a drifted node from being a candidate ("drifted nodes will begin draining even if
    there are pods blocking eviction"); the drain holds such pods until the grace period ends."""
    for blocking in ("do-not-disrupt", "pdb"):
        cluster = _graced("1h")
        old = cluster.node("g6.xlarge", capacity_type="spot", attributes={"imageId": "ami-0000000000000000a"})
        if blocking == "pdb":
            cluster.blocked.add(cluster.pod(old).uid)
        else:
            cluster.pod(old, annotations={DO_NOT_DISRUPT: "true"})
        [decision] = cluster.consolidate().decisions
        assert (decision.reason, decision.nodes) == ("Drifted", (old,)), blocking


def test_without_a_termination_grace_period_pods_that_block_eviction_hold_off_drift() -> None:
    cluster = _graced(None)
    old = cluster.node("g6.xlarge", capacity_type="spot", attributes={"imageId": "ami-0000000000000000a"})
    cluster.pod(old, annotations={DO_NOT_DISRUPT: "true"})
    result = cluster.consolidate()
    assert result.decisions == () and result.skipped[old].startswith("do-not-disrupt: pod")


def test_a_termination_grace_period_does_not_open_other_reasons_or_a_node_annotated_do_not_disrupt() -> None:
    """Only pod-level blocks are set aside (Karpenter's `IgnorePodBlockEvictionError`), and only for drift: an
    undrifted node with a do-not-disrupt pod is not consolidated, a drifted Node annotated do-not-disrupt is kept."""
    cluster = _graced("1h")
    idle = cluster.node("g5.48xlarge")
    cluster.pod(idle, annotations={DO_NOT_DISRUPT: "true"})
    annotated = cluster.node("g6.xlarge", capacity_type="spot", node_annotations={DO_NOT_DISRUPT: "true"},
                             attributes={"imageId": "ami-0000000000000000a"})
    cluster.pod(annotated)
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[idle].startswith("do-not-disrupt: pod")
    assert result.skipped[annotated] == "do-not-disrupt: the node is annotated"


# Spot to spot


def test_spot_to_spot_needs_the_pool_to_opt_in() -> None:
    cluster = Cluster(pool_config(spotToSpot=False), catalog=wide_spot_catalog())
    spot = cluster.node("g5.12xlarge", capacity_type="spot")
    cluster.pod(spot)
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[spot].startswith("spot-to-spot: the pool does not opt in")


def test_spot_to_spot_needs_fifteen_cheaper_types_for_one_node() -> None:
    cluster = Cluster(pool_config(spotToSpot=True))  # g6.xlarge, g5.xlarge, g5.2xlarge: three cheaper
    spot = cluster.node("g5.12xlarge", capacity_type="spot")
    cluster.pod(spot)
    result = cluster.consolidate()
    assert result.decisions == ()
    assert result.skipped[spot] == f"spot-to-spot: only 3 cheaper spot types, {SPOT_TO_SPOT_MIN_TYPES} needed"


def test_spot_to_spot_with_enough_cheaper_types_launches_from_the_cheapest_fifteen() -> None:
    cluster = Cluster(pool_config(spotToSpot=True), catalog=wide_spot_catalog())
    spot = cluster.node("g5.12xlarge", capacity_type="spot")
    cluster.pod(spot)
    [decision] = cluster.consolidate().decisions
    [replacement] = decision.replacements
    assert replacement.capacity_type == "spot"
    assert len(replacement.instance_types) == SPOT_TO_SPOT_MIN_TYPES
    assert replacement.instance_types[0] == "g9.x0large"


def test_several_spot_nodes_into_fewer_need_no_minimum_of_types() -> None:
    cluster = Cluster(pool_config(spotToSpot=True))
    nodes = [cluster.node("g5.12xlarge", capacity_type="spot") for _ in range(2)]
    for name in nodes:
        cluster.pod(name)
    [decision] = cluster.consolidate().decisions
    assert set(decision.nodes) == set(nodes) and decision.action == "replace"
    assert all(c.capacity_type == "spot" for c in decision.replacements)


def test_on_demand_to_spot_is_not_gated() -> None:
    cluster = Cluster(pool_config(spotToSpot=False))
    on_demand = cluster.node("g5.12xlarge")
    cluster.pod(on_demand)
    [decision] = cluster.consolidate().decisions
    assert decision.replacements[0].capacity_type == "spot"


def test_a_replacement_chosen_for_its_price_is_pinned_to_its_capacity_type_a_drift_replacement_is_not() -> None:
    """Karpenter adds `capacity-type In [spot]` to an On-Demand node's replacement priced as Spot, so that "if spot
    capacity is insufficient we don't replace the node with a more expensive on-demand node"; drift replaces
    whatever it costs."""
    cluster = Cluster(pool_config(spotToSpot=False))
    cluster.pod(cluster.node("g5.12xlarge"))
    [cheaper] = by_reason(cluster.consolidate(), "Underutilized")
    assert cheaper.replacements[0].capacity_type == "spot"
    cluster = Cluster(pool_config())
    cluster.pod(cluster.node("g6.xlarge", capacity_type="spot", attributes={"imageId": "ami-0000000000000000a"}))
    [drift] = by_reason(cluster.consolidate(), "Drifted")
    assert [c.attributes.get(CAPACITY_TYPE_PINNED_ATTRIBUTE) for c in cheaper.replacements] == ["true"]
    assert [c.attributes.get(CAPACITY_TYPE_PINNED_ATTRIBUTE) for c in drift.replacements] == [None]


# Pending pods: a proposed node one of them would be scheduled on is not a candidate (Karpenter's nomination)


def _proposed(cluster: Cluster, node: str) -> None:
    """The node as a proposal leaves it: our disrupted taint on it, so no pending pod can land there."""
    cluster.update_node(node, DRAIN_TAINT)


def test_a_proposed_empty_node_a_pending_pod_fits_on_stays() -> None:
    cluster = Cluster(pool_config(consolidateAfter="10m", emptyKeepLeadTimes=0))
    empty = cluster.node("g5.12xlarge", empty_for=timedelta(minutes=30))
    _proposed(cluster, empty)
    waiting = cluster.pod(None, gpus=2)
    result = cluster.consolidate(pending=cluster.pods)
    assert result.decisions == ()
    assert result.skipped[empty] == f"nominated: pending pod {waiting.key} would be scheduled on it"


def test_a_pending_pod_that_would_not_be_scheduled_there_keeps_no_node() -> None:
    cluster = Cluster(pool_config(consolidateAfter="10m", emptyKeepLeadTimes=0))
    empty = cluster.node("g5.12xlarge", empty_for=timedelta(minutes=30))
    _proposed(cluster, empty)
    cluster.pod(None, gpus=8)  # more GPUs than it has
    cluster.pod(None, gpus=1, tolerations=())  # does not tolerate its taint
    cluster.pod(None, gpus=1, node_selector={"karpenter.sh/nodepool": "other"})
    result = cluster.consolidate(pending=cluster.pods)
    assert [d.nodes for d in result.decisions] == [(empty,)]


def test_a_pod_pending_beside_an_untainted_node_it_seems_to_fit_keeps_nothing() -> None:
    """kube-scheduler would have bound it there if it could: what holds it back is not looked at here."""
    cluster = Cluster(pool_config(consolidateAfter="10m", emptyKeepLeadTimes=0))
    empty = cluster.node("g5.12xlarge", empty_for=timedelta(minutes=30))
    cluster.pod(None, gpus=1)
    assert [d.nodes for d in cluster.consolidate(pending=cluster.pods).decisions] == [(empty,)]


def test_a_proposed_underused_node_a_pending_pod_fits_on_is_not_replaced() -> None:
    cluster = Cluster(pool_config())
    big = cluster.node("g5.48xlarge")
    cluster.pod(big, gpus=4, cpu="16", memory="64Gi")
    assert [d.nodes for d in cluster.consolidate().decisions] == [(big,)]
    _proposed(cluster, big)
    cluster.pod(None, gpus=2)
    result = cluster.consolidate(pending=cluster.pods)
    assert result.decisions == () and result.skipped[big].startswith("nominated: ")

"""One test (or a few) per rule the packer must honour; every plan is also checked by `check_plan`."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.domain.catalog import ANY, Catalog
from gpu_autoscaler.domain.packing import MAX_CANDIDATES, Plan, Solver
from gpu_autoscaler.models.catalog import InstanceType, Offering
from gpu_autoscaler.models.claims import ClaimState, StateTransition
from tests.unit.packing.builders import (
    NOW,
    TOLERATE_GPU,
    make_catalog,
    make_config,
    make_gang,
    make_pod,
    make_pods,
    make_pool,
    make_solver,
)
from tests.unit.packing.validation import check_plan

if TYPE_CHECKING:
    from gpu_autoscaler.models.pods import PendingPod


def solve(pods: list[PendingPod], *pools: dict[str, Any], config_extra: dict[str, Any] | None = None,
          catalog: Any = None, **kwargs: Any) -> Plan:
    config = make_config(*pools, **(config_extra or {}))
    catalog = catalog or make_catalog()
    plan = Solver(config, catalog, make_solver().clock).solve(pods, **kwargs)
    check_plan(plan, pods, config, catalog, kwargs.get("claims", ()), set(kwargs.get("unavailable", ())))
    return plan


def first_types(plan: Plan) -> list[str]:
    return [c.instance_types[0] for c in plan.claims]


def reason(plan: Plan) -> str:
    assert plan.unschedulable
    return plan.unschedulable[0].reason


# Requests


def test_identical_one_gpu_pods_each_get_the_cheapest_fitting_node() -> None:
    plan = solve(make_pods(3, gpus=1, cpu="2", memory="8Gi"), make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["g6.xlarge"] * 3
    assert plan.total_price_per_hour == pytest.approx(3 * 0.8048)


def test_cpu_memory_and_ephemeral_storage_requests_pick_a_bigger_type() -> None:
    plan = solve([make_pod(gpus=1, cpu="6", memory="20Gi")], make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["g5.2xlarge"]
    plan = solve([make_pod(gpus=1, requests={"nvidia.com/gpu": "1", "ephemeral-storage": "300Gi"})],
                 make_pool(capacityTypes=["on-demand"], ephemeralStorage="500Gi"))
    assert plan.claims
    plan = solve([make_pod(gpus=1, requests={"nvidia.com/gpu": "1", "ephemeral-storage": "300Gi"})],
                 make_pool(capacityTypes=["on-demand"]))
    assert "ephemeral-storage 300Gi" in reason(plan)


def test_a_pod_sized_to_the_volume_less_the_reservations_buys_no_node_it_cannot_use() -> None:
    """100Gi less kube-reserved's 1Gi and nodefs.available's 10 % is 89Gi, but the kubelet counts the filesystem on
    the volume, a little smaller: no node offers 89Gi, so none is bought for the pod (it would stay Pending on it
    and be planned again after the scheduling grace, a node each time)."""
    plan = solve([make_pod(gpus=1, requests={"nvidia.com/gpu": "1", "ephemeral-storage": "89Gi"})],
                 make_pool(capacityTypes=["on-demand"]))
    assert not plan.claims
    assert "ephemeral-storage 89Gi" in reason(plan)


def test_overhead_from_configuration_counts() -> None:
    # 4 vCPU less 300m overhead cannot hold a 4-CPU pod: the 8-vCPU type is needed.
    plan = solve([make_pod(gpus=1, cpu="4", memory="4Gi")], make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["g5.2xlarge"]
    heavy = {"daemonsets": {"cpu": "3", "memory": "1Gi"}, "kubeReserved": {"cpu": "100m", "memory": "1Gi"}}
    plan = solve([make_pod(gpus=1, cpu="2", memory="4Gi")], make_pool(capacityTypes=["on-demand"]),
                 config_extra={"overhead": heavy})
    assert first_types(plan) == ["g5.2xlarge"]


def test_max_pods_per_node_is_a_limit() -> None:
    pods = make_pods(30, gpus=None, cpu="10m", memory="10Mi",
                     requests={"cpu": "10m", "memory": "10Mi", "nvidia.com/gpu": "1"})
    # 30 pods, 1 GPU each on a time-sliced g6f (1 device × 64 replicas) would fit by GPU, not by its 20 pods.
    plan = solve(pods, make_pool(capacityTypes=["on-demand"], gpuSharing={"mode": "time-slicing", "replicas": 64},
                                 requirements=[{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                                "values": ["g6f.large"]}]))
    assert [len(c.pods) for c in plan.claims] == [20, 10]


def test_multi_gpu_pods_share_nodes_when_that_is_cheaper() -> None:
    # Two per 4-GPU g5.12xlarge (2 × 5.672) beats four on one 8-GPU g5.48xlarge (16.288).
    plan = solve(make_pods(4, gpus=2, cpu="8", memory="32Gi"), make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["g5.12xlarge", "g5.12xlarge"]
    assert [len(c.pods) for c in plan.claims] == [2, 2]


# Node selection


def test_node_selector_on_gpu_name_and_zone() -> None:
    pod = make_pod(gpus=1, nodeSelector={"karpenter.k8s.aws/instance-gpu-name": "h100",
                                         "topology.kubernetes.io/zone": "us-east-1b"})
    plan = solve([pod], make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["p5.4xlarge"] and plan.claims[0].zones == ("us-east-1b",)


@pytest.mark.parametrize(("expression", "expected"), [
    ({"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["g5"]}, "g5.xlarge"),
    ({"key": "karpenter.k8s.aws/instance-family", "operator": "NotIn", "values": ["g6", "g6f", "g5"]}, "p5.4xlarge"),
    ({"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Gt", "values": ["40000"]}, "p5.4xlarge"),
    ({"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Lt", "values": ["3000"]}, "g6f.large"),
    ({"key": "example.com/gpu-class", "operator": "DoesNotExist"}, "g6.xlarge"),
    ({"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "Exists"}, "g6.xlarge"),
])
def test_required_node_affinity_operators(expression: dict[str, Any], expected: str) -> None:
    pod = make_pod(gpus=1, cpu="500m", memory="1Gi", requiredNodeAffinity=[{"matchExpressions": [expression]}])
    plan = solve([pod], make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == [expected]


def test_affinity_terms_are_ored() -> None:
    def gpu_name(name: str) -> dict[str, Any]:
        expression = {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": [name]}
        return {"matchExpressions": [expression]}

    terms = [gpu_name("h100"), gpu_name("a10g")]
    plan = solve([make_pod(gpus=1, requiredNodeAffinity=terms)], make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["g5.xlarge"]
    assert set(plan.claims[0].instance_types) <= {"g5.xlarge", "g5.2xlarge", "p5.4xlarge"}


def test_an_empty_node_selector_term_matches_no_node() -> None:
    """"A null or empty node selector term matches no objects" (the API reference, NodeSelectorTerm)."""
    plan = solve([make_pod(requiredNodeAffinity=[{}])], make_pool(capacityTypes=["on-demand"]))
    assert not plan.claims
    assert "empty node selector term" in reason(plan)


def test_a_term_selecting_nodes_by_field_is_not_planned_for_a_new_node() -> None:
    """A new node's name is not known before it exists (Karpenter: "node selector term with matchFields is not
    supported"); a term with matchFields is never taken for one."""
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["ip-10-0-0-1.ec2.internal"]}]}
    plan = solve([make_pod(requiredNodeAffinity=[by_name])], make_pool(capacityTypes=["on-demand"]))
    assert not plan.claims
    assert "matchFields" in reason(plan)


def test_a_term_selecting_by_field_leaves_the_other_terms_to_plan_on() -> None:
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["ip-10-0-0-1"]}],
               "matchExpressions": [{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In",
                                     "values": ["h100"]}]}
    a10g = {"matchExpressions": [{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In",
                                  "values": ["a10g"]}]}
    plan = solve([make_pod(gpus=1, requiredNodeAffinity=[by_name, a10g])], make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["g5.xlarge"]
    assert set(plan.claims[0].instance_types) <= {"g5.xlarge", "g5.2xlarge"}


def _prefer(weight: int, key: str, *values: str) -> dict[str, Any]:
    expression = {"key": key, "operator": "In", "values": list(values)}
    return {"weight": weight, "preference": {"matchExpressions": [expression]}}


ON_DEMAND = ("karpenter.sh/capacity-type", "on-demand")
GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
ZONE = "topology.kubernetes.io/zone"


def test_preferred_on_demand_is_tried_before_spot() -> None:
    """Karpenter takes the heaviest preferred node affinity term as required (`NewPodRequirements`) and relaxes it
    only when the pod cannot be scheduled (preferences.go `Relax`): a pod that prefers On-Demand gets it in a pool
    that tries Spot first."""
    plan = solve([make_pod(gpus=1, preferredNodeAffinity=[_prefer(100, *ON_DEMAND)])], make_pool())
    assert [c.capacity_type for c in plan.claims] == ["on-demand"]


def test_preferred_terms_are_tried_heaviest_first_and_relaxed_one_at_a_time() -> None:
    """The heaviest term no offering fits (a GPU the catalog lacks) is dropped, then the next heaviest holds
    (`removePreferredNodeAffinityTerm` sorts by weight, descending, and drops the first); lighter ones are not
    ANDed in (only one preferred term is a requirement at a time)."""
    terms = [_prefer(10, ZONE, "us-east-1b"), _prefer(100, GPU_NAME, "b200"), _prefer(50, GPU_NAME, "h100")]
    plan = solve([make_pod(gpus=1, preferredNodeAffinity=terms)], make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["p5.4xlarge"]
    assert plan.claims[0].zones == ("us-east-1a", "us-east-1b")


def test_terms_of_equal_weight_are_tried_in_the_order_written() -> None:
    terms = [_prefer(5, GPU_NAME, "a100"), _prefer(5, GPU_NAME, "h100")]
    plan = solve([make_pod(gpus=8, cpu="8", preferredNodeAffinity=terms)], make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["p4d.24xlarge"]


def test_a_preferred_term_is_anded_with_the_required_terms() -> None:
    required = [{"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["us-east-1b"]}]}]
    pod = make_pod(gpus=1, requiredNodeAffinity=required, preferredNodeAffinity=[_prefer(1, *ON_DEMAND)])
    plan = solve([pod], make_pool())
    assert [(c.capacity_type, c.zones) for c in plan.claims] == [("on-demand", ("us-east-1b",))]


def test_a_preference_no_offering_fits_is_planned_as_if_absent() -> None:
    """Every preferred term relaxed: the pod is planned on its requirements alone (here Spot, the pool's first)."""
    pod = make_pod(gpus=1, preferredNodeAffinity=[_prefer(100, GPU_NAME, "b200"), _prefer(1, ZONE, "us-west-2a")])
    plan = solve([pod], make_pool())
    assert [(c.capacity_type, c.instance_types[0]) for c in plan.claims] == [("spot", "g6.xlarge")]


def test_pods_that_differ_only_in_preference_are_not_one_class() -> None:
    """Two pods alike but for a preference: each planned for its own (one class would plan both alike)."""
    pods = [make_pod(gpus=1), make_pod(gpus=1, preferredNodeAffinity=[_prefer(100, *ON_DEMAND)]), make_pod(gpus=1)]
    plan = solve(pods, make_pool())
    by_pod = {uid: c.capacity_type for c in plan.claims for uid in c.pods}
    assert [by_pod[p.uid] for p in pods] == ["spot", "on-demand", "spot"]


def test_exists_on_an_unknown_label_leaves_the_pod_unschedulable_with_a_reason() -> None:
    pod = make_pod(requiredNodeAffinity=[{"matchExpressions": [{"key": "example.com/x", "operator": "Exists"}]}])
    plan = solve([pod], make_pool(capacityTypes=["on-demand"]))
    assert "no offering matches the pod's node constraints" in reason(plan)


def test_taints_must_be_tolerated() -> None:
    plan = solve([make_pod(tolerate=False)], make_pool())
    assert reason(plan) == "pool gpu: taint nvidia.com/gpu=true:NoSchedule not tolerated"
    tolerate_all = make_pod(tolerate=False, tolerations=[{"operator": "Exists"}])
    assert solve([tolerate_all], make_pool()).claims


def test_pool_requirements_restrict_types() -> None:
    pool = make_pool(capacityTypes=["on-demand"], requirements=[
        {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["p"]}])
    assert first_types(solve([make_pod()], pool)) == ["p5.4xlarge"]


def test_pods_may_select_pool_labels() -> None:
    pools = (make_pool("cheap", weight=50), make_pool("team", capacityTypes=["on-demand"], labels={"team": "ml"}))
    plan = solve([make_pod(nodeSelector={"team": "ml"}), make_pod()], *pools)
    assert {(c.pool, len(c.pods)) for c in plan.claims} == {("team", 1), ("cheap", 1)}


def test_selectors_on_the_beta_and_region_labels_every_node_carries_are_planned() -> None:
    """The kubelet registers `beta.kubernetes.io/arch|os`, the cloud node controller the beta zone, region and
    instance type beside the stable keys, and `topology.kubernetes.io/region` (kubernetes pkg/kubelet
    kubelet_node_status.go; k8s.io/cloud-provider controllers/node). Karpenter reads a pod's beta keys as the
    stable ones (`NormalizedLabels`, kubernetes-sigs/karpenter pkg/apis/v1/labels.go) and knows the region."""
    pool = make_pool(capacityTypes=["on-demand"])
    selectors = [{"beta.kubernetes.io/arch": "amd64"}, {"beta.kubernetes.io/os": "linux"},
                 {"failure-domain.beta.kubernetes.io/zone": "us-east-1b"},
                 {"failure-domain.beta.kubernetes.io/region": "us-east-1"},
                 {"topology.kubernetes.io/region": "us-east-1"}, {"beta.kubernetes.io/instance-type": "g5.12xlarge"}]
    for selector in selectors:
        plan = solve([make_pod(nodeSelector=selector)], pool)
        assert plan.claims, f"{selector}: {reason(plan)}"
    zoned = solve([make_pod(requiredNodeAffinity=[{"matchExpressions": [
        {"key": "failure-domain.beta.kubernetes.io/zone", "operator": "In", "values": ["us-east-1b"]}]}])], pool)
    assert zoned.claims[0].zones == ("us-east-1b",)
    typed = solve([make_pod(nodeSelector={"beta.kubernetes.io/instance-type": "g5.12xlarge"})], pool)
    assert typed.claims[0].instance_types == ("g5.12xlarge",)
    elsewhere = solve([make_pod(nodeSelector={"topology.kubernetes.io/region": "eu-west-1"})], pool)
    assert not elsewhere.claims
    # A node carries both keys with one value: a pod asking two values of them can never run.
    torn = solve([make_pod(nodeSelector={"beta.kubernetes.io/arch": "arm64", "kubernetes.io/arch": "amd64"})], pool)
    assert not torn.claims


@pytest.mark.parametrize("sharing", [{"mode": "none"}, {"mode": "time-slicing", "replicas": 4}])
def test_selectors_on_every_label_our_nodes_register_with_are_planned(sharing: dict[str, Any]) -> None:
    """Every node we launch registers the labels `node_labels` gives its kubelet (our pool label, the sharing
    mode, the device plugin's configuration…): a pod selecting any of them is planned, as the node would take
    it."""
    from gpu_autoscaler.domain.user_data import node_labels

    config = make_config(make_pool(capacityTypes=["on-demand"], gpuSharing=sharing, labels={"team": "ml"}))
    pool = config.node_pools[0]
    labels, _ = node_labels(pool, "on-demand", instance_type=make_catalog().instance_type("g5.xlarge"))
    for key, value in labels.items():
        pod = make_pod(nodeSelector={key: value, "node.kubernetes.io/instance-type": "g5.xlarge"})
        plan = Solver(config, make_catalog(), make_solver().clock).solve([pod])
        assert plan.claims, f"{key}={value}: {reason(plan)}"
    other = make_pod(nodeSelector={"gpu-autoscaler/node-pool": "another"})
    assert not Solver(config, make_catalog(), make_solver().clock).solve([other]).claims


# Pools: weight, capacity order, limits


def test_heavier_pool_first_even_when_dearer() -> None:
    plan = solve([make_pod()], make_pool("cheap", weight=1), make_pool("preferred", weight=90,
                                                                       capacityTypes=["on-demand"]))
    assert plan.claims[0].pool == "preferred" and plan.claims[0].capacity_type == "on-demand"


def test_spot_before_on_demand_within_a_pool() -> None:
    plan = solve([make_pod()], make_pool(capacityTypes=["on-demand", "spot"]))
    assert plan.claims[0].capacity_type == "spot"
    only_od = [make_pod(nodeSelector={"karpenter.k8s.aws/instance-gpu-name": "h100"})]
    assert solve(only_od, make_pool(requirements=[{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                                   "values": ["p5.4xlarge"]}])).claims[0].capacity_type == "on-demand"


def reservation(count: int, rid: str = "cr-0aa", name: str = "g5.12xlarge", counted_at: datetime | None = None,
                ) -> Offering:
    return Offering(instance_type=name, zone="us-east-1a", capacity_type="reserved", price_per_hour=5.672e-7,
                    reservation_id=rid, available_count=count, counted_at=counted_at)


def test_reserved_first_only_with_reservations_and_within_their_count() -> None:
    pool = make_pool(capacityTypes=["reserved", "spot", "on-demand"], capacityReservations=[{"id": "cr-0aa"}])
    catalog = make_catalog(extra=[reservation(1)])
    plan = solve(make_pods(6, gpus=1, cpu="8", memory="32Gi"), pool, catalog=catalog)
    reserved = [c for c in plan.claims if c.capacity_type == "reserved"]
    assert len(reserved) == 1 and len(reserved[0].pods) == 4 and reserved[0].reservation_id == "cr-0aa"
    assert reserved[0].instance_types == ("g5.12xlarge",) and reserved[0].zones == ("us-east-1a",)
    assert {c.capacity_type for c in plan.claims} == {"reserved", "spot"}
    # A reservation the pool does not name is not used.
    other = make_pool(capacityTypes=["reserved", "on-demand"], capacityReservations=[{"id": "cr-0bb"}])
    assert {c.capacity_type for c in solve([make_pod()], other, catalog=catalog).claims} == {"on-demand"}


def test_pending_reserved_claims_hold_their_reservation() -> None:
    pool = make_pool(capacityTypes=["reserved", "on-demand"], capacityReservations=[{"id": "cr-0aa"}])
    live = [make_claim_for("reserved", instance_types=("g5.12xlarge",), reservation_id="cr-0aa")]
    plan = solve([make_pod(cpu="8", memory="32Gi")], pool, catalog=make_catalog(extra=[reservation(1)]), claims=live)
    assert plan.claims[0].capacity_type == "on-demand"


def test_a_reserved_claim_launched_after_the_count_was_read_holds_its_reservation() -> None:
    """The catalog reads a reservation's AvailableInstanceCount once a minute (`Ec2CatalogSource`): an instance of
    ours launched into it since is not in that count, so its claim takes its slot off (Karpenter decrements its
    count on launch, karpenter-provider-aws pkg/providers/capacityreservation/types.go `MarkLaunched`); one launched
    before the count was read is in it already. Without this the packer planned the same slot again: its launch
    failed with ReservationCapacityExceeded and the pods waited for an On-Demand node."""
    pool = make_pool(capacityTypes=["reserved", "on-demand"], capacityReservations=[{"id": "cr-0aa"}])
    counted = NOW - timedelta(minutes=1)
    catalog = make_catalog(extra=[reservation(1, counted_at=counted)])

    def launched(at: datetime) -> Any:
        return make_claim_for("reserved", instance_types=("g5.12xlarge",), instance_type="g5.12xlarge",
                              zone="us-east-1a", reservation_id="cr-0aa", state=ClaimState.LAUNCHED,
                              instance_id="i-0aa", history=(StateTransition(state=ClaimState.LAUNCHED, at=at),))

    pod = [make_pod(cpu="8", memory="32Gi")]
    after = solve(pod, pool, catalog=catalog, claims=[launched(counted + timedelta(seconds=30))])
    assert [c.capacity_type for c in after.claims] == ["on-demand"]
    before = solve(pod, pool, catalog=catalog, claims=[launched(counted - timedelta(seconds=30))])
    assert [(c.capacity_type, c.reservation_id) for c in before.claims] == [("reserved", "cr-0aa")]


def make_claim_for(capacity_type: str, **overrides: Any) -> Any:
    from tests.unit.packing.builders import make_claim

    return make_claim(capacity_type=capacity_type, gang="other/placeholder", **overrides)


def test_gpu_limit_counts_live_claims_and_spills_to_the_next_pool() -> None:
    limited = make_pool("limited", weight=50, capacityTypes=["on-demand"], limits={"gpus": 3})
    spill = make_pool("spill", capacityTypes=["on-demand"])
    live = [make_claim_for("on-demand", pool="limited", instance_types=("g5.xlarge",), state=ClaimState.REGISTERED)]
    whole_gpu = {"cpu": "2", "memory": "8Gi"}  # too big for a g6f slice: one whole GPU each
    plan = solve(make_pods(4, **whole_gpu), limited, spill, claims=live)
    assert sorted(c.pool for c in plan.claims) == ["limited", "limited", "spill", "spill"]
    plan = solve(make_pods(4, **whole_gpu), limited, claims=live)
    assert len(plan.unschedulable) == 2
    assert reason(plan) == "pool limited is at its limit of 3 GPUs (3 in use or planned)"


def test_price_limit() -> None:
    pool = make_pool(capacityTypes=["on-demand"], limits={"pricePerHour": 2.0})
    plan = solve(make_pods(3, cpu="2", memory="8Gi"), pool)  # 0.8048 each
    assert len(plan.claims) == 2 and len(plan.unschedulable) == 1
    assert "2 USD/h" in reason(plan)


def test_vcpu_quota_from_configuration() -> None:
    plan = solve(make_pods(3, cpu="2"), make_pool(capacityTypes=["on-demand"]),
                 config_extra={"vcpuQuotas": {"g/on-demand": 8}})
    assert len(plan.claims) == 2 and len(plan.unschedulable) == 1
    assert "vCPU quota g/on-demand (8 vCPUs" in reason(plan)


def test_vcpu_quota_given_to_solve_wins_and_family_keys_narrow() -> None:
    plan = solve(make_pods(2, cpu="2"), make_pool(capacityTypes=["on-demand"]), quotas={"g6/on-demand": 0})
    assert {c.instance_types[0] for c in plan.claims} == {"g5.xlarge"}


# GPU sharing


def test_time_sliced_pods_share_a_gpu() -> None:
    pool = make_pool(capacityTypes=["on-demand"], gpuSharing={"mode": "time-slicing", "replicas": 4})
    plan = solve(make_pods(4, gpus=1, cpu="400m", memory="1Gi"), pool)
    assert len(plan.claims) == 1 and first_types(plan) == ["g6.xlarge"]
    fractions = {**pool, "requirements": [{"key": "gpu-autoscaler/gpu-fraction", "operator": "Exists"}]}
    plan = solve(make_pods(4, gpus=1, cpu="400m", memory="1Gi"), fractions)
    assert len(plan.claims) == 1 and first_types(plan) == ["g6f.large"]


# Fractional-GPU types (g6f: one device that is 1/8 of an L4)

L4 = {"karpenter.k8s.aws/instance-gpu-name": "l4"}


def test_a_whole_gpu_pod_never_gets_a_fraction_of_one() -> None:
    plan = solve([make_pod(gpus=1, cpu="1", memory="2Gi", nodeSelector=L4)], make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["g6.xlarge"]
    assert all("g6f.large" not in c.instance_types for c in plan.claims)


def test_a_pod_selecting_on_the_fraction_or_gpu_memory_gets_one() -> None:
    pool = make_pool(capacityTypes=["on-demand"])
    by_fraction = make_pod(gpus=1, cpu="1", memory="2Gi", nodeSelector={"gpu-autoscaler/gpu-fraction": "0.125"})
    by_memory = make_pod(gpus=1, cpu="1", memory="2Gi", requiredNodeAffinity=[{"matchExpressions": [
        {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Lt", "values": ["4000"]}]}])
    assert first_types(solve([by_fraction], pool)) == ["g6f.large"]
    assert first_types(solve([by_memory], pool)) == ["g6f.large"]


def test_a_pool_of_fractions_only_says_why_whole_gpu_pods_are_not_placed() -> None:
    pool = make_pool(capacityTypes=["on-demand"], requirements=[
        {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["g6f", "g6"]},
        {"key": "karpenter.k8s.aws/instance-size", "operator": "In", "values": ["large"]}])
    plan = solve([make_pod(gpus=1, cpu="1", memory="2Gi")], pool)
    assert first_types(plan) == ["g6f.large"]  # the pool named g6f: it opted in
    pool = make_pool(capacityTypes=["on-demand"], requirements=[
        {"key": "karpenter.k8s.aws/instance-size", "operator": "In", "values": ["large"]}])
    plan = solve([make_pod(gpus=1, cpu="1", memory="2Gi")], pool)
    assert not plan.claims
    assert reason(plan) == (
        "pool gpu: only fractional-GPU types (g6f) have 1 GPU, and they serve only pods that select on "
        "gpu-autoscaler/gpu-fraction or karpenter.k8s.aws/instance-gpu-memory, or pools whose requirements "
        "ask for them")


def test_mig_pods_get_slices_and_whole_gpu_pods_are_told_why_not() -> None:
    pool = make_pool(capacityTypes=["on-demand"], gpuSharing={"mode": "mig", "migProfile": "1g.10gb"},
                     requirements=[{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In",
                                    "values": ["a100", "h100"]}])
    mig = make_pods(9, gpus=None, requests={"cpu": "1", "memory": "4Gi", "nvidia.com/mig-1g.10gb": "1"})
    plan = solve(mig, pool)
    assert [c.instance_types[0] for c in plan.claims] == ["p5.4xlarge", "p5.4xlarge"]
    assert sorted(len(c.pods) for c in plan.claims) == [2, 7]
    plan = solve([make_pod(gpus=1)], pool)
    assert reason(plan) == ("no offering in pool gpu has 1 GPU (pool gpu partitions GPUs into MIG 1g.10gb slices)")



def test_media_engine_slices_are_asked_for_under_the_device_plugins_name() -> None:
    """`1g.10gb+me` is advertised as `nvidia.com/mig-1g.10gb.me` (the device plugin turns `+` into `.`): pods asking
    for that are placed, and a pod asking for it from a pool of another profile is told the profile it asked for."""
    media = make_pool(capacityTypes=["on-demand"], gpuSharing={"mode": "mig", "migProfile": "1g.10gb+me"},
                      requirements=[{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In",
                                     "values": ["h100"]}])
    pods = make_pods(2, gpus=None, requests={"cpu": "1", "memory": "4Gi", "nvidia.com/mig-1g.10gb.me": "1"})
    plan = solve(pods, media)
    assert [c.instance_types[0] for c in plan.claims] == ["p5.4xlarge", "p5.4xlarge"]  # one +me slice per GPU
    plain = make_pool(capacityTypes=["on-demand"], gpuSharing={"mode": "mig", "migProfile": "1g.10gb"})
    assert reason(solve(pods[:1], plain)).endswith("(pool gpu does not partition GPUs into MIG 1g.10gb+me)")


def test_a_single_strategy_mig_pool_says_each_gpu_asked_for_is_a_slice() -> None:
    """With `migStrategy: single` a pod's `nvidia.com/gpu` is a slice: "partitions GPUs" alone would not say why 57
    of them fit nowhere (a p5.48xlarge has 56)."""
    pool = make_pool(capacityTypes=["on-demand"], gpuSharing={"mode": "mig", "migProfile": "1g.10gb",
                                                              "migStrategy": "single"},
                     requirements=[{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In",
                                    "values": ["h100"]}])
    assert [c.instance_types[0] for c in solve([make_pod(gpus=9)], pool).claims] == ["p5.48xlarge"]
    plan = solve([make_pod(gpus=57)], pool)
    assert reason(plan) == ("no offering in pool gpu has 57 GPUs (pool gpu advertises MIG 1g.10gb slices as "
                            "nvidia.com/gpu: each one a pod asks for is a slice)")


# Zones from volumes and spread


def test_a_pod_goes_where_its_volume_is() -> None:
    plan = solve([make_pod(volumeZones=["us-east-1b"])], make_pool(capacityTypes=["on-demand"]))
    assert [c.zones for c in plan.claims] == [("us-east-1b",)]
    both = make_pod(volumeZones=["us-east-1b"], nodeSelector={"topology.kubernetes.io/zone": "us-east-1a"})
    plan = solve([both], make_pool(capacityTypes=["on-demand"]))
    assert not plan.claims and "topology.kubernetes.io/zone In us-east-1b" in reason(plan)
    plan = solve([make_pod(volumeZones=[])], make_pool(capacityTypes=["on-demand"]))
    assert reason(plan) == "its persistent volumes have no zone in common: no node can attach them all"


def test_pods_spread_over_zones_get_nodes_in_each_zone() -> None:
    spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
               "zoneCounts": {"us-east-1a": 1}}]
    pods = make_pods(5, gpus=1, cpu="1", memory="2Gi", topologySpreadConstraints=spread)
    plan = solve(pods, make_pool(capacityTypes=["on-demand"]))
    zones = sorted(c.zones for c in plan.claims for _ in c.pods)
    assert zones == [("us-east-1a",)] * 2 + [("us-east-1b",)] * 3  # 1 running in 1a: 3 + 3 once placed
    anyway = [{**spread[0], "whenUnsatisfiable": "ScheduleAnyway"}]
    plan = solve(make_pods(2, gpus=4, cpu="1", memory="2Gi", topologySpreadConstraints=anyway),
                 make_pool(capacityTypes=["on-demand"]))
    assert all(c.zones == ("us-east-1a", "us-east-1b") for c in plan.claims)  # not enforced: no pinning


def test_pods_that_repel_each_other_on_a_node_get_a_node_each() -> None:
    apart = [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "llm"}}}]
    together = solve(make_pods(4, gpus=2, cpu="4", memory="16Gi"), make_pool(capacityTypes=["on-demand"]))
    assert sorted(len(c.pods) for c in together.claims) == [2, 2]
    plan = solve(make_pods(4, gpus=2, cpu="4", memory="16Gi", podAntiAffinity=apart),
                 make_pool(capacityTypes=["on-demand"]))
    assert sorted(len(c.pods) for c in plan.claims) == [1, 1, 1, 1]


def test_hostname_spread_caps_each_new_node_at_max_skew() -> None:
    """kube-scheduler's PodTopologySpread on `kubernetes.io/hostname`: a new node holds 0 matching pods, so the
    global minimum is 0 and a node takes at most `maxSkew` of the group (Karpenter: "we assume the global minimum
    is always zero", topologygroup.go)."""
    def spread(skew: int) -> list[dict[str, Any]]:
        return [{"maxSkew": skew, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
                 "labelSelector": {"matchLabels": {"app": "llm"}}}]
    pool = make_pool(capacityTypes=["on-demand"])
    together = solve(make_pods(8, gpus=1, cpu="14", memory="60Gi"), pool)
    assert [len(c.pods) for c in together.claims] == [8]  # one g5.48xlarge, without the rule
    one = solve(make_pods(8, gpus=1, cpu="14", memory="60Gi", topologySpreadConstraints=spread(1)), pool)
    assert [len(c.pods) for c in one.claims] == [1] * 8
    three = solve(make_pods(8, gpus=1, cpu="14", memory="60Gi", topologySpreadConstraints=spread(3)), pool)
    assert max(len(c.pods) for c in three.claims) <= 3 and sum(len(c.pods) for c in three.claims) == 8
    apart = [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "llm"}}}]
    both = solve(make_pods(4, gpus=1, cpu="14", memory="60Gi", topologySpreadConstraints=spread(3),
                           podAntiAffinity=apart), pool)
    assert [len(c.pods) for c in both.claims] == [1] * 4  # one group's stricter rule holds


def test_pods_on_one_host_port_get_a_node_each() -> None:
    """kube-scheduler's NodePorts filter: a node takes one pod per host port and protocol, a pod on every address
    (0.0.0.0) conflicting with one on a single address (Karpenter: pkg/scheduling/hostportusage.go)."""
    pool = make_pool(capacityTypes=["on-demand"])

    def on(*ports: dict[str, Any]) -> list[PendingPod]:
        return [make_pod(gpus=1, cpu="14", memory="60Gi", hostPorts=[p]) for p in ports]

    any_ip = {"hostPort": 8000, "protocol": "TCP"}
    assert [len(c.pods) for c in solve(on(any_ip, any_ip, any_ip), pool).claims] == [1, 1, 1]
    apart = on({**any_ip, "hostIP": "10.0.0.1"}, {**any_ip, "hostIP": "10.0.0.2"}, {**any_ip, "protocol": "UDP"},
               {"hostPort": 9000, "protocol": "TCP"})
    assert max(len(c.pods) for c in solve(apart, pool).claims) > 1  # another address, protocol or port: shared
    assert sorted(len(c.pods) for c in solve(on({**any_ip, "hostIP": "10.0.0.1"}, any_ip), pool).claims) == [1, 1]


def test_pods_that_repel_each_other_in_a_zone_get_a_zone_each() -> None:
    """Required anti-affinity on the zone among pods the term matches: kube-scheduler's InterPodAffinity refuses a
    node whose zone holds one of them, so one per zone, none where one runs; the rest can run nowhere."""
    apart = [{"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "llm"}}}]
    pool = make_pool(capacityTypes=["on-demand"])
    plan = solve(make_pods(3, gpus=2, cpu="4", memory="16Gi", podAntiAffinity=apart), pool)
    assert sorted(c.zones for c in plan.claims) == [("us-east-1a",), ("us-east-1b",)]
    assert [u.reason for u in plan.unschedulable] == [
        "zone anti-affinity: one pod of its group per zone, and every zone it may use (us-east-1a, us-east-1b) "
        "has one"]
    running = [{**apart[0], "zoneCounts": {"us-east-1a": 1}}]
    plan = solve(make_pods(2, gpus=2, cpu="4", memory="16Gi", podAntiAffinity=running), pool)
    assert [c.zones for c in plan.claims] == [("us-east-1b",)] and len(plan.unschedulable) == 1


def test_anti_affinity_over_every_namespace_groups_pods_of_every_namespace() -> None:
    apart = [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "llm"}},
              "namespaceSelector": {}}]
    pods = [make_pod(gpus=2, cpu="4", memory="16Gi", podAntiAffinity=apart, namespace=ns)
            for ns in ("team-a", "team-b", "team-a", "team-b")]
    plan = solve(pods, make_pool(capacityTypes=["on-demand"]))
    assert sorted(len(c.pods) for c in plan.claims) == [1, 1, 1, 1]


def test_zone_spread_caps_each_zone_at_the_least_eligible_zone_plus_max_skew() -> None:
    """kube-scheduler's global minimum is over every eligible zone, one no pool can launch in included (us-east-1c,
    where only CPU nodes run, counts 0), and is 0 below `minDomains` ("When the number of eligible domains with
    matching topology keys is less than minDomains, Pod Topology Spread treats 'global minimum' as 0", core/v1
    TopologySpreadConstraint): each zone takes at most the minimum + maxSkew, the rest can run nowhere."""
    spread = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
              "zoneCounts": {"us-east-1a": 0, "us-east-1b": 0, "us-east-1c": 0}}
    pool = make_pool(capacityTypes=["on-demand"])
    plan = solve(make_pods(4, gpus=2, cpu="4", memory="16Gi", topologySpreadConstraints=[spread]), pool)
    assert sorted(c.zones for c in plan.claims for _ in c.pods) == [("us-east-1a",), ("us-east-1b",)]
    assert [u.reason for u in plan.unschedulable] == [
        "zone spread: us-east-1c holds 0 of its group and no pool can launch there for it, so a zone may hold 1 "
        "(maxSkew 1), as us-east-1a and us-east-1b do"] * 2
    few = {**spread, "zoneCounts": {"us-east-1a": 0, "us-east-1b": 0}, "minDomains": 3, "maxSkew": 2}
    plan = solve(make_pods(6, gpus=2, cpu="4", memory="16Gi", topologySpreadConstraints=[few]), pool)
    assert sum(len(c.pods) for c in plan.claims) == 4
    assert plan.unschedulable[0].reason == (
        "zone spread: 2 zones, fewer than its minDomains 3, so a zone may hold 2 (maxSkew 2), as us-east-1a and "
        "us-east-1b do")


def test_required_pod_affinity_goes_where_its_pods_run_or_nowhere_new() -> None:
    """kube-scheduler's InterPodAffinity passes a node only if its domain already holds a pod each required term
    selects, or, for the first of a group that selects itself, if none runs anywhere (Karpenter:
    `nextDomainAffinity`, scheduling/topologygroup.go)."""
    pool = make_pool(capacityTypes=["on-demand"])
    zone = {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "cache"}}}
    plan = solve(make_pods(2, gpus=2, cpu="4", memory="16Gi", podAffinity=[
        {**zone, "zoneCounts": {"us-east-1b": 1, "us-east-1c": 0}}]), pool)
    assert {c.zones for c in plan.claims} == {("us-east-1b",)} and not plan.unschedulable
    plan = solve([make_pod(podAffinity=[zone])], pool)
    assert not plan.claims and reason(plan) == "pod affinity: no pod it must share a zone with runs yet"
    node = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "cache"}},
            "nodes": ["ip-10-0-1-5"]}
    plan = solve([make_pod(podAffinity=[node])], pool)
    assert not plan.claims and reason(plan) == (
        "pod affinity: it must run on a node where a pod it selects runs (ip-10-0-1-5); no new node can take it")
    job = make_pods(3, gpus=4, cpu="4", memory="16Gi", podAffinity=[{**zone, "selfMatch": True}])
    plan = solve(job, pool)
    assert len(plan.claims) == 3 and len({c.zones for c in plan.claims}) == 1
    assert len(next(iter({c.zones for c in plan.claims}))) == 1  # all in one zone, whichever the fleet picks
    pair = make_pods(2, gpus=2, cpu="4", memory="16Gi", podAffinity=[{**node, "nodes": [], "selfMatch": True}])
    plan = solve(pair, pool)
    assert [len(c.pods) for c in plan.claims] == [1] and reason(plan) == (
        "pod affinity on the node: it joins the first pod of its group, planned now, once that one runs")


# Dynamic Resource Allocation claims


def test_dra_gpu_claims_are_planned_as_whole_gpus() -> None:
    dra = [{"deviceClassName": "gpu.nvidia.com", "count": 4, "claim": "train-gpus"}]
    plan = solve([make_pod(gpus=None, cpu="8", memory="32Gi", deviceRequests=dra)],
                 make_pool(capacityTypes=["on-demand"]))
    assert first_types(plan) == ["g5.12xlarge"]
    assert all(make_catalog().instance_type(t).gpu_devices >= 4 for t in plan.claims[0].instance_types)


def test_dra_claims_that_cannot_be_satisfied_are_told_why() -> None:
    shared = make_pool(capacityTypes=["on-demand"], gpuSharing={"mode": "time-slicing", "replicas": 4})
    gpu = make_pod(gpus=None, deviceRequests=[{"deviceClassName": "gpu.nvidia.com", "count": 1}])
    assert reason(solve([gpu], shared)).endswith(
        "(pool gpu shares or partitions its GPUs; DRA devices of class gpu.nvidia.com are whole GPUs)")
    nic = make_pod(gpus=1, deviceRequests=[{"deviceClassName": "rdma.example.com", "count": 1}])
    plan = solve([nic], make_pool(capacityTypes=["on-demand"]))
    assert not plan.claims
    assert reason(plan).endswith("(DRA devices are planned for class gpu.nvidia.com only, not rdma.example.com)")
    told = make_pod(gpus=None, unplannable="its DRA claims cannot be planned for: claim c asks for all devices")
    assert reason(solve([told], make_pool())) == "its DRA claims cannot be planned for: claim c asks for all devices"


# Gangs


def test_gang_is_placed_whole_in_one_zone() -> None:
    pods = make_gang("train", 6, gpus=8, cpu="90", memory="700Gi")
    plan = solve(pods, make_pool(capacityTypes=["on-demand"]))
    assert len(plan.claims) == 6 and all(c.gang == "test/train" for c in plan.claims)
    assert len({c.zones for c in plan.claims}) == 1


def test_efa_gang_shares_one_type_list() -> None:
    pods = make_gang("train", 3, gpus=4, cpu="40", memory="100Gi")
    plan = solve(pods, make_pool(capacityTypes=["on-demand"], efa=True))
    assert len({c.instance_types for c in plan.claims}) == 1
    types = make_catalog()
    assert all(types.instance_type(t).efa for t in plan.claims[0].instance_types)


def _p5_catalog() -> Catalog:
    p5 = InstanceType(name="p5.48xlarge", vcpu=192, memory_mib=2097152, gpus=8, gpu_devices=8, gpu_model="H100",
                      gpu_manufacturer="NVIDIA", gpu_memory_mib=655360, efa=True, efa_interfaces=32, max_pods=100)
    return Catalog([p5], [Offering(instance_type=p5.name, zone=z, capacity_type="on-demand", price_per_hour=55.04)
                          for z in ("us-east-1a", "us-east-1b")])


def test_an_efa_gang_asking_for_efas_is_planned_in_an_efa_pool() -> None:
    """EKS User Guide, ml/node-efa.adoc: pods ask the EFA device plugin for `vpc.amazonaws.com/efa` (its NCCL test
    worker: 8 GPUs and 32 EFAs on a p5.48xlarge); an `efa: true` pool launches p5s with all 32 attached."""
    pods = make_gang("nccl", 2, gpus=8, cpu="90", memory="8000Mi", requests={
        "cpu": "90", "memory": "8000Mi", "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"})
    plan = solve(pods, make_pool(capacityTypes=["on-demand"], efa=True), catalog=_p5_catalog())
    assert not plan.unschedulable, plan.unschedulable
    assert len(plan.claims) == 2


def test_the_eks_guides_nccl_worker_is_planned_in_an_efa_pool() -> None:
    """ml/node-efa.adoc's two-node NCCL test: each worker asks for 8 GPUs, 32 EFAs and `hugepages-2Mi: 5120Mi` (EFA
    nodes pre-allocate 2 MiB huge pages: 110 per CPU, 42,240 MiB on a p5.48xlarge)."""
    pods = make_gang("nccl", 2, requests={"cpu": "90", "memory": "32000Mi", "nvidia.com/gpu": "8",
                                          "vpc.amazonaws.com/efa": "32", "hugepages-2Mi": "5120Mi"})
    plan = solve(pods, make_pool(capacityTypes=["on-demand"], efa=True), catalog=_p5_catalog())
    assert not plan.unschedulable, plan.unschedulable
    assert len(plan.claims) == 2


def test_a_pod_asking_for_efas_or_huge_pages_outside_an_efa_pool_is_told_what_gives_them() -> None:
    pods = [make_pod(gpus=8, requests={"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"})]
    plan = solve(pods, make_pool(capacityTypes=["on-demand"]), catalog=_p5_catalog())
    assert not plan.claims
    assert reason(plan).endswith("(only pools with efa: true launch nodes with vpc.amazonaws.com/efa)")
    huge = [make_pod(gpus=8, requests={"nvidia.com/gpu": "8", "hugepages-2Mi": "5120Mi"})]
    plan = solve(huge, make_pool(capacityTypes=["on-demand"]), catalog=_p5_catalog())
    assert reason(plan).endswith("(only nodes of pools with efa: true pre-allocate hugepages-2Mi)")


def test_gang_waits_for_all_its_members() -> None:
    pods = make_gang("train", 3, min_member=4)
    plan = solve(pods, make_pool())
    assert not plan.claims
    assert reason(plan) == ("gang test/train has 3 of its 4 members pending; "
                            "nothing is provisioned until all of them are")


def test_gang_that_cannot_fit_whole_places_nothing() -> None:
    pool = make_pool(capacityTypes=["on-demand"], limits={"gpus": 16})
    pods = make_gang("big", 3, gpus=8, cpu="10", memory="10Gi") + [make_pod()]
    plan = solve(pods, pool)
    assert all(c.gang is None for c in plan.claims) and len(plan.claims) == 1
    assert {u.reason for u in plan.unschedulable} == {
        "gang test/big (3 pods) cannot be placed whole: pool gpu is at its limit of 16 GPUs (0 in use or planned)"}


# Claims in flight, idempotency, unavailable offerings


def test_pods_go_onto_claims_in_flight_first() -> None:
    from tests.unit.packing.builders import make_claim

    claim = make_claim(instance_types=("g5.12xlarge",), pods=("earlier",), attributes={
        "requests": '{"cpu":8000,"memory":34359738368,"nvidia.com/gpu":1,"pods":1}'})
    plan = solve(make_pods(4, cpu="8", memory="32Gi"), make_pool(capacityTypes=["on-demand"]), claims=[claim])
    assert len(plan.existing[claim.id]) == 3 and len(plan.claims) == 1


def test_without_new_nodes_pods_go_onto_claims_in_flight_alone_and_the_rest_are_unschedulable() -> None:
    """`new_nodes=False` (a consolidation that may only delete): the same places on the claim in flight as the full
    solve gives, no node opened, the pods left over unschedulable."""
    from tests.unit.packing.builders import make_claim

    claim = make_claim(instance_types=("g5.12xlarge",), pods=("earlier",), attributes={
        "requests": '{"cpu":8000,"memory":34359738368,"nvidia.com/gpu":1,"pods":1}'})
    pods = make_pods(4, cpu="8", memory="32Gi")
    pool = make_pool(capacityTypes=["on-demand"])
    full = solve(pods, pool, claims=[claim])
    only = solve(pods, pool, claims=[claim], new_nodes=False)
    assert only.existing == full.existing and len(only.existing[claim.id]) == 3
    assert only.claims == () and len(full.claims) == 1
    assert [u.pod for u in only.unschedulable] == list(full.claims[0].pods)
    assert {u.reason for u in only.unschedulable} == {"no room on the claims in flight, and no new node was asked for"}


def test_claims_in_flight_are_not_used_by_pods_that_cannot_go_there() -> None:
    from tests.unit.packing.builders import make_claim

    claim = make_claim(instance_types=("g5.12xlarge",), zones=("us-east-1a",))
    pinned = make_pod(nodeSelector={"topology.kubernetes.io/zone": "us-east-1b"})
    wrong_gpu = make_pod(nodeSelector={"karpenter.k8s.aws/instance-gpu-name": "h100"})
    plan = solve([pinned, wrong_gpu], make_pool(capacityTypes=["on-demand"]), claims=[claim])
    assert not plan.existing and len(plan.claims) == 2
    launched = claim.model_copy(update={"state": ClaimState.REGISTERED})
    assert not solve([make_pod()], make_pool(capacityTypes=["on-demand"]), claims=[launched]).existing


def test_pods_covered_by_a_live_claim_are_never_provisioned_again() -> None:
    from tests.unit.packing.builders import make_claim

    pods = make_pods(2)
    claim = make_claim(pods=(pods[0].uid,), state=ClaimState.REGISTERED)  # live, but no room to offer
    plan = solve(pods, make_pool(), claims=[claim], covered={pods[0].uid: claim.id})
    assert plan.covered == {pods[0].uid: claim.id}
    assert [c.pods for c in plan.claims] == [(pods[1].uid,)]
    gone = claim.model_copy(update={"state": ClaimState.TERMINATED})
    plan = solve(pods, make_pool(), claims=[gone], covered={pods[0].uid: claim.id})
    assert not plan.covered and len(plan.claims) == 2


def test_a_pod_listed_twice_is_planned_once() -> None:
    pod = make_pod()
    plan = solve([pod, pod], make_pool())
    assert [c.pods for c in plan.claims] == [(pod.uid,)]


def test_unavailable_offerings_are_avoided() -> None:
    unavailable = {("g6.xlarge", z, "spot") for z in ("us-east-1a", "us-east-1b")}
    plan = solve([make_pod()], make_pool(), unavailable=unavailable)
    assert first_types(plan) == ["g5.xlarge"]


def test_a_capacity_type_marked_unavailable_is_avoided_whole() -> None:
    plan = solve([make_pod()], make_pool(), unavailable={(ANY, ANY, "spot")})
    assert plan.claims and {c.capacity_type for c in plan.claims} == {"on-demand"}


def test_every_fitting_offering_unavailable_is_said_so() -> None:
    h100 = make_pod(nodeSelector={"karpenter.k8s.aws/instance-gpu-name": "h100"})
    unavailable = {(t, z, "on-demand") for t in ("p5.4xlarge", "p5.48xlarge") for z in ("us-east-1a", "us-east-1b")}
    plan = solve([h100], make_pool(capacityTypes=["on-demand"]), unavailable=unavailable)
    assert reason(plan) == ("pool gpu: every offering with 1 × H100 is marked unavailable "
                            "(insufficient capacity) for now")


# Candidates and reasons


def test_candidates_are_ranked_capped_and_all_fit() -> None:
    plan = solve([make_pod(cpu="500m", memory="1Gi")], make_pool(capacityTypes=["on-demand"]))
    claim = plan.claims[0]
    assert claim.instance_types[0] == "g6.xlarge" and len(claim.instance_types) <= MAX_CANDIDATES
    assert claim.zones == ("us-east-1a", "us-east-1b")


def test_the_reason_names_gpus_model_and_zone() -> None:
    pod = make_pod(gpus=8, nodeSelector={"karpenter.k8s.aws/instance-gpu-name": "h100"},
                   requiredNodeAffinity=[{"matchExpressions": [
                       {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]}])
    pool = make_pool("gpu-burst", requirements=[
        {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["p5"]},
        {"key": "karpenter.k8s.aws/instance-size", "operator": "NotIn", "values": ["48xlarge"]}])
    assert reason(solve([pod], pool)) == "no offering in pool gpu-burst has 8 × H100 in us-east-1a"
    big = make_pod(gpus=1, cpu="300", memory="10Gi")
    assert reason(solve([big], make_pool())) == "no offering in pool gpu has 1 GPU with cpu 300"


def test_claim_ids_are_stable_for_a_message_and_differ_across_messages() -> None:
    pods = make_pods(3)
    solver = make_solver(make_config(make_pool()))
    first = [c.id for c in solver.solve(pods, source="m-1").claims]
    assert first == [c.id for c in solver.solve(pods, source="m-1").claims]
    assert not set(first) & {c.id for c in solver.solve(pods, source="m-2").claims}


def test_claims_record_their_requests_and_source() -> None:
    plan = make_solver(make_config(make_pool())).solve([make_pod(cpu="2", memory="1Gi")], source="m-1")
    attributes = plan.claims[0].attributes
    assert attributes["source"] == "m-1"
    assert attributes["requests"] == '{"cpu":2000,"memory":1073741824,"nvidia.com/gpu":1,"pods":1}'


def test_plan_json_has_exactly_the_contract_keys() -> None:
    pods = make_pods(2) + [make_pod(tolerate=False)]
    data = make_solver(make_config(make_pool())).solve(pods).to_json()
    assert set(data) == {"claims", "unschedulable", "totalPricePerHour"}
    assert set(data["claims"][0]) == {"id", "pool", "capacityType", "zones", "instanceTypes", "pricePerHour", "pods"}
    assert set(data["unschedulable"][0]) == {"pod", "reason"}


def test_tolerations_list_builder_is_the_one_used() -> None:
    assert make_pod().tolerations[0].key == TOLERATE_GPU["key"]


def _arm_catalog() -> Any:
    """g5g.xlarge (Graviton, one T4G) is the cheapest single-GPU type here, so only the AMI rule keeps it out."""
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.models.catalog import InstanceType
    from tests.unit.packing.builders import ZONES, make_offerings, make_type

    arm = InstanceType(name="g5g.xlarge", vcpu=4, memory_mib=8192, gpus=1, gpu_devices=1, gpu_model="T4g",
                       gpu_manufacturer="NVIDIA", gpu_memory_mib=16384, max_pods=58, architecture="arm64")
    names = ("g5.xlarge", "g6.xlarge")
    offerings = make_offerings(names) + [Offering(instance_type="g5g.xlarge", zone=z, capacity_type=c,
                                                  price_per_hour=p) for z in ZONES
                                         for c, p in (("on-demand", 0.42), ("spot", 0.15))]
    return Catalog([make_type(n) for n in names] + [arm], offerings)


def test_types_of_an_architecture_the_pool_has_no_image_for_are_not_planned() -> None:
    """Karpenter offers only instance types whose architecture the EC2NodeClass resolved an AMI for
    (karpenter.sh docs, NodeClasses › amiSelectorTerms: the AMIs' architectures become requirements); our fleet
    drops such overrides at launch (`candidate_offerings`), so a plan naming them is a claim that cannot launch."""
    pods = [make_pod(cpu="2", memory="4Gi")]
    x86_only = solve(pods, make_pool(), catalog=_arm_catalog())
    assert first_types(x86_only) and all(not t.startswith("g5g") for c in x86_only.claims for t in c.instance_types)
    both = solve(pods, make_pool(), catalog=_arm_catalog(), config_extra={"ami": {
        "family": "AL2023", "version": "v1", "x86_64": "ami-0123456789abcdef0", "arm64": "ami-0fedcba9876543210"}})
    assert first_types(both) == ["g5g.xlarge"]


def test_a_pool_image_without_arm64_keeps_arm64_out_even_when_the_global_one_has_it() -> None:
    pods = [make_pod(cpu="2", memory="4Gi")]
    pool = make_pool(ami={"family": "AL2023", "version": "v1", "x86_64": "ami-0123456789abcdef0"})
    plan = solve(pods, pool, catalog=_arm_catalog(), config_extra={"ami": {
        "family": "AL2023", "version": "v1", "x86_64": "ami-0123456789abcdef0", "arm64": "ami-0fedcba9876543210"}})
    assert all(not t.startswith("g5g") for c in plan.claims for t in c.instance_types)

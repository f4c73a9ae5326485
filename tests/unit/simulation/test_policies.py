"""The four policies' configurations, and how a trace pod asks for GPUs under each."""

from __future__ import annotations

import math

from gpu_autoscaler.domain.packing.baseline import first_fit_decreasing
from gpu_autoscaler.domain.packing.binpack import pack
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.resources import GPU
from gpu_autoscaler.simulation.policies import (
    FIXED_POOL,
    POLICY_NAMES,
    PodShaper,
    build_policy,
    choose_fixed_type,
    default_policies,
)
from gpu_autoscaler.simulation.run import submission_order
from tests.unit.simulation.builders import make_catalog, make_config, make_pod, make_pool

SHARED = make_pool("gpu-shared", weight=1, taints=[{"key": "gpu-autoscaler/shared", "value": "true",
                                                    "effect": "NoSchedule"}],
                   gpuSharing={"mode": "time-slicing", "replicas": 4})
WINDOW = {"name": "peak", "schedule": "cron(0 9 * * ? *)", "duration": "2h", "nodePool": "gpu", "warm": {"gpus": 2}}
CONFIG = make_config(make_pool(weight=10), SHARED, scalingWindows=[WINDOW], predictive={"enabled": True})


def test_ours_runs_the_configuration_and_the_others_strip_what_they_lack() -> None:
    catalog = make_catalog()
    pods = [make_pod()]
    ours = build_policy("ours", CONFIG, catalog, pods)
    assert ours.config == CONFIG and ours.packer is pack and ours.prewarm
    blind = build_policy("ours-no-prediction", CONFIG, catalog, pods)
    assert not blind.config.predictive.enabled and blind.config.scaling_windows == CONFIG.scaling_windows
    karpenter = build_policy("karpenter-like", CONFIG, catalog, pods)
    assert karpenter.packer is first_fit_decreasing and not karpenter.prewarm
    assert {p.gpu_sharing.mode for p in karpenter.config.node_pools} == {"none"}
    # Karpenter launches the cheapest type for the pods at hand; ours may buy room for the pods to come.
    assert {p.spare_room_worth for p in karpenter.config.node_pools} == {0}
    assert all(p.spare_room_worth > 0 for p in blind.config.node_pools)
    # Karpenter weighs every node with pods for consolidation; Cluster Autoscaler only those under half used.
    assert {p.disruption.underutilized_below for p in karpenter.config.node_pools} == {None}
    assert {p.disruption.underutilized_below for p in blind.config.node_pools} == {0.5}
    fixed = build_policy("fixed-node-group", CONFIG, catalog, pods)
    # Cluster Autoscaler never scales down a node over its threshold, sunk room or not.
    assert [p.disruption.into_sunk_room for p in fixed.config.node_pools] == [False]
    assert all(p.disruption.into_sunk_room for p in blind.config.node_pools)
    (pool,) = fixed.config.node_pools
    assert pool.name == FIXED_POOL and pool.capacity_types == ["on-demand"] and not fixed.prewarm
    assert pool.disruption.underutilized_below == 0.5
    assert pool.requirements[0].values == (fixed.instance_type,)


def test_ours_without_prediction_keeps_a_pool_that_weighs_every_node() -> None:
    # `underutilizedBelow: null` (Karpenter's rule) differs from the default (0.5): dropping the null on the way
    # would replay another configuration than the one given.
    config = make_config(make_pool(weight=10, disruption={"underutilizedBelow": None}), SHARED)
    blind = build_policy("ours-no-prediction", config, make_catalog(), [make_pod()])
    assert [p.disruption.underutilized_below for p in blind.config.node_pools] == [None, 0.5]


def test_the_fixed_type_holds_nearly_every_pod_at_the_lowest_price_per_gpu() -> None:
    catalog = make_catalog()
    small = [make_pod(i) for i in range(99)]
    # One GPU per pod: the cheapest per GPU that holds them (g4dn.xlarge, 0.526 USD/h per GPU).
    assert choose_fixed_type(CONFIG, catalog, small) == "g4dn.xlarge"
    # 2 % of the pods need 4 GPUs: the type must hold them too (g4dn.12xlarge, 0.978 per GPU, beats p4d).
    mixed = small[:98] + [make_pod(98, gpus=4, cpu=16000), make_pod(99, gpus=4, cpu=16000)]
    assert choose_fixed_type(CONFIG, catalog, mixed) == "g4dn.12xlarge"


def test_a_fractional_pod_asks_for_time_sliced_devices_on_the_sharing_pool() -> None:
    shaper = PodShaper(CONFIG)
    pod = shaper.pending(make_pod(gpus=1, milli=470))
    assert pod.requests[GPU] == str(math.ceil(0.47 * 4))
    assert pod.node_selector == {L.NODE_POOL: "gpu-shared"}
    assert {t.key for t in pod.tolerations} == {"gpu-autoscaler/shared"}


def test_a_whole_gpu_pod_keeps_off_the_sharing_pool_and_carries_its_gpu_model() -> None:
    shaper = PodShaper(CONFIG)
    pod = shaper.pending(make_pod(gpus=2, gpu_names=("t4", "v100")))
    assert pod.requests[GPU] == "2"
    assert {t.key for t in pod.tolerations} == {"nvidia.com/gpu"}
    (term,) = pod.required_node_affinity
    by_key = {r.key: r for r in term.match_expressions}
    assert by_key[L.NODE_POOL].operator == "NotIn" and by_key[L.NODE_POOL].values == ("gpu-shared",)
    assert by_key[L.INSTANCE_GPU_NAME].values == ("t4", "v100")
    assert by_key[L.ARCH].values == ("amd64",)


def test_without_a_sharing_pool_a_fraction_takes_a_whole_gpu() -> None:
    karpenter = build_policy("karpenter-like", CONFIG, make_catalog(), [make_pod()])
    pod = PodShaper(karpenter.config).pending(make_pod(gpus=1, milli=100))
    assert pod.requests[GPU] == "1" and not pod.node_selector


def test_karpenter_overlay_keeps_the_pools_gpu_sharing_as_a_node_overlay_would_advertise_it() -> None:
    shared = make_pool("gpu-shared", capacityTypes=["on-demand"], gpuSharing={"mode": "time-slicing", "replicas": 4})
    config = make_config(make_pool(), shared)
    catalog = make_catalog()
    pods = [make_pod(i, arrival=0.0, gpus=1, milli=250) for i in range(4)]
    overlay = build_policy("karpenter-overlay", config, catalog, pods)
    plain = build_policy("karpenter-like", config, catalog, pods)
    assert overlay.packer is plain.packer, "Karpenter's first-fit decreasing either way"
    assert overlay.config.pool("gpu-shared").gpu_sharing.replicas == 4
    assert plain.config.pool("gpu-shared").gpu_sharing.mode == "none"
    assert not overlay.config.predictive.enabled and not overlay.config.scaling_windows
    assert "karpenter-overlay" not in POLICY_NAMES, "only where pods would share GPUs (`default_policies`)"


def test_karpenter_overlay_joins_the_default_set_where_karpenter_would_share_gpus_too() -> None:
    """Karpenter time-slices a GPU when a NodeOverlay advertises the replicas (issue 16: "if Karpenter would use a
    feature for the same pods, say so in the report"): wherever a pool shares GPUs and a pod asks for part of one,
    karpenter-like alone would compare ours against a Karpenter that buys a whole GPU for every fraction."""
    shared = make_pool("gpu-shared", capacityTypes=["on-demand"], gpuSharing={"mode": "time-slicing", "replicas": 4})
    sharing = make_config(make_pool(), shared)
    fraction = make_pod(0, arrival=0.0, gpus=1, milli=250)
    whole = make_pod(1, arrival=0.0, gpus=1)
    assert default_policies(sharing, [whole, fraction]) == (*POLICY_NAMES, "karpenter-overlay")
    assert default_policies(sharing, [whole]) == POLICY_NAMES, "no pod shares a GPU: the overlay changes nothing"
    assert default_policies(make_config(make_pool()), [fraction]) == POLICY_NAMES, "no pool shares GPUs"


def test_the_policies_that_weigh_every_node_start_first_and_the_rest_keep_their_order() -> None:
    """Only the order the workers start them in: with the search every minute, Karpenter's consolidation (every node
    with pods weighed) is the longest replay, so it starts first and two workers finish together."""
    catalog = make_catalog()
    built = [build_policy(name, CONFIG, catalog, [make_pod()]) for name in POLICY_NAMES]
    assert [p.name for p in submission_order(built)] == [
        "karpenter-like", "ours", "ours-no-prediction", "fixed-node-group"]

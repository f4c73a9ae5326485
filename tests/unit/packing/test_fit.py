"""What a node of a pool holds: capacity, overhead, GPU sharing, MIG slices, fractional types."""

from __future__ import annotations

import math

import pytest

from gpu_autoscaler.config import GpuSharing, NodePool, Overhead
from gpu_autoscaler.domain.launch_templates import efa_count
from gpu_autoscaler.domain.packing.fit import (
    VM_MEMORY_OVERHEAD,
    allocatable,
    fits,
    gpu_equivalent,
    node_capacity,
    pod_requests,
)
from gpu_autoscaler.domain.packing.mig import mig_gpu, mig_slices
from gpu_autoscaler.models.catalog import InstanceType
from gpu_autoscaler.models.resources import EFA, HUGEPAGES_2MI, Resources
from tests.unit.packing.builders import make_pod, make_type

GI = 2**30


def pool(**sharing: object) -> NodePool:
    return NodePool(name="p", gpu_sharing=GpuSharing(**sharing) if sharing else GpuSharing())


def test_capacity_of_a_whole_gpu_node() -> None:
    capacity = node_capacity(make_type("g5.12xlarge"), pool())
    assert capacity["cpu"] == 48_000
    assert capacity["memory"] == int(196608 * 2**20 * (1 - VM_MEMORY_OVERHEAD))
    assert capacity["nvidia.com/gpu"] == 4
    assert capacity["pods"] == 234
    assert capacity["ephemeral-storage"] == 97 * GI  # the filesystem on the 100Gi volume: less 2 % and 1 GiB


@pytest.mark.parametrize(("volume", "measured_capacity"), [
    ("20Gi", 20_959_212 * 2**10),
    ("20Gi", 20_624_592 * 2**10),
    ("50Gi", math.floor((43.99 + 1) / 0.9 * GI)),
])
def test_planned_ephemeral_storage_is_no_more_than_a_real_node_reports(volume: str, measured_capacity: int) -> None:
    """The kubelet's ephemeral-storage is the filesystem on the volume, not the volume. Measured: an EKS AMI's
    20 GiB XFS root is a 20,959,212 KiB filesystem (awslabs/amazon-eks-ami PR #1126); a Bottlerocket 20 GiB ext4
    data volume reports 20,624,592 KiB (eksctl-io/eksctl #4434); a 50 GiB root leaves under 43.99 GiB allocatable
    (aws/karpenter-provider-aws #4017: 43.98, truncated), so its capacity is under (43.99 + 1) / 0.9 GiB."""
    pool = NodePool(name="p", ephemeral_storage=volume)
    capacity = node_capacity(make_type("g6.xlarge"), pool)
    assert capacity["ephemeral-storage"] <= measured_capacity
    planned = allocatable(make_type("g6.xlarge"), pool, Overhead(daemonsets={}))["ephemeral-storage"]
    assert planned <= measured_capacity - GI - math.ceil(measured_capacity * 0.10)


def test_allocatable_subtracts_daemonsets_kube_reserved_and_eviction_thresholds() -> None:
    overhead = Overhead(daemonsets={"cpu": "200m", "memory": "256Mi", "pods": "3"},
                        kube_reserved={"cpu": "100m", "memory": "1Gi", "ephemeral-storage": "1Gi"})
    t = make_type("g5.xlarge")
    capacity = node_capacity(t, pool())
    alloc = allocatable(t, pool(), overhead)
    assert alloc["cpu"] == 4000 - 300
    assert alloc["memory"] == capacity["memory"] - 256 * 2**20 - GI - 100 * 2**20
    assert alloc["pods"] == 58 - 3
    assert alloc["ephemeral-storage"] == 97 * GI - GI - math.ceil(9.7 * GI)


def test_by_default_a_node_reserves_what_an_eks_ami_would() -> None:
    """kube-reserved memory 11Mi × max pods + 255Mi, cpu by the core ladder, 1Gi of disk; eviction at 100Mi."""
    t = make_type("g5.12xlarge")  # 48 vCPUs, 234 pods
    capacity = node_capacity(t, pool())
    alloc = allocatable(t, pool(), Overhead(daemonsets={}))
    assert alloc["cpu"] == 48_000 - (60 + 10 + 10 + 110)
    assert alloc["memory"] == capacity["memory"] - (11 * 234 + 255) * 2**20 - 100 * 2**20
    assert alloc["ephemeral-storage"] == 97 * GI - GI - math.ceil(9.7 * GI)


def test_configured_reservations_replace_the_defaults_key_by_key() -> None:
    t = make_type("g5.12xlarge")
    default = allocatable(t, pool(), Overhead(daemonsets={}))
    custom = allocatable(t, pool(), Overhead(daemonsets={}, kube_reserved={"memory": "1Gi"},
                                             system_reserved={"cpu": "500m"},
                                             eviction_hard={"memory.available": "1%"}))
    capacity = node_capacity(t, pool())
    assert custom["cpu"] == default["cpu"] - 500
    assert custom["memory"] == capacity["memory"] - GI - -(-capacity["memory"] // 100)


def test_an_overhead_that_is_not_a_quantity_is_refused() -> None:
    with pytest.raises(ValueError, match="systemReserved|system_reserved"):
        Overhead.model_validate({"systemReserved": {"memory": "lots"}})
    with pytest.raises(ValueError, match="neither a quantity nor a percentage"):
        Overhead.model_validate({"evictionHard": {"memory.available": "ten%"}})


def test_time_slicing_multiplies_gpu_devices_by_replicas() -> None:
    assert node_capacity(make_type("g5.12xlarge"), pool(mode="time-slicing", replicas=4))["nvidia.com/gpu"] == 16


def test_fractional_type_advertises_its_partition_as_one_device() -> None:
    g6f = make_type("g6f.large")
    assert node_capacity(g6f, pool())["nvidia.com/gpu"] == 1
    assert node_capacity(g6f, pool(mode="time-slicing", replicas=2))["nvidia.com/gpu"] == 2
    assert node_capacity(g6f, pool(mode="mig", mig_profile="1g.10gb"))["nvidia.com/gpu"] == 1


@pytest.mark.parametrize(("name", "profile", "slices"), [
    ("p4d.24xlarge", "1g.5gb", 56),      # A100 40 GB: 7 per GPU
    ("p4d.24xlarge", "3g.20gb", 16),
    ("p4de.24xlarge", "1g.10gb", 56),    # A100 80 GB
    ("p5.48xlarge", "2g.20gb", 24),      # H100 80 GB: 3 per GPU
    ("p5.4xlarge", "7g.80gb", 1),
    ("p4d.24xlarge", "1g.10gb", 32),     # A100 40 GB has 1g.10gb too: 4 per GPU
    ("p5.48xlarge", "1g.5gb", 0),        # not an H100 profile
])
def test_mig_slices_by_gpu_model_and_profile(name: str, profile: str, slices: int) -> None:
    assert mig_slices(make_type(name), profile) == slices


def test_mig_pool_advertises_slices_not_whole_gpus_on_mig_capable_types() -> None:
    mig = pool(mode="mig", mig_profile="1g.10gb")
    capacity = node_capacity(make_type("p5.48xlarge"), mig)
    assert capacity["nvidia.com/mig-1g.10gb"] == 56 and capacity["nvidia.com/gpu"] == 0
    assert node_capacity(make_type("g5.xlarge"), mig)["nvidia.com/gpu"] == 1  # A10G: no MIG, whole GPU


def test_a_media_engine_profile_is_advertised_under_the_device_plugins_name() -> None:
    """The device plugin names a mixed-strategy slice `mig-<profile>` with `+` turned into `.` (k8s-device-plugin
    internal/rm/rm.go, AddDefaultResourcesToConfig): `+` is not allowed in an extended resource name."""
    capacity = node_capacity(make_type("p5.48xlarge"), pool(mode="mig", mig_profile="1g.10gb+me"))
    assert capacity["nvidia.com/mig-1g.10gb.me"] == 8
    assert "nvidia.com/mig-1g.10gb+me" not in capacity.keys()


def test_a_media_engine_slice_is_its_share_of_the_gpu_its_profile_names() -> None:
    assert gpu_equivalent({"nvidia.com/mig-1g.6gb.me": 1}, pool()) == pytest.approx(1 / 4)  # an A30's
    assert gpu_equivalent({"nvidia.com/mig-1g.10gb.me": 7}, pool()) == pytest.approx(1)


def test_mig_table_matches_models_by_memory() -> None:
    assert mig_gpu("A100", 40960).memory_gib == 40  # type: ignore[union-attr]
    assert mig_gpu("A100", 81920).memory_gib == 80  # type: ignore[union-attr]
    assert mig_gpu("H200", 1155072 / 8).memory_gib == 141  # type: ignore[union-attr]
    assert mig_gpu("B200", 1466872 / 8).memory_gib == 180  # type: ignore[union-attr]
    assert mig_gpu("L4", 22888) is None
    assert mig_gpu("A30", 24576).profiles["1g.6gb"] == 4  # type: ignore[union-attr]


P5 = InstanceType(name="p5.48xlarge", vcpu=192, memory_mib=2097152, gpus=8, gpu_devices=8, gpu_model="H100",
                  gpu_manufacturer="NVIDIA", gpu_memory_mib=655360, efa=True, efa_interfaces=32, max_pods=100)
G6E_12 = InstanceType(name="g6e.12xlarge", vcpu=48, memory_mib=393216, gpus=4, gpu_devices=4, gpu_model="L40S",
                      gpu_manufacturer="NVIDIA", gpu_memory_mib=183104, efa=True, efa_interfaces=1, max_pods=234)


def test_an_efa_pool_node_advertises_the_efas_its_launch_template_attaches() -> None:
    """The EFA device plugin advertises each EFA the instance has as one `vpc.amazonaws.com/efa` (EKS User Guide,
    ml/node-efa.adoc); the launch attaches `efa_count` of them (one per network card, from the EFA template)."""
    efa_pool = NodePool(name="p", efa=True)
    assert node_capacity(P5, efa_pool)[EFA] == efa_count(P5.efa_interfaces) == 32
    assert allocatable(P5, efa_pool, Overhead())[EFA] == 32
    assert node_capacity(G6E_12, efa_pool)[EFA] == 1
    assert node_capacity(P5, pool())[EFA] == 0  # launched without EFAs: nothing to advertise
    assert node_capacity(make_type("g5.xlarge"), efa_pool)[EFA] == 0  # a type without EFA


def test_an_efa_node_plans_the_huge_pages_its_ami_pre_allocates_less_their_memory() -> None:
    """With an EFA attached, Bottlerocket sets vm.nr_hugepages to 110 per CPU (bottlerocket-core-kit corndog
    `compute_hugepages_for_efa`) and the EFA installer of the AL2023 AMIs one page more; the kubelet advertises them
    as `hugepages-2Mi` and takes them out of allocatable memory (kubernetes pkg/kubelet/nodestatus/setters.go)."""
    plain = allocatable(G6E_12, pool(), Overhead())
    efa = allocatable(G6E_12, NodePool(name="p", efa=True), Overhead())
    pages = 110 * G6E_12.vcpu  # 5,280 pages, 10,560 MiB
    assert efa[HUGEPAGES_2MI] == pages * 2 * 2**20
    assert efa["memory"] == plain["memory"] - (pages + 1) * 2 * 2**20
    assert plain[HUGEPAGES_2MI] == 0


def test_a_pod_takes_one_pods_slot() -> None:
    requests = pod_requests(make_pod(gpus=2, cpu="500m", memory="1Gi"))
    assert requests == Resources({"cpu": 500, "memory": GI, "nvidia.com/gpu": 2, "pods": 1})
    assert fits(requests, {"cpu": 500, "memory": GI, "nvidia.com/gpu": 2, "pods": 1})
    assert not fits(requests, {"cpu": 500, "memory": GI, "nvidia.com/gpu": 2})


def test_gpu_equivalent_counts_physical_gpus() -> None:
    assert gpu_equivalent({"nvidia.com/gpu": 2}, pool()) == 2
    assert gpu_equivalent({"nvidia.com/gpu": 2}, pool(mode="time-slicing", replicas=4)) == 0.5
    assert gpu_equivalent({"nvidia.com/mig-3g.40gb": 2}, pool()) == pytest.approx(6 / 7)


def test_a_mig_slice_is_its_share_of_the_gpu_its_profile_names() -> None:
    """An A30 has four compute slices, the rest of NVIDIA's MIG GPUs seven: the profile's name says which."""
    assert gpu_equivalent({"nvidia.com/mig-2g.12gb": 1}, pool()) == pytest.approx(2 / 4)
    assert gpu_equivalent({"nvidia.com/mig-1g.6gb": 4}, pool()) == pytest.approx(1)
    single = pool(mode="mig", migStrategy="single", migProfile="1g.6gb")
    assert gpu_equivalent({"nvidia.com/gpu": 2}, single) == pytest.approx(2 / 4)
    assert gpu_equivalent({"nvidia.com/mig-1g.10gb": 7}, pool()) == pytest.approx(1)

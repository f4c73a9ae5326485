"""What a node of a pool can hold, and whether pods fit it: the one copy of the fit logic.

The packer, its benchmarks and consolidation all ask these questions, so they are answered here and
nowhere else. A node's allocatable is what kubelet would report for it:

- cpu: the instance's vCPUs; memory: the instance's memory less the hypervisor's share (Karpenter's
  default `vmMemoryOverheadPercent`, 7.5 %: a 16 GiB instance shows about 15.2 GiB to the kernel);
- ephemeral-storage: the filesystem on the pool's `ephemeralStorage` volume, the volume less 2 % and 1 GiB (the
  kubelet counts the filesystem, not the volume: `filesystem`); pods: the type's max pods;
- `vpc.amazonaws.com/efa` in an `efa: true` pool: the EFAs the node is launched with (`launched_efas`, the
  count its launch template attaches), which the EFA device plugin advertises one each; and `hugepages-2Mi`, the
  2 MiB huge pages the node's AMI pre-allocates when an EFA is attached (`efa_huge_pages`), which the kubelet
  takes out of allocatable memory;
- GPUs by the pool's sharing mode: whole devices (`nvidia.com/gpu`), devices × replicas with
  time-slicing, or slices on MIG-capable GPUs with MIG (see `mig`), named as the device plugin's MIG
  strategy names them: `nvidia.com/mig-<profile>` (mixed; `+` in a profile becomes `.`, `mig-1g.10gb.me`, see
  `resources.mig_resource`) or `nvidia.com/gpu` (single);
  a partitioned type (g6f) advertises its partition as one device;

less what the kubelet holds back (kube-reserved, system-reserved, hard eviction thresholds: the model of
`reserved`, which the user data states to every node, so the Node's allocatable is this plan; its ephemeral-storage
at least this) and the configured daemonsets' requests. Every pod also takes one of the node's `pods`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.launch_templates import launched_efas
from gpu_autoscaler.domain.packing.filesystem import filesystem_bytes
from gpu_autoscaler.domain.packing.mig import compute_share, mig_slices
from gpu_autoscaler.domain.packing.reserved import kubelet_reservations
from gpu_autoscaler.models.resources import (
    CPU,
    DRA_GPU,
    EFA,
    EPHEMERAL_STORAGE,
    GPU,
    HUGEPAGES_2MI,
    MEMORY,
    PODS,
    Resources,
    is_gpu_resource,
    mig_profile,
    mig_resource,
    parse_quantity,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.config import NodePool, Overhead
    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.models.pods import PendingPod

__all__ = [
    "BASE_RESOURCES",
    "VM_MEMORY_OVERHEAD",
    "allocatable",
    "dra_devices",
    "efa_huge_pages",
    "fits",
    "gpu_equivalent",
    "node_capacity",
    "node_overhead",
    "pod_requests",
]

VM_MEMORY_OVERHEAD = 0.075
HUGE_PAGE = 2 * 2**20
EFA_HUGE_PAGES_PER_VCPU = 110
"""2 MiB pages per CPU an EFA node's AMI pre-allocates for libfabric: 110 MiB for each of the two endpoints Open MPI
opens per core. Bottlerocket: `vm.nr_hugepages` = 110 × CPUs when an EFA is attached and no huge pages are set
(bottlerocket-core-kit sources/api/corndog/src/main.rs, `generate_hugepages_setting`, `compute_hugepages_for_efa`,
`num_cpus::get()`: logical CPUs). AL2023: the EKS AMI runs the EFA installer (amazon-eks-ami
templates/al2023/provisioners/install-efa.sh, `enable_efa` true by default), whose efa-config reserves
110 MiB × 2 × cores / 2 MiB + 1 pages (its efa-hugepages-reserve.sh as quoted in bottlerocket-core-kit pull 141;
its count of cores read here as CPUs, as the EFA check script's `lscpu` does: the script itself was not at hand)."""
BASE_RESOURCES = (CPU, MEMORY, EPHEMERAL_STORAGE, PODS, GPU)
"""Resources every node has a figure for; any other resource a pod asks for is zero unless the pool makes it."""


def node_capacity(instance_type: InstanceType, pool: NodePool) -> Resources:
    """What a node of this type in this pool has before any overhead."""
    values = {
        CPU: instance_type.vcpu * 1000,
        MEMORY: math.floor(instance_type.memory_mib * 2**20 * (1 - VM_MEMORY_OVERHEAD)),
        EPHEMERAL_STORAGE: filesystem_bytes(math.floor(parse_quantity(pool.ephemeral_storage))),
        PODS: instance_type.max_pods,
    }
    efas = launched_efas(pool, instance_type)
    if efas:
        values[EFA] = efas
        values[HUGEPAGES_2MI] = efa_huge_pages(instance_type) * HUGE_PAGE
    sharing = pool.gpu_sharing
    if sharing.mode == "mig" and sharing.mig_profile:
        slices = mig_slices(instance_type, sharing.mig_profile)
        if slices:
            values[GPU if sharing.mig_strategy == "single" else mig_resource(sharing.mig_profile)] = slices
            return Resources(values)
    values[GPU] = instance_type.gpu_devices * sharing.replicas
    return Resources(values)


def efa_huge_pages(instance_type: InstanceType) -> int:
    """The 2 MiB huge pages a node of this type pre-allocates with an EFA attached, on either AMI family: the
    110 per CPU both reserve; AL2023's extra page is only taken from memory (`node_overhead`), never offered."""
    return EFA_HUGE_PAGES_PER_VCPU * instance_type.vcpu


def gpu_devices(instance_type: InstanceType, pool: NodePool) -> dict[str, int]:
    """The GPU devices a node of this type in this pool advertises, under the names its pool's device plugin gives
    them: whole GPUs, time-sliced replicas, or MIG slices (`nvidia.com/mig-<profile>`, or `nvidia.com/gpu` with
    the single strategy)."""
    return {name: count for name, count in node_capacity(instance_type, pool).items() if is_gpu_resource(name)}


def dra_devices(instance_type: InstanceType, pool: NodePool) -> dict[str, int]:
    """Devices a node offers to DRA claims: whole NVIDIA GPUs (`resource.k8s.io/gpu.nvidia.com`, one device per
    GPU, as the NVIDIA DRA driver publishes them) in pools that neither share nor partition their GPUs.

    Not part of what the kubelet advertises: ResourceSlices are published by the driver, not as node resources.
    """
    nvidia = (instance_type.gpu_manufacturer or "").upper() == "NVIDIA"
    if pool.gpu_sharing.mode != "none" or instance_type.partitioned or not nvidia:
        return {}
    return {DRA_GPU: instance_type.gpu_devices}


def node_overhead(instance_type: InstanceType, overhead: Overhead, capacity: Mapping[str, int]) -> Resources:
    """What the kubelet holds back on a node of this type (as its user data tells it), plus the daemonsets, plus the
    memory of its pre-allocated huge pages: "for every huge page reservation, we need to remove it from allocatable
    memory" (kubernetes pkg/kubelet/nodestatus/setters.go, MachineInfo) — one page more than advertised, as many as
    the AMI that reserves the most takes (`EFA_HUGE_PAGES_PER_VCPU`)."""
    held_back = kubelet_reservations(instance_type, overhead).held_back(capacity)
    huge = capacity.get(HUGEPAGES_2MI, 0)
    huge_pages = Resources({MEMORY: huge + HUGE_PAGE}) if huge else Resources({})
    return held_back + Resources.from_quantities(overhead.daemonsets) + huge_pages


def allocatable(instance_type: InstanceType, pool: NodePool, overhead: Overhead) -> Resources:
    """What pods may request on a node of this type in this pool (never below zero)."""
    capacity = node_capacity(instance_type, pool)
    left = capacity - node_overhead(instance_type, overhead, capacity)
    return Resources({name: max(value, 0) for name, value in left.items()})


def pod_requests(pod: PendingPod) -> Resources:
    """The pod's requests plus the one `pods` slot it takes."""
    return pod.footprint


def fits(requests: Mapping[str, int], capacity: Mapping[str, int]) -> bool:
    return all(value <= capacity.get(name, 0) for name, value in requests.items() if value)


def gpu_equivalent(requests: Mapping[str, int], pool: NodePool) -> float:
    """Physical GPUs a pod's request stands for: what demand history and GPU limits count.

    A time-sliced device is 1/replicas of a GPU; a MIG slice is its compute share (`mig.compute_share`: `3g.40gb`
    is 3/7 of an H100, `2g.12gb` 2/4 of an A30).
    """
    total = 0.0
    sharing = pool.gpu_sharing
    single_mig = sharing.mode == "mig" and sharing.mig_strategy == "single" and sharing.mig_profile
    slices: Mapping[str, int] = requests  # read, never changed: no copy (demand counts every pod each tick)
    if single_mig:
        slices = {mig_resource(str(sharing.mig_profile)): requests.get(GPU, 0)}
    else:
        total += requests.get(GPU, 0) / sharing.replicas
    for name, count in slices.items():
        profile = mig_profile(name)
        if profile is None or not count:
            continue
        total += count * compute_share(profile)
    return total

"""The machine an instance runs on, as its kubelet and the NVIDIA driver see it — from EC2, not our catalog.

Facts come from EC2's own answers (DescribeInstanceTypes: vCPUs, memory, architecture, GPUs with name, count
and per-GPU memory, ENI limits; DescribeVolumes: the instance's volumes; DescribeInstances: the EFA interfaces it
was launched with), so a node's size is what AWS says the instance has, whatever the project believed when it
planned. What a kubelet derives from them — its capacity, the default reservations of the EKS AMIs, the huge pages
they reserve for EFA — is written here from those AMIs' documentation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["HUGE_PAGE", "Gpu", "Machine", "describe_machine", "eni_max_pods", "reserved_cpu_millicores"]

VM_MEMORY_OVERHEAD = 0.075
"""The share of an instance's memory the kernel never shows (Karpenter docs, Settings, `VM_MEMORY_OVERHEAD_PERCENT`)."""
GIB = 2**30
DATA_DEVICE = "/dev/xvdb"
"""Bottlerocket's data device (Bottlerocket README, Default Volumes)."""
HUGE_PAGE = 2 * 2**20
"""x86_64's default huge page size, the one the EFA setups below reserve pages of."""
_EFA_INTERFACE_TYPES = ("efa", "efa-only")


@dataclass(frozen=True)
class Gpu:
    """One kind of GPU in the machine (EC2 `GpuInfo.Gpus[]`)."""

    name: str
    manufacturer: str
    count: int
    memory_mib: int
    """Memory of one GPU."""


@dataclass(frozen=True)
class Machine:
    instance_type: str
    vcpus: int
    memory_mib: int
    architecture: str = "x86_64"
    gpu: Gpu | None = None
    max_enis: int = 4
    ipv4_per_eni: int = 15
    root_volume_gib: int = 20
    data_volume_gib: int | None = None
    """The volume on `/dev/xvdb`, if the instance has one: Bottlerocket's data device."""
    efa_devices: int = 0
    """EFA devices the instance has: one per interface of type `efa` or `efa-only` it was launched with."""

    def huge_pages(self, os_family: str) -> int:
        """2 MiB huge pages the AMI pre-allocates at boot, before the kubelet starts: none without an EFA. With one,
        Bottlerocket sets `vm.nr_hugepages` to 110 per CPU when no huge pages are configured (bottlerocket-core-kit
        sources/api/corndog/src/main.rs, `generate_hugepages_setting`: `compute_hugepages_for_efa(num_cpus::get())`,
        "The number of hugepage per core would be 110MB * 2 / 2MB = 110"). The AL2023 EKS AMI has the EFA installer
        (amazon-eks-ami templates/al2023/provisioners/install-efa.sh), whose efa-config reserves
        110 MiB × 2 per CPU, in pages, plus one (efa-hugepages-reserve.sh, `efa_total_huge_pages_memory /
        huge_pages_size + 1`, as quoted in bottlerocket-core-kit pull 141's review)."""
        if not self.efa_devices:
            return 0
        per_cpu = 110 * self.vcpus
        return per_cpu if os_family == "Bottlerocket" else per_cpu + 1

    def kubelet_volume_gib(self, os_family: str) -> int:
        """The volume the kubelet's ephemeral storage lives on. Bottlerocket: its data device — "The root
        device, `/dev/xvda`, holds the active and passive partition sets [...] The data device, `/dev/xvdb`, is
        used as persistent storage for container images, container orchestration, host-containers, and bootstrap
        containers" (Bottlerocket README, Default Volumes). The EKS AL2023 AMI: its root device."""
        if os_family == "Bottlerocket" and self.data_volume_gib is not None:
            return self.data_volume_gib
        return self.root_volume_gib

    @property
    def arch_label(self) -> str:
        return "arm64" if self.architecture == "arm64" else "amd64"

    def memory_bytes(self) -> int:
        """MemTotal as the kernel reports it: the instance's memory less the hypervisor's share."""
        return math.floor(self.memory_mib * 2**20 * (1 - VM_MEMORY_OVERHEAD))


def eni_max_pods(machine: Machine) -> int:
    """The EKS AMIs' default max pods with the VPC CNI (amazon-eks-ami, max-pods-calculator):
    ENIs × (IPv4 addresses per ENI − 1) + 2."""
    return machine.max_enis * (machine.ipv4_per_eni - 1) + 2


def reserved_cpu_millicores(vcpus: int) -> int:
    """kube-reserved CPU the EKS AMIs (nodeadm, Bottlerocket) reserve by default: 6 % of the first core, 1 % of
    the second, 0.5 % of the next two, 0.25 % of every further one."""
    total = 0.0
    for core in range(vcpus):
        total += 60 if core == 0 else 10 if core == 1 else 5 if core < 4 else 2.5
    return int(total)


def describe_machine(ec2: Any, instance_id: str) -> tuple[Machine, dict[str, Any]]:
    """The machine behind an instance and its DescribeInstances entry."""
    described = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    info = ec2.describe_instance_types(InstanceTypes=[described["InstanceType"]])["InstanceTypes"][0]
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    gpu = None
    if gpus:
        first = gpus[0]
        gpu = Gpu(name=first.get("Name", ""), manufacturer=first.get("Manufacturer", ""),
                  count=int(first.get("Count", 0)), memory_mib=int((first.get("MemoryInfo") or {}).get("SizeInMiB", 0)))
    network = info.get("NetworkInfo") or {}
    # The VPC CNI attaches ENIs on the default network card only (eni-max-pods.txt: p4d.24xlarge is 737 pods).
    cards = {c.get("NetworkCardIndex"): c for c in network.get("NetworkCards") or ()}
    default_card = cards.get(network.get("DefaultNetworkCardIndex", 0)) or {}
    enis = int(default_card.get("MaximumNetworkInterfaces") or network.get("MaximumNetworkInterfaces", 4))
    volumes = _volume_gib(ec2, described)
    # The root device's volume, else the first mapped (an AMI whose RootDeviceName no mapping names).
    root = volumes.get(described.get("RootDeviceName") or "", next(iter(volumes.values()), None))
    machine = Machine(
        instance_type=described["InstanceType"],
        vcpus=int(info["VCpuInfo"]["DefaultVCpus"]),
        memory_mib=int(info["MemoryInfo"]["SizeInMiB"]),
        architecture=described.get("Architecture") or (info.get("ProcessorInfo") or {}).get(
            "SupportedArchitectures", ["x86_64"])[0],
        gpu=gpu,
        max_enis=enis,
        ipv4_per_eni=int(network.get("Ipv4AddressesPerInterface", 15)),
        root_volume_gib=root if root is not None else Machine.root_volume_gib,
        data_volume_gib=volumes.get(DATA_DEVICE),
        efa_devices=sum(1 for i in described.get("NetworkInterfaces") or ()
                        if i.get("InterfaceType") in _EFA_INTERFACE_TYPES),
    )
    return machine, described


def _volume_gib(ec2: Any, described: dict[str, Any]) -> dict[str, int]:
    """Device name → size in GiB of the instance's EBS volumes, in their mapping order."""
    devices = {((m.get("Ebs") or {}).get("VolumeId")): m.get("DeviceName", "")
               for m in described.get("BlockDeviceMappings") or []}
    devices.pop(None, None)
    if not devices:
        return {}
    sizes = {v["VolumeId"]: int(v["Size"]) for v in ec2.describe_volumes(VolumeIds=list(devices)).get("Volumes") or []
             if "VolumeId" in v and "Size" in v}
    return {device: sizes[volume] for volume, device in devices.items() if volume in sizes}

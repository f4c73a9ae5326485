"""What a node's kubelet holds back from pods: kube-reserved, system-reserved and the hard eviction thresholds.

One model with two users, so a node offers exactly the room the packer planned on it: the packer subtracts
it from a node's capacity (`fit.allocatable`), and the user data states it to the kubelet
(`user_data.reservation_settings`) instead of leaving the AMI to pick its own figures.

The defaults are the EKS AMIs' own, so a pool without overrides gets what an EKS node would have anyway
(awslabs/amazon-eks-ami, nodeadm `internal/kubelet/config.go`, `withDefaultReservedResources` and
`defaultKubeletSubConfig`; Bottlerocket, bottlerocket.dev "settings.kubernetes" `kube-reserved`, computed
the same way):

- kube-reserved memory: 11 MiB per pod of the node's max pods + 255 MiB;
- kube-reserved CPU: 6 % of the first core, 1 % of the second, 0.5 % of the next two, 0.25 % of the rest;
- kube-reserved ephemeral storage: 1 GiB; no system-reserved;
- hard eviction: `memory.available` 100Mi, `nodefs.available` 10 %, `nodefs.inodesFree` 5 %.

Stating them matters even when they equal the defaults: nodeadm derives its figure from the type's default
max pods, not from the max pods the user data sets, and a partial `evictionHard` would zero the signals it
leaves out. The configuration's `overhead.kubeReserved`, `systemReserved` and `evictionHard` replace the
defaults key by key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpu_autoscaler.models.resources import CPU, EPHEMERAL_STORAGE, MEMORY, Resources

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.config import Overhead
    from gpu_autoscaler.models.catalog import InstanceType

__all__ = [
    "EVICTION_HARD",
    "KubeletReservations",
    "eks_kube_reserved",
    "kubelet_reservations",
    "reserved_cpu_millicores",
]

EVICTION_HARD = {"memory.available": "100Mi", "nodefs.available": "10%", "nodefs.inodesFree": "5%"}
"""nodeadm's (and the kubelet's) default hard eviction thresholds."""
_CPU_LADDER = ((0, 1000, 600), (1000, 2000, 100), (2000, 4000, 50), (4000, None, 25))
"""(from, to millicores, share in hundredths of a percent): nodeadm's `getCPUMillicoresToReserve` ranges."""
_EVICTION_RESOURCES = {"memory.available": MEMORY, "nodefs.available": EPHEMERAL_STORAGE}
"""The eviction signals that reduce allocatable (inode and image filesystem signals do not)."""


@dataclass(frozen=True)
class KubeletReservations:
    """The kubelet settings that decide a node's allocatable, as quantity strings the kubelet takes."""

    kube_reserved: dict[str, str]
    system_reserved: dict[str, str]
    eviction_hard: dict[str, str]

    def held_back(self, capacity: Mapping[str, int]) -> Resources:
        """What the kubelet subtracts from this capacity: Node Allocatable = capacity − kube-reserved −
        system-reserved − hard eviction thresholds (kubernetes.io, "Reserve Compute Resources")."""
        eviction = {}
        for signal, resource in _EVICTION_RESOURCES.items():
            value = self.eviction_hard.get(signal)
            if not value:
                continue
            if value.endswith("%"):
                eviction[resource] = math.ceil(capacity.get(resource, 0) * float(value[:-1]) / 100)
            else:
                eviction[resource] = Resources.from_quantities({resource: value})[resource]
        return (Resources.from_quantities(self.kube_reserved) + Resources.from_quantities(self.system_reserved)
                + eviction)


def reserved_cpu_millicores(vcpus: int) -> int:
    """The EKS AMIs' kube-reserved CPU for this many vCPUs (integer millicores per range, as nodeadm)."""
    total = vcpus * 1000
    reserved = 0
    for start, end, share in _CPU_LADDER:
        if total > start:
            reserved += (min(total, end if end is not None else total) - start) * share // 10000
    return reserved


def eks_kube_reserved(vcpus: int, max_pods: int) -> dict[str, str]:
    """kube-reserved as an EKS AMI computes it for a node of this size."""
    return {CPU: f"{reserved_cpu_millicores(vcpus)}m", MEMORY: f"{11 * max_pods + 255}Mi",
            EPHEMERAL_STORAGE: "1Gi"}


def kubelet_reservations(instance_type: InstanceType, overhead: Overhead) -> KubeletReservations:
    """The reservations of a node of this type: the EKS defaults, overridden key by key by the configuration."""
    return KubeletReservations(
        kube_reserved=eks_kube_reserved(instance_type.vcpu, instance_type.max_pods) | overhead.kube_reserved,
        system_reserved=dict(overhead.system_reserved),
        eviction_hard=EVICTION_HARD | overhead.eviction_hard,
    )

"""What nodes launch with: the launch template of each capacity type, and each pool's volumes and image.

Plain data (EC2 API / CloudFormation names, which agree for launch templates), so the stack
(`infra/nodes.py`) and the emulator's provisioning (`emulator/resources.py`) write the same templates.

One template per capacity type, because EC2 refuses what one template for all would say:

- `spot-instances-request` tags only in the Spot template. EC2 refuses a launch that creates no Spot
  request but tags one ("You cannot specify tags for Spot instances requests if there are no Spot
  instances requests being created by the request"); Karpenter keeps that tag in its Spot templates only.
- `CapacityReservationPreference: none` in the Spot and On-Demand templates. Without it the preference is
  `open` and On-Demand launches silently run in any open On-Demand Capacity Reservation of a matching
  type and zone — the reserved pool's — billed and recorded wrongly, leaving the reserved pool short.
  The reserved template leaves it out: each reserved CreateFleet names its reservations itself
  (`ReservedCapacityOptions.CapacityReservationTarget`).

Volumes and image are per pool and go with each launch (CreateFleet overrides carry `BlockDeviceMappings`
and `ImageId`), so three templates serve every pool.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.config import GIB, BlockDeviceMapping, EbsVolume
from gpu_autoscaler.models.labels import TAG_CLUSTER
from gpu_autoscaler.models.resources import parse_quantity

if TYPE_CHECKING:
    from gpu_autoscaler.config import Ami, CapacityType, Config, NodePool

__all__ = [
    "BOTTLEROCKET_OS_VOLUME_GIB",
    "CAPACITY_TYPES",
    "DATA_VOLUME_GIB",
    "block_device_mappings",
    "ebs_api",
    "ephemeral_device",
    "ephemeral_gib",
    "launch_template_data",
    "launched_resource_types",
    "pool_block_device_mappings",
]

CAPACITY_TYPES: tuple[CapacityType, ...] = ("on-demand", "spot", "reserved")
DATA_VOLUME_GIB = 200
"""The templates' own volume: every launch overrides it with its pool's (`pool_block_device_mappings`)."""
BOTTLEROCKET_OS_VOLUME_GIB = 4
_COMMON_RESOURCE_TYPES = ("instance", "volume", "network-interface")


def launched_resource_types(capacity_type: CapacityType) -> tuple[str, ...]:
    """What a launch of this capacity type creates, each tagged by the template with the ownership tag (the
    IAM condition on `aws:RequestTag/gpu-autoscaler/cluster` then holds for all of them)."""
    return (*_COMMON_RESOURCE_TYPES, "spot-instances-request") if capacity_type == "spot" else _COMMON_RESOURCE_TYPES


def ephemeral_device(ami: Ami) -> str:
    """The volume kubelet's ephemeral storage lives on: AL2023's root, Bottlerocket's data volume."""
    return "/dev/xvdb" if ami.family == "Bottlerocket" else "/dev/xvda"


def pool_block_device_mappings(config: Config, pool: NodePool) -> tuple[BlockDeviceMapping, ...]:
    """The pool's volumes: as it sets them, else one volume of its `ephemeralStorage` (rounded up to GiB)
    on the device kubelet uses, plus Bottlerocket's OS volume."""
    if pool.block_device_mappings:
        return tuple(pool.block_device_mappings)
    return block_device_mappings(config.pool_ami(pool), ephemeral_gib(pool))


def ephemeral_gib(pool: NodePool) -> int:
    """The pool's `ephemeralStorage` in whole GiB, rounded up (EBS sizes are whole GiB)."""
    return max(1, math.ceil(parse_quantity(pool.ephemeral_storage) / GIB))


def block_device_mappings(ami: Ami, ephemeral_gib: int) -> tuple[BlockDeviceMapping, ...]:
    def volume(device: str, gib: int) -> BlockDeviceMapping:
        return BlockDeviceMapping(device_name=device, ebs=EbsVolume(volume_size=gib))

    if ami.family == "Bottlerocket":
        return (volume("/dev/xvda", BOTTLEROCKET_OS_VOLUME_GIB), volume("/dev/xvdb", ephemeral_gib))
    return (volume("/dev/xvda", ephemeral_gib),)


def ebs_api(mappings: tuple[BlockDeviceMapping, ...] | list[BlockDeviceMapping]) -> list[dict[str, Any]]:
    """Mappings in EC2's API names (launch template data, CreateFleet overrides)."""
    out = []
    for mapping in mappings:
        ebs = mapping.ebs
        spec: dict[str, Any] = {"VolumeType": ebs.volume_type, "Encrypted": ebs.encrypted,
                                "DeleteOnTermination": ebs.delete_on_termination}
        if ebs.size_gib is not None:
            spec["VolumeSize"] = ebs.size_gib
        if ebs.iops is not None:
            spec["Iops"] = ebs.iops
        if ebs.throughput is not None:
            spec["Throughput"] = ebs.throughput
        if ebs.snapshot_id is not None:
            spec["SnapshotId"] = ebs.snapshot_id
        out.append({"DeviceName": mapping.device_name, "Ebs": spec})
    return out


def launch_template_data(
    config: Config, capacity_type: CapacityType, *, security_groups: list[str], instance_profile_arn: str
) -> dict[str, Any]:
    """The `LaunchTemplateData` of one capacity type's template: pinned AMI (x86_64; arm64 types override
    it), the instance profile, IMDSv2 only with one hop (pods do not borrow the node's credentials),
    encrypted gp3, detailed monitoring, the ownership tag on everything the launch creates."""
    owner = [{"Key": TAG_CLUSTER, "Value": config.cluster_name}]
    data: dict[str, Any] = {
        "ImageId": config.ami.x86_64,
        "IamInstanceProfile": {"Arn": instance_profile_arn},
        "SecurityGroupIds": list(security_groups),
        "MetadataOptions": {"HttpEndpoint": "enabled", "HttpTokens": "required", "HttpPutResponseHopLimit": 1},
        "BlockDeviceMappings": ebs_api(block_device_mappings(config.ami, DATA_VOLUME_GIB)),
        "Monitoring": {"Enabled": True},
        "TagSpecifications": [{"ResourceType": kind, "Tags": owner} for kind in launched_resource_types(capacity_type)],
    }
    if capacity_type != "reserved":
        data["CapacityReservationSpecification"] = {"CapacityReservationPreference": "none"}
    return data

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

And in every template, `InstanceMetadataTags: disabled`, said outright. Our tag keys hold a `/`
(`gpu-autoscaler/cluster`), which instance metadata cannot serve: "If you allow access to tags in instance
metadata, instance tag keys are subject to specific restrictions [no spaces or /]. Non-compliance will result in
failed launches" (EC2 User Guide, "View tags for your EC2 instances using instance metadata"). A template that
says nothing takes the account's default ("Order of precedence for instance metadata options"), and an account
whose baseline sets it to `enabled` (ModifyInstanceMetadataDefaults) would fail every launch with
`InvalidParameterValue` ("... is not a valid tag key"); Karpenter always disables it for the same reason.

Volumes and image are per pool and go with each launch (CreateFleet overrides carry `BlockDeviceMappings`
and `ImageId`), so three templates serve every pool.

EFA pools need network interfaces at launch, which CreateFleet overrides cannot carry: for them there is a
template per capacity type and EFA count (`efa_template_key`), with one EFA per network card (EC2 User Guide,
"Elastic Fabric Adapter", "Maximize network bandwidth": network card 0 holds the primary interface, device
index 0; every other card an EFA at device index 1), and the security groups on the interfaces (EC2 refuses
instance-level groups next to network interfaces).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.config import GIB, BlockDeviceMapping, EbsVolume
from gpu_autoscaler.models.labels import cluster_tags
from gpu_autoscaler.models.resources import parse_quantity

if TYPE_CHECKING:
    from gpu_autoscaler.config import Ami, CapacityType, Config, NodePool
    from gpu_autoscaler.models.catalog import InstanceType

__all__ = [
    "BOTTLEROCKET_OS_VOLUME_GIB",
    "CAPACITY_TYPES",
    "DATA_VOLUME_GIB",
    "EFA_INTERFACE_COUNTS",
    "TAG_ZONE",
    "efa_count",
    "launched_efas",
    "efa_template_key",
    "placement_group_key",
    "template_variants",
    "block_device_mappings",
    "ebs_api",
    "ephemeral_device",
    "ephemeral_gib",
    "launch_template_data",
    "launched_resource_types",
    "pool_block_device_mappings",
]

CAPACITY_TYPES: tuple[CapacityType, ...] = ("on-demand", "spot", "reserved")
TAG_ZONE = "gpu-autoscaler/zone"
"""On an EFA pool's placement group (with `gpu-autoscaler/node-pool`): the zone it serves."""
EFA_INTERFACE_COUNTS = (1, 2, 4, 8, 16, 32)
"""The EFA templates made when a pool has `efa: true`: a type gets the largest count it takes (its network
cards: g5.48xlarge 1, p4d 4, p5en 16, p5 32); EC2 allows fewer EFAs than the maximum."""
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


def efa_template_key(capacity_type: str, efa_interfaces: int) -> str:
    """The key of a template in `LAUNCH_TEMPLATES`: the capacity type, and `/efa<N>` for an EFA template."""
    return f"{capacity_type}/efa{efa_interfaces}" if efa_interfaces else capacity_type


def efa_count(max_interfaces: int) -> int:
    """The EFA template a type launches from: the largest count it takes (0: the type has no EFA)."""
    return max((n for n in EFA_INTERFACE_COUNTS if n <= max_interfaces), default=0)


def launched_efas(pool: NodePool, instance_type: InstanceType) -> int:
    """The EFAs a node of this type in this pool is launched with (its template's count in an `efa: true` pool,
    none elsewhere): what the fleet launches and what the node then advertises, `vpc.amazonaws.com/efa`."""
    return efa_count(instance_type.efa_interfaces) if pool.efa else 0


def template_variants(config: Config) -> dict[str, tuple[CapacityType, int]]:
    """Every template the stack makes: key → (capacity type, EFA interfaces). EFA templates only for the
    capacity types EFA pools launch (their own, and On-Demand they may fall back to)."""
    variants: dict[str, tuple[CapacityType, int]] = {ct: (ct, 0) for ct in CAPACITY_TYPES}
    for pool in config.node_pools:
        if pool.efa:
            for ct in {*pool.capacity_types, "on-demand"}:
                variants.update({efa_template_key(ct, n): (ct, n) for n in EFA_INTERFACE_COUNTS})
    return variants


def placement_group_key(pool: str, zone: str) -> str:
    """The key of an EFA pool's cluster placement group in one zone (`PLACEMENT_GROUPS`)."""
    return f"{pool}/{zone}"


def _efa_interfaces(count: int, security_groups: list[str]) -> list[dict[str, Any]]:
    return [{"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1, "InterfaceType": "efa",
             "Groups": list(security_groups), "DeleteOnTermination": True} for card in range(count)]


def launch_template_data(
    config: Config, capacity_type: CapacityType, *, security_groups: list[str], instance_profile_arn: str,
    efa_interfaces: int = 0,
) -> dict[str, Any]:
    """The `LaunchTemplateData` of one capacity type's template: pinned AMI (x86_64; arm64 types override
    it), the instance profile, IMDSv2 only with one hop (pods do not borrow the node's credentials), no tags in
    instance metadata (see the module's docstring), encrypted gp3, detailed monitoring, the cluster's tags
    (`labels.cluster_tags`: ours, for ownership, and EKS's) on everything the launch creates."""
    owner = [{"Key": key, "Value": value} for key, value in cluster_tags(config.cluster_name).items()]
    data: dict[str, Any] = {
        "ImageId": config.ami.x86_64,
        "IamInstanceProfile": {"Arn": instance_profile_arn},
        "SecurityGroupIds": list(security_groups),
        "MetadataOptions": {"HttpEndpoint": "enabled", "HttpTokens": "required", "HttpPutResponseHopLimit": 1,
                            "InstanceMetadataTags": "disabled"},
        "BlockDeviceMappings": ebs_api(block_device_mappings(config.ami, DATA_VOLUME_GIB)),
        "Monitoring": {"Enabled": True},
        "TagSpecifications": [{"ResourceType": kind, "Tags": owner} for kind in launched_resource_types(capacity_type)],
    }
    if capacity_type != "reserved":
        data["CapacityReservationSpecification"] = {"CapacityReservationPreference": "none"}
    if efa_interfaces:
        del data["SecurityGroupIds"]
        data["NetworkInterfaces"] = _efa_interfaces(efa_interfaces, security_groups)
    return data

"""What moto's fleets leave out: the volumes a launch's block device mappings ask for.

EC2 API Reference, FleetLaunchTemplateOverridesRequest `BlockDeviceMappings` and LaunchTemplateData
`BlockDeviceMappings`; EC2 User Guide, "Block device mappings": each EBS mapping becomes a volume of that
size, type and snapshot, attached at its device name; a mapping of the AMI's root device replaces the root
volume. An override's mappings take the place of the template's. moto's CreateFleet launches instances with
an 8 GiB root volume whatever was asked; after it answers, the instances get the volumes EC2 would have
given them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.strict.core import after
from gpu_autoscaler.emulator.strict.ec2 import fleet_launch

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.strict.core import AwsRequest

__all__: list[str] = []

_MOTO_ROOT = "/dev/sda1"
"""Where moto attaches the root volume it gives every instance."""


@after("ec2", "CreateFleet")
def _map_volumes(request: AwsRequest, result: dict[str, Any]) -> None:
    for item in result.get("Instances", []):
        launch = fleet_launch(request, item)
        if launch is None:
            continue
        data, override = launch  # the override's mappings, else the template's
        mappings = list(override.get("BlockDeviceMappings") or data.get("BlockDeviceMappings") or [])
        if mappings:
            for instance_id in item.get("InstanceIds", []):
                _attach(request, instance_id, mappings)


def _attach(request: AwsRequest, instance_id: str, mappings: list[dict[str, Any]]) -> None:
    backend = request.moto_backend()
    instance = backend.get_instance(instance_id)
    zone = instance.placement
    for mapping in mappings:
        ebs = mapping.get("Ebs")
        device = mapping.get("DeviceName")
        if not ebs or not device:
            continue
        size = ebs.get("VolumeSize")
        if size is None and ebs.get("SnapshotId"):
            size = backend.snapshots[ebs["SnapshotId"]].volume.size
        replaced = instance.block_device_mapping.get(device) or (
            instance.block_device_mapping.get(_MOTO_ROOT) if device == instance.root_device_name else None)
        if replaced is not None:
            old = next(path for path, block in instance.block_device_mapping.items() if block is replaced)
            backend.detach_volume(replaced.volume_id, instance_id, old)
            backend.delete_volume(replaced.volume_id)
        volume = backend.create_volume(size=int(size or 8), zone_name=zone, snapshot_id=ebs.get("SnapshotId"),
                                       encrypted=bool(ebs.get("Encrypted")), volume_type=ebs.get("VolumeType"),
                                       iops=ebs.get("Iops"), throughput=ebs.get("Throughput"))
        backend.attach_volume(volume.id, instance_id, device, bool(ebs.get("DeleteOnTermination", True)))

"""What moto's fleets leave out: the security groups a launch template gives its instances.

EC2 API Reference, RequestLaunchTemplateData `SecurityGroupIds` ("The IDs of the security groups. If you specify
a network interface, you must specify any security groups as part of the network interface instead") and
LaunchTemplateInstanceNetworkInterfaceSpecificationRequest `Groups`; EC2 User Guide, "Store instance launch
parameters in Amazon EC2 launch templates": an instance launched from a template (CreateFleet's
`LaunchTemplateConfigs`) gets the template's parameters, its security groups among them. moto's CreateFleet
reads none of them and puts every instance in its VPC's default group; after it answers, the instances get the
groups EC2 would have given them (the template's, else its primary interface's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.strict.core import after
from gpu_autoscaler.emulator.strict.ec2 import launch_template_data

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.strict.core import AwsRequest

__all__: list[str] = []


@after("ec2", "CreateFleet")
def _apply_groups(request: AwsRequest, result: dict[str, Any]) -> None:
    backend = request.moto_backend()
    for item in result.get("Instances", []):
        spec = (item.get("LaunchTemplateAndOverrides") or {}).get("LaunchTemplateSpecification") or {}
        groups = _groups(launch_template_data(request, spec))
        # An unknown group is EC2's refusal (InvalidGroup.NotFound), not this rule's: moto's answer stands.
        if groups and all(backend.get_security_group_from_id(g) is not None for g in groups):
            for instance_id in item.get("InstanceIds", []):
                backend.modify_instance_security_groups(instance_id, groups)


def _groups(data: dict[str, Any]) -> list[str]:
    """The template's `SecurityGroupIds`, else those of its interface at device index 0 (card 0)."""
    if data.get("SecurityGroupIds"):
        return list(data["SecurityGroupIds"])
    primary = [i for i in data.get("NetworkInterfaces") or []
               if int(i.get("DeviceIndex", 0)) == 0 and int(i.get("NetworkCardIndex", 0)) == 0]
    return list((primary[0] if primary else {}).get("Groups") or [])

"""What the nodes launch with: one launch template per capacity type and an instance profile.

The templates' data comes from `gpu_autoscaler.domain.launch_templates` (shared with the emulator), which
says why there are three: only the Spot one tags `spot-instances-request`, and the Spot and On-Demand ones
opt out of open capacity reservations.

The node role itself comes from the configuration (`nodeRole`): the cluster must already trust it (EKS access
entry or aws-auth), which is the cluster owner's decision, so the stack only wraps it in an instance profile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CfnTag
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from gpu_autoscaler.domain.launch_templates import CAPACITY_TYPES, launch_template_data
from gpu_autoscaler.models.labels import TAG_CLUSTER

if TYPE_CHECKING:
    from gpu_autoscaler.config import CapacityType, Config
    from gpu_autoscaler.naming import ResourceNames

__all__ = ["NodeLaunchTemplate", "role_name"]


def role_name(role_arn: str) -> str:
    """The name of a role from its ARN, path dropped (`arn:aws:iam::1:role/path/name` → `name`)."""
    return role_arn.rsplit("/", 1)[-1]


class NodeLaunchTemplate(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: Config, names: ResourceNames) -> None:
        super().__init__(scope, construct_id)
        self.node_role = iam.Role.from_role_arn(self, "NodeRole", config.node_role, mutable=False)
        self.instance_profile = iam.CfnInstanceProfile(
            self,
            "InstanceProfile",
            instance_profile_name=names.instance_profile,
            roles=[role_name(config.node_role)],
        )
        owner = [CfnTag(key=TAG_CLUSTER, value=config.cluster_name)]
        self.templates: dict[CapacityType, ec2.CfnLaunchTemplate] = {}
        for capacity_type in CAPACITY_TYPES:
            construct = "LaunchTemplate" if capacity_type == "on-demand" else \
                f"{''.join(p.title() for p in capacity_type.split('-'))}LaunchTemplate"
            template = ec2.CfnLaunchTemplate(
                self,
                construct,
                launch_template_name=names.capacity_launch_template(capacity_type),
                version_description=f"{config.ami.family} {config.ami.version} {capacity_type}",
                launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(),
                tag_specifications=[
                    ec2.CfnLaunchTemplate.LaunchTemplateTagSpecificationProperty(
                        resource_type="launch-template", tags=owner
                    )
                ],
            )
            template.add_property_override("LaunchTemplateData", launch_template_data(
                config, capacity_type, security_groups=list(config.network.security_groups),
                instance_profile_arn=self.instance_profile.attr_arn,
            ))
            self.templates[capacity_type] = template

    @property
    def launch_template_id(self) -> str:
        """The On-Demand template: the fleet function's `LAUNCH_TEMPLATE_ID`."""
        return self.templates["on-demand"].ref

    @property
    def launch_template_ids(self) -> dict[str, str]:
        """Capacity type → template id: the fleet function's `LAUNCH_TEMPLATES`."""
        return {capacity_type: template.ref for capacity_type, template in self.templates.items()}

"""What the nodes launch with: one launch template per capacity type and an instance profile.

The templates' data comes from `gpu_autoscaler.domain.launch_templates` (shared with the emulator), which
says why there are three: only the Spot one tags `spot-instances-request`, and the Spot and On-Demand ones
opt out of open capacity reservations.

The node role itself comes from the configuration (`nodeRole`): the cluster must already trust it (EKS access
entry or aws-auth), which is the cluster owner's decision, so the stack only wraps it in an instance profile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CfnDeletionPolicy, CfnTag
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from gpu_autoscaler.domain.launch_templates import (
    TAG_ZONE,
    launch_template_data,
    placement_group_key,
    template_variants,
)
from gpu_autoscaler.models.labels import TAG_CLUSTER, TAG_NODE_POOL

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
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
            instance_profile_name=names.instance_profile(config.region),
            roles=[role_name(config.node_role)],
        )
        # A new name replaces the profile (InstanceProfileName: "Update requires: Replacement"), and CloudFormation
        # deletes the old one unless told to keep it (UpdateReplacePolicy); IAM DeleteInstanceProfile: "Deleting a
        # role or instance profile that is associated with a running instance will break any applications running
        # on the instance", so every node launched before would lose its credentials. The old one is left to delete
        # once they are gone (README, Deploy).
        self.instance_profile.cfn_options.update_replace_policy = CfnDeletionPolicy.RETAIN
        owner = [CfnTag(key=TAG_CLUSTER, value=config.cluster_name)]
        self.templates: dict[str, ec2.CfnLaunchTemplate] = {}
        for key, (capacity_type, efa) in template_variants(config).items():
            construct = "LaunchTemplate" if key == "on-demand" else \
                f"{''.join(p.title() for p in key.replace('/', '-').split('-'))}LaunchTemplate"
            template = ec2.CfnLaunchTemplate(
                self,
                construct,
                launch_template_name=names.capacity_launch_template(key.replace("/", "-")),
                version_description=f"{config.ami.family} {config.ami.version} {key}",
                launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(),
                tag_specifications=[
                    ec2.CfnLaunchTemplate.LaunchTemplateTagSpecificationProperty(
                        resource_type="launch-template", tags=owner
                    )
                ],
            )
            template.add_property_override("LaunchTemplateData", launch_template_data(
                config, capacity_type, security_groups=list(config.network.security_groups),
                instance_profile_arn=self.instance_profile.attr_arn, efa_interfaces=efa,
            ))
            self.templates[key] = template
        # EFA gangs launch into a cluster placement group of their pool in their zone (EC2 User Guide,
        # "Placement groups": a cluster group packs instances close together in one Availability Zone).
        self.placement_groups: dict[str, ec2.CfnPlacementGroup] = {}
        for pool in config.node_pools:
            if not pool.efa:
                continue
            for zone in config.zones:
                key = placement_group_key(pool.name, zone)
                self.placement_groups[key] = ec2.CfnPlacementGroup(
                    self, f"{''.join(p.title() for p in f'{pool.name}-{zone}'.split('-'))}PlacementGroup",
                    strategy="cluster",
                    tags=[*owner, CfnTag(key=TAG_NODE_POOL, value=pool.name), CfnTag(key=TAG_ZONE, value=zone)],
                )

    @property
    def launch_template_id(self) -> str:
        """The On-Demand template: the fleet function's `LAUNCH_TEMPLATE_ID`."""
        return self.templates["on-demand"].ref

    @property
    def launch_templates(self) -> dict[str, dict[str, str]]:
        """Template key (capacity type, `/efaN`) → `{"id", "version"}`: the fleet function's `LAUNCH_TEMPLATES`.

        The version is the template's `LatestVersionNumber`, not `$Default`: a change of `LaunchTemplateData` keeps the
        template (its name is fixed) and adds a version, while "The default version of a launch template cannot be
        specified in AWS CloudFormation" (CloudFormation Template Reference, AWS::EC2::LaunchTemplate,
        `DefaultVersionNumber`) — it stays at 1, and CreateFleet's `$Default` would launch the first deploy's image,
        groups and metadata options for ever. A number, not `$Latest`, so a replayed request (same ClientToken)
        stays the same request, and a new version updates the function's environment with it: warm functions
        launch the new version from the update on."""
        return {key: {"id": template.ref, "version": template.attr_latest_version_number}
                for key, template in self.templates.items()}

    @property
    def placement_group_names(self) -> dict[str, str]:
        """`pool/zone` → cluster placement group name: the fleet function's `PLACEMENT_GROUPS`."""
        return {key: group.ref for key, group in self.placement_groups.items()}

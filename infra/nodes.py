"""What the nodes launch with: the launch template (pinned AMI, IMDSv2 only, encrypted EBS) and an instance profile.

The node role itself comes from the configuration (`nodeRole`): the cluster must already trust it (EKS access
entry or aws-auth), which is the cluster owner's decision, so the stack only wraps it in an instance profile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CfnTag
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from gpu_autoscaler.models.labels import TAG_CLUSTER

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.naming import ResourceNames

__all__ = ["DATA_VOLUME_GIB", "LAUNCHED_RESOURCE_TYPES", "NodeLaunchTemplate", "role_name"]

DATA_VOLUME_GIB = 200
"""Room for CUDA and framework images, which run to tens of GB each."""

BOTTLEROCKET_OS_VOLUME_GIB = 4

LAUNCHED_RESOURCE_TYPES = ("instance", "volume", "network-interface", "spot-instances-request")
"""Everything a launch creates carries the ownership tag from the template itself, so the IAM condition
on `aws:RequestTag/gpu-autoscaler/cluster` holds even for resources the fleet request does not tag."""


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
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_name=names.launch_template,
            version_description=f"{config.ami.family} {config.ami.version}",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                # x86_64 by default; the fleet overrides ImageId with the arm64 AMI for Graviton types.
                image_id=config.ami.x86_64,
                iam_instance_profile=ec2.CfnLaunchTemplate.IamInstanceProfileProperty(
                    arn=self.instance_profile.attr_arn
                ),
                security_group_ids=list(config.network.security_groups),
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_endpoint="enabled",
                    http_tokens="required",
                    # One hop: the node reaches IMDS, pods on the pod network do not borrow its credentials.
                    http_put_response_hop_limit=1,
                ),
                block_device_mappings=_volumes(config.ami.family),
                monitoring=ec2.CfnLaunchTemplate.MonitoringProperty(enabled=True),
                tag_specifications=[
                    ec2.CfnLaunchTemplate.TagSpecificationProperty(resource_type=kind, tags=owner)
                    for kind in LAUNCHED_RESOURCE_TYPES
                ],
            ),
            tag_specifications=[
                ec2.CfnLaunchTemplate.LaunchTemplateTagSpecificationProperty(
                    resource_type="launch-template", tags=owner
                )
            ],
        )

    @property
    def launch_template_id(self) -> str:
        return self.launch_template.ref


def _volumes(family: str) -> list[ec2.CfnLaunchTemplate.BlockDeviceMappingProperty]:
    def volume(device: str, size: int) -> ec2.CfnLaunchTemplate.BlockDeviceMappingProperty:
        return ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
            device_name=device,
            ebs=ec2.CfnLaunchTemplate.EbsProperty(
                volume_size=size, volume_type="gp3", encrypted=True, delete_on_termination=True
            ),
        )

    if family == "Bottlerocket":
        # Bottlerocket keeps the OS on /dev/xvda and images and containers on /dev/xvdb.
        return [volume("/dev/xvda", BOTTLEROCKET_OS_VOLUME_GIB), volume("/dev/xvdb", DATA_VOLUME_GIB)]
    return [volume("/dev/xvda", DATA_VOLUME_GIB)]

"""The node launch template and instance profile."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.models.labels import TAG_CLUSTER
from gpu_autoscaler.naming import ResourceNames
from infra.nodes import _volumes, role_name
from tests.infrastructure.conftest import infrastructure_config_data

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized


def test_launch_template_pins_the_ami_requires_imdsv2_and_encrypts_volumes(synthesized: Synthesized) -> None:
    config = synthesized.config
    [template] = synthesized.of_type("AWS::EC2::LaunchTemplate").values()
    assert template["Properties"]["LaunchTemplateName"] == ResourceNames(config.cluster_name).launch_template
    data = template["Properties"]["LaunchTemplateData"]
    assert data["ImageId"] == config.ami.x86_64
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert data["SecurityGroupIds"] == config.network.security_groups
    assert data["BlockDeviceMappings"] and all(m["Ebs"]["Encrypted"] is True for m in data["BlockDeviceMappings"])
    profile_id = synthesized.logical_id(synthesized.stack.nodes.instance_profile)
    assert data["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": [profile_id, "Arn"]}}


def test_launched_resources_and_the_template_carry_the_ownership_tag(synthesized: Synthesized) -> None:
    [template] = synthesized.of_type("AWS::EC2::LaunchTemplate").values()
    owner = [{"Key": TAG_CLUSTER, "Value": synthesized.config.cluster_name}]
    specs = template["Properties"]["LaunchTemplateData"]["TagSpecifications"]
    assert {s["ResourceType"] for s in specs} == {"instance", "volume", "network-interface", "spot-instances-request"}
    assert all(s["Tags"] == owner for s in specs)
    assert template["Properties"]["TagSpecifications"] == [{"ResourceType": "launch-template", "Tags": owner}]


def test_instance_profile_wraps_the_configured_node_role(synthesized: Synthesized) -> None:
    [profile] = synthesized.of_type("AWS::IAM::InstanceProfile").values()
    assert profile["Properties"]["Roles"] == ["ml-prod-gpu-node"]
    assert (
        profile["Properties"]["InstanceProfileName"] == ResourceNames(synthesized.config.cluster_name).instance_profile
    )
    assert role_name("arn:aws:iam::123456789012:role/teams/ml/gpu-node") == "gpu-node"


def test_bottlerocket_gets_an_os_and_a_data_volume() -> None:
    data = infrastructure_config_data()
    data["ami"]["family"] = "Bottlerocket"
    volumes = _volumes(parse_config(data).ami.family)
    assert [(v.device_name, v.ebs.volume_size, v.ebs.encrypted) for v in volumes] == [  # type: ignore[union-attr]
        ("/dev/xvda", 4, True),
        ("/dev/xvdb", 200, True),
    ]

"""The node launch template and instance profile."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.domain.launch_templates import block_device_mappings
from gpu_autoscaler.models.labels import TAG_CLUSTER, cluster_tags
from gpu_autoscaler.naming import ResourceNames
from infra.nodes import role_name
from tests.infrastructure.conftest import infrastructure_config_data

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized


def _templates(synthesized: Synthesized) -> dict[str, dict[str, Any]]:
    """Launch template name → its properties."""
    return {t["Properties"]["LaunchTemplateName"]: t["Properties"]
            for t in synthesized.of_type("AWS::EC2::LaunchTemplate").values()}


def test_launch_templates_pin_the_ami_require_imdsv2_and_encrypt_volumes(synthesized: Synthesized) -> None:
    config = synthesized.config
    names = ResourceNames(config.cluster_name)
    templates = _templates(synthesized)
    assert set(templates) == {names.capacity_launch_template(ct) for ct in ("spot", "on-demand", "reserved")}
    profile_id = synthesized.logical_id(synthesized.stack.nodes.instance_profile)
    for properties in templates.values():
        data = properties["LaunchTemplateData"]
        assert data["ImageId"] == config.ami.x86_64
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
        # Our tag keys hold a `/`: an account default of tags in instance metadata would fail every launch.
        assert data["MetadataOptions"]["InstanceMetadataTags"] == "disabled"
        assert data["SecurityGroupIds"] == config.network.security_groups
        assert data["BlockDeviceMappings"] and all(m["Ebs"]["Encrypted"] is True for m in data["BlockDeviceMappings"])
        assert data["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": [profile_id, "Arn"]}}


def test_only_the_spot_template_tags_spot_requests(synthesized: Synthesized) -> None:
    """Issue 14 defect 1: EC2 refuses `spot-instances-request` tags on a launch that creates no Spot request."""
    names = ResourceNames(synthesized.config.cluster_name)
    templates = _templates(synthesized)
    owner = [{"Key": TAG_CLUSTER, "Value": synthesized.config.cluster_name}]
    launched = [{"Key": k, "Value": v} for k, v in cluster_tags(synthesized.config.cluster_name).items()]
    common = {"instance", "volume", "network-interface"}
    for capacity_type, kinds in (("spot", common | {"spot-instances-request"}), ("on-demand", common),
                                 ("reserved", common)):
        properties = templates[names.capacity_launch_template(capacity_type)]
        specs = properties["LaunchTemplateData"]["TagSpecifications"]
        assert {s["ResourceType"] for s in specs} == kinds, capacity_type
        assert all(s["Tags"] == launched for s in specs)
        assert properties["TagSpecifications"] == [{"ResourceType": "launch-template", "Tags": owner}]


def test_spot_and_on_demand_launches_stay_out_of_open_reservations(synthesized: Synthesized) -> None:
    """Issue 14 defect 2: without a preference, On-Demand launches consume open reservations (the reserved pool's)."""
    names = ResourceNames(synthesized.config.cluster_name)
    templates = _templates(synthesized)
    for capacity_type in ("spot", "on-demand"):
        data = templates[names.capacity_launch_template(capacity_type)]["LaunchTemplateData"]
        assert data["CapacityReservationSpecification"] == {"CapacityReservationPreference": "none"}
    reserved = templates[names.capacity_launch_template("reserved")]["LaunchTemplateData"]
    assert "CapacityReservationSpecification" not in reserved  # each reserved CreateFleet names its reservations


def test_instance_profile_wraps_the_configured_node_role(synthesized: Synthesized) -> None:
    [profile] = synthesized.of_type("AWS::IAM::InstanceProfile").values()
    assert profile["Properties"]["Roles"] == ["ml-prod-gpu-node"]
    config = synthesized.config
    assert profile["Properties"]["InstanceProfileName"] == ResourceNames(config.cluster_name).instance_profile(
        config.region)
    assert role_name("arn:aws:iam::123456789012:role/teams/ml/gpu-node") == "gpu-node"


def test_a_replaced_instance_profile_is_kept_for_the_nodes_running_on_it(synthesized: Synthesized) -> None:
    """A new name replaces the profile (InstanceProfileName: "Update requires: Replacement"), and CloudFormation
    then deletes the old one unless UpdateReplacePolicy says Retain. IAM DeleteInstanceProfile: "Deleting a role or
    instance profile that is associated with a running instance will break any applications running on the
    instance": every node launched before the update would lose its credentials (kubelet, image pulls)."""
    [profile] = synthesized.of_type("AWS::IAM::InstanceProfile").values()
    assert profile["UpdateReplacePolicy"] == "Retain"


def test_bottlerocket_gets_an_os_and_a_data_volume() -> None:
    data = infrastructure_config_data()
    data["ami"]["family"] = "Bottlerocket"
    volumes = block_device_mappings(parse_config(data).ami, 200)
    assert [(v.device_name, v.ebs.size_gib, v.ebs.encrypted) for v in volumes] == [
        ("/dev/xvda", 4, True),
        ("/dev/xvdb", 200, True),
    ]


def test_an_efa_pool_gets_efa_templates_and_a_cluster_placement_group_per_zone() -> None:
    """Issue 14 defect 6: EFA at launch needs network interfaces in the template, one EFA per network card."""
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

    from infra.nodes import NodeLaunchTemplate

    data = infrastructure_config_data()
    next(p for p in data["nodePools"] if p["name"] == "gpu-reserved")["efa"] = True
    config = parse_config(data)
    stack = cdk.Stack(cdk.App(), "Nodes", env=cdk.Environment(account="123456789012", region="us-east-1"))
    nodes = NodeLaunchTemplate(stack, "Nodes", config=config, names=ResourceNames(config.cluster_name))
    resources = Template.from_stack(stack).to_json()["Resources"]
    templates = {r["Properties"]["LaunchTemplateName"]: r["Properties"]["LaunchTemplateData"]
                 for r in resources.values() if r["Type"] == "AWS::EC2::LaunchTemplate"}
    prefix = ResourceNames(config.cluster_name).launch_template
    efa4 = templates[f"{prefix}-on-demand-efa4"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in efa4["NetworkInterfaces"]] == [
        (0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")]
    assert all(i["Groups"] == config.network.security_groups for i in efa4["NetworkInterfaces"])
    assert "SecurityGroupIds" not in efa4
    assert f"{prefix}-reserved-efa32" in templates and f"{prefix}-spot-efa32" not in templates  # not a Spot pool
    groups = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::EC2::PlacementGroup"]
    assert len(groups) == len(config.zones) and all(g["Strategy"] == "cluster" for g in groups)
    assert set(nodes.placement_group_names) == {f"gpu-reserved/{zone}" for zone in config.zones}

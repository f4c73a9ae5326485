"""The strict layer refuses the launches EC2 refuses, with EC2's code (and message where EC2 documents it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from gpu_autoscaler.emulator.strict import strict_layer_disabled

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws

SPOT_TAGS_MESSAGE = ("You cannot specify tags for Spot instances requests if there are no Spot instances requests "
                     "being created by the request")


def fleet(aws: EmbeddedAws, capacity_type: str, *, template: str | None = None, target: int = 1,
          overrides: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    templates = aws.resources.launch_templates
    return {
        "Type": "instant",
        "LaunchTemplateConfigs": [{
            "LaunchTemplateSpecification": {"LaunchTemplateId": templates[template or capacity_type],
                                            "Version": "$Default"},
            "Overrides": overrides or [{"InstanceType": "g6.xlarge", "SubnetId": aws.zone_subnets["us-east-1a"]}],
        }],
        "TargetCapacitySpecification": {"TotalTargetCapacity": target, "DefaultTargetCapacityType": capacity_type},
        **extra,
    }


def refused(call: Any, **params: Any) -> tuple[str, str]:
    with pytest.raises(ClientError) as caught:
        call(**params)
    error = caught.value.response["Error"]
    return error["Code"], error["Message"]


def test_spot_request_tags_on_an_on_demand_launch_are_refused(aws: EmbeddedAws, ec2: Any) -> None:
    # The Spot template tags spot-instances-request; an On-Demand fleet from it creates no Spot request.
    code, message = refused(ec2.create_fleet, **fleet(aws, "on-demand", template="spot"))
    assert (code, message) == ("InvalidParameterValue", SPOT_TAGS_MESSAGE)
    # ... and in the request itself, on RunInstances.
    code, message = refused(
        ec2.run_instances, ImageId=aws.config.ami.x86_64, InstanceType="g6.xlarge", MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "spot-instances-request", "Tags": [{"Key": "a", "Value": "b"}]}])
    assert (code, message) == ("InvalidParameterValue", SPOT_TAGS_MESSAGE)


def test_each_capacity_type_launches_from_its_own_template(aws: EmbeddedAws, ec2: Any) -> None:
    for capacity_type in ("spot", "on-demand"):
        response = ec2.create_fleet(**fleet(aws, capacity_type))
        assert not response.get("Errors") and len(response["Instances"][0]["InstanceIds"]) == 1


def test_moto_alone_accepts_what_the_layer_refuses(aws: EmbeddedAws, ec2: Any) -> None:
    """The layer is what refuses: without it moto launches the request EC2 would refuse."""
    with strict_layer_disabled():
        response = ec2.create_fleet(**fleet(aws, "on-demand", template="spot"))
    assert response["Instances"]


@pytest.mark.parametrize(("options", "target", "code"), [
    ({"MinTargetCapacity": 2}, 2, "InvalidParameterCombination"),  # neither single type nor single zone
    ({"MinTargetCapacity": 3, "SingleAvailabilityZone": True}, 2, "InvalidParameterValue"),  # above the total
])
def test_min_target_capacity_rules(aws: EmbeddedAws, ec2: Any, options: dict[str, Any], target: int,
                                   code: str) -> None:
    params = fleet(aws, "on-demand", target=target, OnDemandOptions={"AllocationStrategy": "lowest-price", **options})
    assert refused(ec2.create_fleet, **params)[0] == code


def test_min_target_capacity_only_on_instant_fleets(aws: EmbeddedAws, ec2: Any) -> None:
    params = fleet(aws, "on-demand", target=2, Type="request",
                   OnDemandOptions={"MinTargetCapacity": 2, "SingleInstanceType": True})
    assert refused(ec2.create_fleet, **params)[0] == "InvalidParameterCombination"


def test_reserved_capacity_needs_its_options(aws: EmbeddedAws, ec2: Any) -> None:
    assert refused(ec2.create_fleet, **fleet(aws, "reserved-capacity", template="reserved"))[0] == \
        "InvalidParameterCombination"


def _efa_template(aws: EmbeddedAws, ec2: Any, name: str, interfaces: list[dict[str, Any]]) -> str:
    with strict_layer_disabled():
        return str(ec2.create_launch_template(
            LaunchTemplateName=name,
            LaunchTemplateData={"ImageId": aws.config.ami.x86_64, "NetworkInterfaces": interfaces},
        )["LaunchTemplate"]["LaunchTemplateId"])


def _efa(card: int, device: int | None = None) -> dict[str, Any]:
    return {"NetworkCardIndex": card, "DeviceIndex": (0 if card == 0 else 1) if device is None else device,
            "InterfaceType": "efa", "Groups": ["sg-1"]}


def _efa_fleet(aws: EmbeddedAws, template: str, instance_type: str) -> dict[str, Any]:
    params = fleet(aws, "on-demand", overrides=[{"InstanceType": instance_type,
                                                 "SubnetId": aws.zone_subnets["us-east-1a"]}])
    params["LaunchTemplateConfigs"][0]["LaunchTemplateSpecification"] = {"LaunchTemplateId": template,
                                                                         "Version": "$Default"}
    return params


def test_efa_interfaces_follow_the_network_cards(aws: EmbeddedAws, ec2: Any) -> None:
    four = _efa_template(aws, ec2, "efa-four", [_efa(card) for card in range(4)])
    ok = ec2.create_fleet(**_efa_fleet(aws, four, "p4d.24xlarge"))  # 4 network cards, 4 EFAs
    assert ok["Instances"]
    code, message = refused(ec2.create_fleet, **_efa_fleet(aws, four, "g6.xlarge"))
    assert code == "InvalidParameterCombination" and "g6.xlarge" in message  # no EFA at all
    code, _ = refused(ec2.create_fleet, **_efa_fleet(aws, four, "g5.48xlarge"))  # one network card only
    assert code == "InvalidParameterValue"
    twice = _efa_template(aws, ec2, "efa-twice", [_efa(0), _efa(0, device=1)])
    assert "one EFA" in refused(ec2.create_fleet, **_efa_fleet(aws, twice, "p4d.24xlarge"))[1]
    primary_elsewhere = _efa_template(aws, ec2, "efa-primary", [_efa(1, device=0)])
    assert "device index 0" in refused(ec2.create_fleet, **_efa_fleet(aws, primary_elsewhere, "p4d.24xlarge"))[1]


def test_network_interfaces_and_instance_security_groups_do_not_mix(aws: EmbeddedAws, ec2: Any) -> None:
    with strict_layer_disabled():
        template = ec2.create_launch_template(LaunchTemplateName="efa-and-groups", LaunchTemplateData={
            "ImageId": aws.config.ami.x86_64, "NetworkInterfaces": [_efa(0)],
            "SecurityGroupIds": list(aws.security_group_ids.values())})["LaunchTemplate"]["LaunchTemplateId"]
    code, message = refused(ec2.create_fleet, **_efa_fleet(aws, template, "p4d.24xlarge"))
    assert code == "InvalidParameterCombination" and "security groups" in message


def test_a_launch_gets_the_security_groups_of_its_template(aws: EmbeddedAws, ec2: Any) -> None:
    """moto puts every fleet instance in its VPC's default group; EC2 gives it the template's `SecurityGroupIds`,
    or, where the template names network interfaces, the groups of its primary interface."""
    groups = sorted(aws.security_group_ids.values())
    [plain] = ec2.create_fleet(**fleet(aws, "on-demand"))["Instances"][0]["InstanceIds"]
    with strict_layer_disabled():
        efa = ec2.create_launch_template(LaunchTemplateName="efa-in-groups", LaunchTemplateData={
            "ImageId": aws.config.ami.x86_64,
            "NetworkInterfaces": [{**_efa(card), "Groups": groups} for card in range(4)],
        })["LaunchTemplate"]["LaunchTemplateId"]
    [interfaces] = ec2.create_fleet(**_efa_fleet(aws, efa, "p4d.24xlarge"))["Instances"][0]["InstanceIds"]
    described = ec2.describe_instances(InstanceIds=[plain, interfaces])["Reservations"]
    for instance in (i for r in described for i in r["Instances"]):
        assert sorted(g["GroupId"] for g in instance["SecurityGroups"]) == groups, instance["InstanceId"]


def _with_volume(aws: EmbeddedAws, ebs: dict[str, Any]) -> dict[str, Any]:
    return fleet(aws, "on-demand", overrides=[{"InstanceType": "g6.xlarge", "SubnetId": aws.zone_subnets["us-east-1a"],
                                               "BlockDeviceMappings": [{"DeviceName": "/dev/xvdb", "Ebs": ebs}]}])


def test_block_device_mappings_are_checked_against_ec2s_limits(aws: EmbeddedAws, ec2: Any) -> None:
    assert refused(ec2.create_fleet, **_with_volume(aws, {"VolumeSize": 20000, "VolumeType": "gp3"}))[0] == \
        "InvalidParameterValue"
    assert refused(ec2.create_fleet, **_with_volume(aws, {"VolumeSize": 100, "VolumeType": "gp2", "Iops": 3000})) == \
        ("InvalidParameterCombination", "The parameter iops is not supported for gp2 volumes.")
    assert refused(ec2.create_fleet, **_with_volume(aws, {"SnapshotId": "snap-0123456789abcdef0"})) == \
        ("InvalidSnapshot.NotFound", "The snapshot 'snap-0123456789abcdef0' does not exist.")


def test_a_snapshot_volume_is_at_least_the_snapshots_size(aws: EmbeddedAws, ec2: Any) -> None:
    volume = ec2.create_volume(AvailabilityZone="us-east-1a", Size=50)["VolumeId"]
    snapshot = ec2.create_snapshot(VolumeId=volume)["SnapshotId"]
    code, message = refused(ec2.create_fleet, **_with_volume(aws, {"SnapshotId": snapshot, "VolumeSize": 20}))
    assert code == "InvalidBlockDeviceMapping" and "expect size >= 50GB" in message
    response = ec2.create_fleet(**_with_volume(aws, {"SnapshotId": snapshot, "VolumeSize": 60, "VolumeType": "gp3"}))
    assert response["Instances"]


def test_a_launch_gets_the_volumes_its_mappings_ask_for(aws: EmbeddedAws, ec2: Any) -> None:
    """moto gives every instance an 8 GiB root; EC2 gives what the override (or the template) maps."""
    volume = ec2.create_volume(AvailabilityZone="us-east-1a", Size=30)["VolumeId"]
    snapshot = ec2.create_snapshot(VolumeId=volume)["SnapshotId"]
    params = fleet(aws, "on-demand", overrides=[{
        "InstanceType": "g6.xlarge", "SubnetId": aws.zone_subnets["us-east-1a"],
        "BlockDeviceMappings": [
            {"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 500, "VolumeType": "gp3", "Encrypted": True}},
            {"DeviceName": "/dev/xvdb", "Ebs": {"SnapshotId": snapshot, "VolumeType": "gp3"}}]}])
    [instance_id] = ec2.create_fleet(**params)["Instances"][0]["InstanceIds"]
    [reservation] = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    attached = {m["DeviceName"]: m["Ebs"]["VolumeId"] for m in reservation["Instances"][0]["BlockDeviceMappings"]}
    assert set(attached) == {"/dev/xvda", "/dev/xvdb"}
    volumes = {v["VolumeId"]: v for v in ec2.describe_volumes(VolumeIds=list(attached.values()))["Volumes"]}
    assert volumes[attached["/dev/xvda"]]["Size"] == 500
    assert volumes[attached["/dev/xvdb"]]["SnapshotId"] == snapshot and volumes[attached["/dev/xvdb"]]["Size"] == 30
    # The template's own mapping when the override has none (the On-Demand template: 200 GiB root).
    [plain] = ec2.create_fleet(**fleet(aws, "on-demand"))["Instances"][0]["InstanceIds"]
    [reservation] = ec2.describe_instances(InstanceIds=[plain])["Reservations"]
    [root] = reservation["Instances"][0]["BlockDeviceMappings"]
    assert root["DeviceName"] == "/dev/xvda"
    assert ec2.describe_volumes(VolumeIds=[root["Ebs"]["VolumeId"]])["Volumes"][0]["Size"] == 200

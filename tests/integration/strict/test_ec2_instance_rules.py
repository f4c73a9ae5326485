"""The strict layer's EC2 instance rules: the stack's ownership condition, eventual consistency, the Spot role."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from gpu_autoscaler.emulator.strict import ec2_instances
from gpu_autoscaler.emulator.strict.ec2_instances import SPOT_ROLE, SPOT_ROLE_MESSAGE
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.emulator.aws import EmbeddedAws


def run(aws: EmbeddedAws, ec2: Any, owner: str | None) -> str:
    tags = [{"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": owner}]}] if owner else []
    return str(ec2.run_instances(ImageId=aws.config.ami.x86_64, InstanceType="g6.xlarge", MinCount=1, MaxCount=1,
                                 SubnetId=aws.zone_subnets["us-east-1a"], TagSpecifications=tags,
                                 )["Instances"][0]["InstanceId"])


def code_of(call: Any, **params: Any) -> str:
    with pytest.raises(ClientError) as caught:
        call(**params)
    return str(caught.value.response["Error"]["Code"])


@pytest.fixture
def account(aws: EmbeddedAws) -> str:
    return str(aws.clients.client("sts").get_caller_identity()["Account"])


@pytest.fixture
def lag() -> Iterator[None]:
    ec2_instances.set_visibility_lag(1.5)
    yield
    ec2_instances.set_visibility_lag(0)


def test_only_the_clusters_own_instances_may_be_terminated(aws: EmbeddedAws, ec2: Any) -> None:
    ours, other, untagged = run(aws, ec2, aws.config.cluster_name), run(aws, ec2, "ml-dev"), run(aws, ec2, None)
    assert code_of(ec2.terminate_instances, InstanceIds=[other]) == "UnauthorizedOperation"
    assert code_of(ec2.terminate_instances, InstanceIds=[ours, untagged]) == "UnauthorizedOperation"  # as a whole
    assert [i["InstanceId"] for i in ec2.terminate_instances(InstanceIds=[ours])["TerminatingInstances"]] == [ours]


def test_a_just_launched_instance_is_not_shown_nor_known_for_a_while(aws: EmbeddedAws, ec2: Any, lag: None) -> None:
    instance = run(aws, ec2, aws.config.cluster_name)
    shown = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [aws.config.cluster_name]}])
    assert instance not in {i["InstanceId"] for r in shown["Reservations"] for i in r["Instances"]}
    assert code_of(ec2.describe_instances, InstanceIds=[instance]) == "InvalidInstanceID.NotFound"
    assert code_of(ec2.terminate_instances, InstanceIds=[instance]) == "InvalidInstanceID.NotFound"
    assert code_of(ec2.create_tags, Resources=[instance], Tags=[{"Key": "Name", "Value": "x"}]) == \
        "InvalidInstanceID.NotFound"
    time.sleep(1.6)
    ec2.create_tags(Resources=[instance], Tags=[{"Key": "Name", "Value": "x"}])
    assert ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["InstanceId"] == instance


def test_the_fleet_adapter_terminates_an_instance_ec2_does_not_know_yet(aws: EmbeddedAws, ec2: Any,
                                                                        lag: None) -> None:
    from gpu_autoscaler.adapters.aws.fleet import Ec2Compute

    instance = run(aws, ec2, aws.config.cluster_name)
    assert Ec2Compute(ec2, aws.config.cluster_name).terminate([instance]) == [instance]


def test_the_fleet_adapter_tags_claims_on_instances_ec2_does_not_know_yet(aws: EmbeddedAws, ec2: Any,
                                                                           lag: None) -> None:
    """A request for several claims tags each instance with its claim right after CreateFleet, when EC2 may not
    know the instances yet: asked again with backoff, not failed (the launch itself worked)."""
    from gpu_autoscaler.adapters.aws.fleet import Ec2Compute
    from gpu_autoscaler.domain.fleet import TAG_LAUNCH
    from gpu_autoscaler.models.fleet import FleetOverride, FleetRequest, LaunchConfig

    cluster = aws.config.cluster_name
    token = "gpu-autoscaler-tags-after-launch-0"
    request = FleetRequest(
        cluster=cluster, pool="gpu-burst", claim_ids=("tag-a", "tag-b"), capacity_type="on-demand",
        allocation_strategy="lowest-price", target_capacity=2, client_token=token,
        launch_template_id=aws.resources.launch_templates["on-demand"],
        launch_configs=(LaunchConfig(overrides=(FleetOverride(
            instance_type="g6.xlarge", zone="us-east-1a", subnet_id=aws.zone_subnets["us-east-1a"]),)),),
        tags={TAG_CLUSTER: cluster, TAG_LAUNCH: token},
    )
    result = Ec2Compute(ec2, cluster).create_fleet(request)
    assert not result.errors and len(result.instances) == 2
    for instance in result.instances:
        [found] = ec2.describe_instances(InstanceIds=[instance.instance_id])["Reservations"][0]["Instances"]
        tags = {t["Key"]: t["Value"] for t in found["Tags"]}
        assert tags[TAG_CLAIM] == instance.claim_id and tags["Name"] == f"{cluster}/{instance.claim_id}"


def test_spot_without_the_role_and_without_permission_to_create_it(aws: EmbeddedAws, ec2: Any, account: str) -> None:
    iam = aws.clients.client("iam")
    # A fresh account: the emulator's account is set up with the role (as `doctor` wants it); remove it.
    with contextlib.suppress(iam.exceptions.NoSuchEntityException):
        iam.delete_role(RoleName=SPOT_ROLE)
    ec2_instances.set_spot_role_creation(account, permitted=False)
    try:
        spot = {"ImageId": aws.config.ami.x86_64, "InstanceType": "g6.xlarge", "MinCount": 1, "MaxCount": 1,
                "InstanceMarketOptions": {"MarketType": "spot"}}
        with pytest.raises(ClientError) as caught:
            ec2.run_instances(**spot)
        assert caught.value.response["Error"] == {"Code": "AuthFailure.ServiceLinkedRoleCreationNotPermitted",
                                                  "Message": SPOT_ROLE_MESSAGE}
        answer = ec2.create_fleet(
            Type="instant", TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "spot"},
            LaunchTemplateConfigs=[{"LaunchTemplateSpecification": {
                "LaunchTemplateId": aws.resources.launch_templates["spot"], "Version": "$Default"},
                "Overrides": [{"InstanceType": "g6.xlarge", "SubnetId": aws.zone_subnets["us-east-1a"]}]}])
        assert not answer.get("Instances")
        assert [e["ErrorCode"] for e in answer["Errors"]] == ["AuthFailure.ServiceLinkedRoleCreationNotPermitted"]
    finally:
        ec2_instances.set_spot_role_creation(account, permitted=True)
    ec2.run_instances(**spot)  # permitted: EC2 creates the role on the first Spot launch
    assert iam.get_role(RoleName=SPOT_ROLE)["Role"]["Path"] == "/aws-service-role/spot.amazonaws.com/"

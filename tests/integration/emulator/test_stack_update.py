"""A `cdk deploy` that changes the launch template data reaches the next launch.

CloudFormation updates an `AWS::EC2::LaunchTemplate` by adding a version and leaves the default version where it was
(CloudFormation Template Reference, AWS::EC2::LaunchTemplate, `DefaultVersionNumber`): a launch that asked `$Default`
kept booting the first deploy's image while the claim recorded the new one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.config import parse_config
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.services.fleet import aws_fleet_service
from gpu_autoscaler.settings import load_settings
from tests.conftest import example_config_data
from tests.integration.fleet.helpers import new_claim

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws

NEW_AMI = "ami-0aaaabbbbccccdddd"


def test_after_a_stack_update_bumps_the_ami_the_fleet_launches_the_new_one(aws: EmbeddedAws) -> None:
    data = example_config_data()
    data["ami"] = {**data["ami"], "version": "v20261201", "x86_64": NEW_AMI}
    config = parse_config(data)
    resources = aws.update(config)
    ec2 = aws.clients.client("ec2")
    [template] = ec2.describe_launch_templates(LaunchTemplateIds=[resources.launch_templates["on-demand"]])[
        "LaunchTemplates"]
    assert (template["DefaultVersionNumber"], template["LatestVersionNumber"]) == (1, 2)  # as CloudFormation leaves it
    store = DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, config.cluster_name, clock=SystemClock())
    new_claim(store, "gpu-burst-ami1", capacity_type="on-demand", instance_types=("g6.xlarge",),
              zones=("us-east-1a",))
    service = aws_fleet_service(load_settings(aws.function_environment("fleet")))
    service.launch(LaunchRequest(cluster=config.cluster_name, claim_ids=["gpu-burst-ami1"]))
    claim = store.get_claim("gpu-burst-ami1")
    assert claim is not None and claim.state is ClaimState.LAUNCHED, claim
    [reservation] = ec2.describe_instances(InstanceIds=[claim.instance_id])["Reservations"]
    assert reservation["Instances"][0]["ImageId"] == NEW_AMI


def test_a_stack_update_that_changes_nothing_adds_no_version(aws: EmbeddedAws) -> None:
    before = {t["LaunchTemplateId"]: t["LatestVersionNumber"]
              for t in aws.clients.client("ec2").describe_launch_templates()["LaunchTemplates"]}
    aws.update(aws.config)
    after = {t["LaunchTemplateId"]: t["LatestVersionNumber"]
             for t in aws.clients.client("ec2").describe_launch_templates()["LaunchTemplates"]}
    assert after == before

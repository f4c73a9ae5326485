"""The deletion hook's handlers over boto3 (moto): the stack's status read by its id, this cluster's instances
terminated through EC2 by the tag filter, another cluster's left running."""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from moto import mock_aws

from gpu_autoscaler.adapters.aws.stack_status import CloudFormationStackStatus
from gpu_autoscaler.models.labels import TAG_CLUSTER
from tests.conftest import ROOT

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

REGION = "us-east-1"
TEMPLATE = '{"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}'


@pytest.fixture
def handler() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("teardown_handler_under_test",
                                                  ROOT / "functions" / "teardown" / "handler.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("teardown_handler_under_test", None)


def launch(ec2: Any, cluster: str, count: int) -> list[str]:
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    answer = ec2.run_instances(ImageId=image, MinCount=count, MaxCount=count, InstanceType="g6.xlarge",
                               TagSpecifications=[{"ResourceType": "instance",
                                                   "Tags": [{"Key": TAG_CLUSTER, "Value": cluster}]}])
    return [i["InstanceId"] for i in answer["Instances"]]


def states(ec2: Any, ids: list[str]) -> set[str]:
    reservations = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    return {i["State"]["Name"] for r in reservations for i in r["Instances"]}


@mock_aws
def test_the_stack_status_is_read_by_the_stack_s_id() -> None:
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    stack_id = cloudformation.create_stack(StackName="s", TemplateBody=TEMPLATE)["StackId"]
    assert CloudFormationStackStatus(cloudformation).status(stack_id) == "CREATE_COMPLETE"


@mock_aws
def test_stack_deletion_terminates_this_cluster_s_instances_only(
        handler: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    ours, theirs = launch(ec2, "ml-prod", 3), launch(ec2, "ml-dev", 1)
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    stack_id = cloudformation.create_stack(StackName="s", TemplateBody=TEMPLATE)["StackId"]
    event = {"RequestType": "Delete", "StackId": stack_id, "PhysicalResourceId": "ml-prod-gpu-autoscaler-teardown",
             "ResourceProperties": {"ClusterName": "ml-prod"}}
    context = type("Context", (), {"function_name": "f", "memory_limit_in_mb": 256, "aws_request_id": "r",
                                   "invoked_function_arn": "arn:aws:lambda:us-east-1:1:function:f"})()

    assert handler.is_complete(event, context) == {"IsComplete": True}  # CREATE_COMPLETE: a stack that stays
    assert states(ec2, ours) == {"running"}

    monkeypatch.setattr(CloudFormationStackStatus, "status", lambda self, stack: "DELETE_IN_PROGRESS")
    assert handler.on_event(event, context) == {"PhysicalResourceId": "ml-prod-gpu-autoscaler-teardown"}
    assert states(ec2, ours) == {"terminated"} and states(ec2, theirs) == {"running"}
    assert handler.is_complete(event, context) == {"IsComplete": True}

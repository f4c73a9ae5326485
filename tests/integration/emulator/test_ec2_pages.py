"""DescribeInstances' pages while the instances change: a `NextToken` still leads to the next page when the
instance that ended the last page no longer matches the filters (terminated between the two calls), as EC2's
opaque tokens do ("Pagination in the Amazon EC2 API": call again with the token until there is none). moto's
token is the last reservation's id, looked up among the reservations that match now: one that no longer does
failed the call with HTTP 500 (the chaos soak's listing of running instances, 100 to a page, met it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from gpu_autoscaler.models.labels import TAG_CLUSTER

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws

PAGE = 5


def _launch(aws: EmbeddedAws, ec2: Any, count: int) -> list[str]:
    """One reservation each (a page counts reservations)."""
    tags = [{"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": aws.config.cluster_name},
                                                  {"Key": "test", "Value": "pages"}]}]
    return [ec2.run_instances(ImageId=aws.config.ami.x86_64, InstanceType="g6.xlarge", MinCount=1, MaxCount=1,
                              SubnetId=aws.zone_subnets["us-east-1a"], TagSpecifications=tags,
                              )["Instances"][0]["InstanceId"] for _ in range(count)]


def _ids(page: dict[str, Any]) -> list[str]:
    return [i["InstanceId"] for r in page["Reservations"] for i in r["Instances"]]


def test_the_next_page_comes_when_the_last_instance_shown_changed_state(aws: EmbeddedAws) -> None:
    ec2 = aws.clients.client("ec2")
    launched = _launch(aws, ec2, PAGE + 2)
    running = [{"Name": "tag:test", "Values": ["pages"]}, {"Name": "instance-state-name", "Values": ["running"]}]
    first = ec2.describe_instances(Filters=running, MaxResults=PAGE)
    assert _ids(first) == launched[:PAGE] and first["NextToken"]
    ec2.terminate_instances(InstanceIds=[launched[PAGE - 1]])  # the last one shown is running no longer

    second = ec2.describe_instances(Filters=running, MaxResults=PAGE, NextToken=first["NextToken"])

    assert _ids(second) == launched[PAGE:]
    assert not second.get("NextToken")
    ec2.terminate_instances(InstanceIds=launched)


def test_a_token_that_names_nothing_is_refused(aws: EmbeddedAws) -> None:
    with pytest.raises(ClientError) as caught:
        aws.clients.client("ec2").describe_instances(MaxResults=PAGE, NextToken="r-0000000000000000")
    assert caught.value.response["Error"]["Code"] == "InvalidNextToken"

"""EC2 while other callers change it: the fleet launching, the drain terminating, the instance watcher and the
garbage collector listing, all at once in the emulator.

- Pages: DescribeInstances' `NextToken` still leads to the next page when the instance that ended the last page
  no longer matches the filters (terminated between the two calls), as EC2's opaque tokens do ("Pagination in
  the Amazon EC2 API": call again with the token until there is none). moto's token is the last reservation's
  id, looked up among the reservations that match now: one that no longer did failed the call with HTTP 500 —
  the 500 the chaos soak met (its listing of running instances, 100 to a page, while nodes were drained).
- Concurrent requests: EC2 answers as if one at a time (an instance a CreateFleet launched is in the next
  DescribeInstances, whole); moto's EC2 backend has no locks (DescribeInstances renders each instance's tags by
  walking every tagged resource, the strict layer's rules walk the reservations) while CreateFleet, CreateTags
  and TerminateInstances on other request threads change them, so the emulator hands moto's EC2 and the strict
  layer's EC2 rules one request at a time, as it does DynamoDB (`test_concurrent_writes`).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.emulator.aws import EmbeddedAws

LAUNCHERS = 3
FLEETS = 3
"""CreateFleet calls per launching thread, each for `PER_FLEET` instances."""
PER_FLEET = 4
PAGE = 5


class Race:
    """Threads calling EC2 side by side, every ClientError kept."""

    def __init__(self, aws: EmbeddedAws) -> None:
        self.aws = aws
        self.errors: list[str] = []
        self.launched: list[str] = []
        self.terminated: list[str] = []
        self.launching = threading.Event()

    def client(self) -> Any:
        return boto3.client("ec2", endpoint_url=self.aws.endpoint_url, region_name=self.aws.config.region,
                            aws_access_key_id="testing", aws_secret_access_key="testing",
                            config=BotoConfig(retries={"max_attempts": 1, "mode": "standard"}))

    def call(self, what: str, request: Callable[[], Any]) -> Any:
        try:
            return request()
        except ClientError as error:
            self.errors.append(f"{what}: {error}")
            return None

    def launcher(self, n: int) -> None:
        """The fleet function: CreateFleet for a claim's instances, then its claim tag on each (CreateTags)."""
        ec2 = self.client()
        for i in range(FLEETS):
            response = self.call("CreateFleet", lambda: ec2.create_fleet(
                Type="instant",
                LaunchTemplateConfigs=[{
                    "LaunchTemplateSpecification": {"LaunchTemplateId": self.aws.launch_template_id,
                                                    "Version": "$Latest"},
                    "Overrides": [{"InstanceType": "g6.xlarge", "SubnetId": self.aws.zone_subnets["us-east-1a"]}],
                }],
                TargetCapacitySpecification={"TotalTargetCapacity": PER_FLEET,
                                             "DefaultTargetCapacityType": "on-demand"},
                TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": "ml-prod"}]}],
            ))
            ids = [i for fleet in (response or {}).get("Instances", []) for i in fleet["InstanceIds"]]
            for instance_id in ids:
                tags = [{"Key": TAG_CLAIM, "Value": f"race-{n}-{i}"}]
                self.call("CreateTags", functools.partial(ec2.create_tags, Resources=[instance_id], Tags=tags))
            self.launched.extend(ids)

    def describer(self) -> None:
        """The instance watcher and the garbage collector: every owned instance, over and over."""
        ec2 = self.client()
        while self.launching.is_set():
            self.call("DescribeInstances", lambda: list(ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": ["ml-prod"]}])))

    def terminator(self) -> None:
        """The drain: terminate what was launched, two at a time."""
        ec2 = self.client()
        while self.launching.is_set() or len(self.terminated) < len(self.launched):
            batch = self.launched[len(self.terminated):len(self.terminated) + 2]
            if not batch:
                time.sleep(0.01)
                continue
            if self.call("TerminateInstances", functools.partial(ec2.terminate_instances, InstanceIds=batch)) is None:
                return
            self.terminated.extend(batch)

    def run(self) -> None:
        launchers = [threading.Thread(target=self.launcher, args=(n,)) for n in range(LAUNCHERS)]
        others = [*(threading.Thread(target=self.describer) for _ in range(2)),
                  threading.Thread(target=self.terminator)]
        self.launching.set()
        for thread in (*launchers, *others):
            thread.start()
        for thread in launchers:
            thread.join()
        self.launching.clear()
        for thread in others:
            thread.join()


def test_launches_tags_listings_and_terminations_side_by_side_all_succeed(aws: EmbeddedAws) -> None:
    """Every call succeeds and the listing agrees with what was launched and terminated. This passed without
    the lock as well (also with the interpreter switching threads every microsecond): the race was not made to
    happen on demand; the test holds the lock to its promise (no deadlock, nothing lost or shown half-made)."""
    race = Race(aws)
    race.run()

    assert not race.errors, race.errors[:3]
    assert len(race.launched) == len(set(race.launched)) == LAUNCHERS * FLEETS * PER_FLEET
    assert sorted(race.terminated) == sorted(race.launched)
    listed = {i["InstanceId"]: (i["State"]["Name"], _claim(i)) for page in aws.clients.client("ec2").get_paginator(
        "describe_instances").paginate(InstanceIds=race.launched) for r in page["Reservations"] for i in r["Instances"]}
    assert set(listed) == set(race.launched)
    assert all(state in ("shutting-down", "terminated") and claim.startswith("race-")
               for state, claim in listed.values()), listed


def _claim(instance: dict[str, Any]) -> str:
    return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == TAG_CLAIM), "")


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

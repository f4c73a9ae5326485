"""The fleet Lambda on moto (server mode): claims in DynamoDB, launch requests from the launch queue, EC2 Fleet.

moto launches what CreateFleet asks (type instant, launch template, overrides, tags, user data) but ignores
the ClientToken, so "the same claim retried launches nothing new" rests on the claim's stored state here.
"""

from __future__ import annotations

import base64
import email
import json
from datetime import timedelta
from email.message import Message
from typing import TYPE_CHECKING, Any

import yaml

from gpu_autoscaler.emulator.resources import CLUSTER_SERVICE_CIDR
from gpu_autoscaler.emulator.sqs_events import RECEIVE_ARGUMENTS, sqs_event
from gpu_autoscaler.lambda_context import local_context
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.messages import LaunchRequest
from tests.conftest import ROOT, log_to_stdout
from tests.emf import metric_values
from tests.integration.fleet.helpers import new_claim

if TYPE_CHECKING:
    from types import ModuleType

    import pytest

    from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.emulator.aws import EmbeddedAws

def deliver(aws: EmbeddedAws, fleet: ModuleType, *bodies: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Send to the launch queue, receive as the event source mapping does, invoke; (event, response)."""
    sqs = aws.clients.client("sqs")
    for body in bodies:
        sqs.send_message(QueueUrl=aws.queue_url("launch"), MessageBody=body)
    messages: list[dict[str, Any]] = []
    while len(messages) < len(bodies):
        answer = sqs.receive_message(QueueUrl=aws.queue_url("launch"), MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                     **RECEIVE_ARGUMENTS)
        messages += answer.get("Messages", [])
    event = sqs_event(messages, aws.queue_arn("launch"))
    response = fleet.handler(event, local_context("fleet"))
    for message in messages:
        sqs.delete_message(QueueUrl=aws.queue_url("launch"), ReceiptHandle=message["ReceiptHandle"])
    return event, response


def request(*claim_ids: str, gang: str | None = None) -> str:
    return LaunchRequest(cluster="ml-prod", claim_ids=list(claim_ids), gang=gang).model_dump_json(
        by_alias=True, exclude_none=True)


def instances_of(aws: EmbeddedAws, claim_id: str) -> list[dict[str, Any]]:
    pages = aws.clients.client("ec2").get_paginator("describe_instances").paginate(
        Filters=[{"Name": f"tag:{L.TAG_CLAIM}", "Values": [claim_id]}])
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def test_a_launch_request_creates_a_tagged_instance_and_records_it(
        aws: EmbeddedAws, fleet: ModuleType, store: DynamoStateStore) -> None:
    new_claim(store, "gpu-burst-spot1")
    _, response = deliver(aws, fleet, request("gpu-burst-spot1"))
    assert response == {"batchItemFailures": []}

    claim = store.get_claim("gpu-burst-spot1")
    assert claim is not None and claim.state is ClaimState.LAUNCHED
    assert claim.capacity_type == "spot" and claim.instance_type == "g6.xlarge" and claim.zone == "us-east-1b"
    assert claim.launched_price_per_hour is not None and claim.launched_price_per_hour > 0
    assert store.claim_for_instance(claim.instance_id or "") == claim
    [instance] = instances_of(aws, "gpu-burst-spot1")
    assert instance["InstanceId"] == claim.instance_id
    assert tags(instance) == {**L.cluster_tags("ml-prod"), L.TAG_NODE_POOL: "gpu-burst", L.TAG_CLAIM: "gpu-burst-spot1",
                              "Name": "ml-prod/gpu-burst-spot1"}
    assert instance["SubnetId"] == aws.zone_subnets["us-east-1b"]
    # The network drift compares with the configuration is the one the instance runs in (the emulator's stand-ins).
    assert instance["SubnetId"] == aws.resources.subnet_ids[claim.attributes["subnetId"]]
    groups = aws.resources.security_group_ids
    assert sorted(g["GroupId"] for g in instance["SecurityGroups"]) == sorted(
        groups[g] for g in claim.attributes["securityGroups"].split(","))
    assert instance["InstanceLifecycle"] == "spot"

    raw = aws.clients.client("ec2").describe_instance_attribute(
        InstanceId=claim.instance_id, Attribute="userData")["UserData"]["Value"]
    parts = email.message_from_bytes(base64.b64decode(raw)).get_payload()
    assert isinstance(parts, list)  # MIME multi-part user data, as EKS nodes take it
    [part] = parts
    assert isinstance(part, Message)
    node_config = yaml.safe_load(part.get_payload())
    assert node_config["spec"]["cluster"]["name"] == "ml-prod"
    described = aws.clients.client("eks").describe_cluster(name="ml-prod")["cluster"]
    assert node_config["spec"]["cluster"]["certificateAuthority"] == described["certificateAuthority"]["data"]
    assert node_config["spec"]["cluster"]["cidr"] == CLUSTER_SERVICE_CIDR  # both from DescribeCluster: it can join
    labels = node_config["spec"]["kubelet"]["flags"][0].removeprefix("--node-labels=").split(",")
    assert f"{L.CLAIM_LABEL}=gpu-burst-spot1" in labels and f"{L.CAPACITY_TYPE}=spot" in labels


def test_the_same_claim_retried_launches_nothing_new(
        aws: EmbeddedAws, fleet: ModuleType, store: DynamoStateStore) -> None:
    before = instances_of(aws, "gpu-burst-spot1")
    event, _ = deliver(aws, fleet, request("gpu-burst-spot1"))  # the packer re-sent it
    response = fleet.handler(event, local_context("fleet"))  # and that message came twice
    assert response == {"batchItemFailures": []}
    assert instances_of(aws, "gpu-burst-spot1") == before


def test_a_gang_launches_whole_in_one_zone_each_instance_tagged_with_its_claim(
        aws: EmbeddedAws, fleet: ModuleType, store: DynamoStateStore) -> None:
    ids = [f"gpu-reserved-gang{i}" for i in range(3)]
    for claim_id in ids:
        new_claim(store, claim_id, pool="gpu-reserved", capacity_type="on-demand", gang="training/train-7",
                  instance_types=("p5.48xlarge",), zones=("us-east-1a", "us-east-1c"), price_per_hour=55.04)
    _, response = deliver(aws, fleet, request(*ids, gang="training/train-7"))
    assert response == {"batchItemFailures": []}
    claims = [store.get_claim(i) for i in ids]
    assert all(c is not None and c.state is ClaimState.LAUNCHED for c in claims)
    assert len({c.zone for c in claims if c}) == 1
    for claim_id in ids:
        [instance] = instances_of(aws, claim_id)
        assert tags(instance)["gpu-autoscaler/gang"] == "training/train-7"
        # the request's token from launch, before each instance was tagged with its claim (issue 19)
        assert tags(instance)["gpu-autoscaler/launch"].startswith("gpu-autoscaler-")
        assert tags(instance)["Name"] == f"ml-prod/{claim_id}"
        assert instance["InstanceType"] == "p5.48xlarge"


def test_a_claim_that_cannot_launch_releases_its_pods(
        aws: EmbeddedAws, fleet: ModuleType, store: DynamoStateStore, capsys: pytest.CaptureFixture[str]) -> None:
    claim = new_claim(store, "gpu-burst-nocap", instance_types=("g6.2xlarge",), zones=("us-east-1c",))
    for capacity_type in ("spot", "on-demand"):
        store.mark_unavailable(("g6.2xlarge", "us-east-1c", capacity_type), timedelta(minutes=3),
                               "InsufficientInstanceCapacity")
    _, response = deliver(aws, fleet, request(claim.id))
    assert response == {"batchItemFailures": []}
    closed = store.get_claim(claim.id)
    assert closed is not None and closed.state is ClaimState.TERMINATED
    assert "no offering left" in closed.reason
    assert store.assignments(list(claim.pods)) == {}
    assert instances_of(aws, claim.id) == []
    emitted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    [failure] = [m for m in emitted if "LaunchFailures" in m]
    assert failure["reason"] == "NoOfferings" and failure["LaunchFailures"] == [1.0]
    assert failure["_aws"]["CloudWatchMetrics"][0]["Namespace"] == aws.function_environment("fleet")[
        "POWERTOOLS_METRICS_NAMESPACE"] == "GpuAutoscaler/ml-prod"


def test_an_untagged_instance_is_never_terminated(
        aws: EmbeddedAws, fleet: ModuleType, store: DynamoStateStore, config: Config) -> None:
    ec2 = aws.clients.client("ec2")
    foreign = ec2.run_instances(ImageId=config.ami.x86_64, InstanceType="g6.xlarge", MinCount=1, MaxCount=1,
                                SubnetId=aws.zone_subnets["us-east-1a"])["Instances"][0]["InstanceId"]
    claim = new_claim(store, "gpu-burst-foreign")
    claim = store.transition(claim, ClaimState.LAUNCHED, "recorded by mistake", instance_id=foreign,
                             instance_type="g6.xlarge", zone="us-east-1a")
    closed = fleet.service().terminate(claim, "reconcile: no node")
    assert closed.state is ClaimState.TERMINATED
    [instance] = ec2.describe_instances(InstanceIds=[foreign])["Reservations"][0]["Instances"]
    assert instance["State"]["Name"] == "running"
    assert store.assignments(list(claim.pods)) == {}


def test_terminate_ends_an_owned_instance_once(aws: EmbeddedAws, fleet: ModuleType, store: DynamoStateStore) -> None:
    claim = store.get_claim("gpu-burst-spot1")
    assert claim is not None and claim.instance_id
    closed = fleet.service().terminate(claim, "consolidation: empty")
    assert closed.state is ClaimState.TERMINATED and closed.reason == "consolidation: empty"
    [instance] = instances_of(aws, claim.id)
    assert instance["State"]["Name"] in ("shutting-down", "terminated")
    assert fleet.service().terminate(claim, "again") == closed
    assert [t.state for t in closed.history] == [ClaimState.LAUNCHED, ClaimState.TERMINATED]


def test_a_malformed_request_fails_alone(aws: EmbeddedAws, fleet: ModuleType, store: DynamoStateStore,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    log_to_stdout(fleet)
    new_claim(store, "gpu-burst-ok")
    event, response = deliver(aws, fleet, '{"cluster": "ml-prod", "claimIds": []}', request("gpu-burst-ok"))
    bad = next(r["messageId"] for r in event["Records"] if "gpu-burst-ok" not in r["body"])
    assert response == {"batchItemFailures": [{"itemIdentifier": bad}]}
    out = capsys.readouterr().out
    assert "not a launch request" in out
    assert metric_values(out, "RecordsFailed") == [1]
    ok = store.get_claim("gpu-burst-ok")
    assert ok is not None and ok.state is ClaimState.LAUNCHED


def test_the_sample_event_runs(fleet: ModuleType) -> None:
    event = json.loads((ROOT / "events" / "fleet-launch-request.json").read_text())
    assert fleet.handler(event, local_context("fleet")) == {"batchItemFailures": []}


def test_a_fresh_account_that_may_not_create_the_spot_role_launches_on_demand(
        aws: EmbeddedAws, fleet: ModuleType, store: DynamoStateStore) -> None:
    """Through the strict layer: the account has no AWSServiceRoleForEC2Spot and the caller may not create it,
    so EC2 answers every Spot override with AuthFailure.ServiceLinkedRoleCreationNotPermitted; the pool allows
    On-Demand, so the claim launches there."""
    from gpu_autoscaler.emulator.strict import ec2_instances

    account = aws.clients.client("sts").get_caller_identity()["Account"]
    iam = aws.clients.client("iam")
    try:
        iam.delete_role(RoleName=ec2_instances.SPOT_ROLE)  # an earlier Spot launch in this package created it
    except iam.exceptions.NoSuchEntityException:
        pass
    ec2_instances.set_spot_role_creation(account, permitted=False)
    try:
        new_claim(store, "gpu-burst-no-spot-role", zones=("us-east-1c",), instance_types=("g6.xlarge",))
        _, response = deliver(aws, fleet, request("gpu-burst-no-spot-role"))
    finally:
        ec2_instances.set_spot_role_creation(account, permitted=True)
    assert response == {"batchItemFailures": []}
    claim = store.get_claim("gpu-burst-no-spot-role")
    assert claim is not None and claim.state is ClaimState.LAUNCHED and claim.capacity_type == "on-demand"


def test_an_account_that_puts_tags_in_instance_metadata_by_default_still_launches(
        aws: EmbeddedAws, fleet: ModuleType, store: DynamoStateStore) -> None:
    """Through the strict layer: with the account-level default `InstanceMetadataTags=enabled`, EC2 fails every
    launch whose instance tag keys hold a `/` (ours all do); the templates turn tags in metadata off themselves."""
    ec2 = aws.clients.client("ec2")
    ec2.modify_instance_metadata_defaults(InstanceMetadataTags="enabled")
    try:
        new_claim(store, "gpu-burst-imds-tags", zones=("us-east-1c",), instance_types=("g6.xlarge",))
        _, response = deliver(aws, fleet, request("gpu-burst-imds-tags"))
    finally:
        ec2.modify_instance_metadata_defaults(InstanceMetadataTags="no-preference")
    assert response == {"batchItemFailures": []}
    claim = store.get_claim("gpu-burst-imds-tags")
    # Spot or On-Demand (the test before may have left Spot marked unavailable): either failed before.
    assert claim is not None and claim.state is ClaimState.LAUNCHED, claim


def test_owned_instances_lists_the_clusters_instances_for_the_garbage_collector(
        aws: EmbeddedAws, config: Config) -> None:
    from datetime import UTC, datetime

    from gpu_autoscaler.adapters.aws.fleet import Ec2Compute

    ec2 = aws.clients.client("ec2")

    def run(tags: dict[str, str]) -> str:
        specs = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
        return str(ec2.run_instances(ImageId=config.ami.x86_64, InstanceType="g6.xlarge", MinCount=1, MaxCount=1,
                                     SubnetId=aws.zone_subnets["us-east-1a"], TagSpecifications=specs,
                                     )["Instances"][0]["InstanceId"])

    ours = run({L.TAG_CLUSTER: "ml-prod", L.TAG_CLAIM: "gc-listed", "gpu-autoscaler/launch": "gpu-autoscaler-t-1"})
    other = run({L.TAG_CLUSTER: "ml-dev"})
    builder = run({L.TAG_CLUSTER: "ml-prod", L.TAG_SNAPSHOT_BUILDER: "ml-prod"})
    listed = {i.instance_id: i for i in Ec2Compute(ec2, "ml-prod").owned_instances()}
    assert ours in listed and other not in listed
    assert builder not in listed, "a snapshot builder is ours but no node: the collector must not take it"
    instance = listed[ours]
    assert instance.claim_id == "gc-listed" and instance.launch_token == "gpu-autoscaler-t-1"
    assert instance.state in ("pending", "running") and not instance.gone
    assert instance.launched_at is not None and abs((datetime.now(UTC) - instance.launched_at).total_seconds()) < 120

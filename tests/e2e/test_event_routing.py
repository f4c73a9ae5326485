"""EventBridge as the emulator provides it: `PutEvents` on the default bus reaches the interruption queue by
the stack's rules, in the shape EventBridge delivers to an SQS target. Nothing consumes the queue here, so the
message is read as the function's poller would receive it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.event_patterns import INTERRUPTION_RULES
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

INSTANCE = "i-0f3a9c1e5b7d24680"
ARN = f"arn:aws:ec2:us-east-1:123456789012:instance/{INSTANCE}"


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    with EmbeddedAws(parse_config(example_config_data())) as embedded:
        yield embedded


def test_the_stack_rules_exist_with_the_shared_patterns(aws: EmbeddedAws) -> None:
    events = aws.clients.client("events")
    rules = events.list_rules()["Rules"]
    assert {json.dumps(json.loads(r["EventPattern"]), sort_keys=True) for r in rules} == {
        json.dumps(p, sort_keys=True) for p in INTERRUPTION_RULES.values()}
    for rule in rules:
        [target] = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
        assert target["Arn"] == aws.queue_arn("interruption")
        assert target["DeadLetterConfig"]["Arn"] == aws.queue_arn("interruption-dlq")


def test_matching_events_reach_the_interruption_queue_as_eventbridge_delivers_them(aws: EmbeddedAws) -> None:
    aws.clients.client("events").put_events(Entries=[
        {"Source": "aws.ec2", "DetailType": "EC2 Spot Instance Interruption Warning", "Resources": [ARN],
         "Detail": json.dumps({"instance-id": INSTANCE, "instance-action": "terminate"})},
        # Matches no rule: a state change to running is not ours to act on.
        {"Source": "aws.ec2", "DetailType": "EC2 Instance State-change Notification", "Resources": [ARN],
         "Detail": json.dumps({"instance-id": INSTANCE, "state": "running"})},
        {"Source": "aws.ec2", "DetailType": "EC2 Instance State-change Notification", "Resources": [ARN],
         "Detail": json.dumps({"instance-id": INSTANCE, "state": "terminated"})},
    ])
    sqs = aws.clients.client("sqs")
    messages = sqs.receive_message(QueueUrl=aws.queue_url("interruption"), MaxNumberOfMessages=10,
                                   WaitTimeSeconds=1)["Messages"]
    bodies = sorted((json.loads(m["Body"]) for m in messages), key=lambda b: b["detail-type"])
    assert [b["detail-type"] for b in bodies] == [
        "EC2 Instance State-change Notification", "EC2 Spot Instance Interruption Warning"]
    assert bodies[0]["detail"]["state"] == "terminated"
    for body in bodies:
        assert body["account"] == "123456789012"
        assert body["resources"] == [ARN]
        assert body["source"] == "aws.ec2"
        assert set(body) == {"version", "id", "detail-type", "source", "account", "time", "region", "resources",
                             "detail"}

"""CreateFleet's ClientToken (EC2 answers a repeated token once) and the throttling fault rule the chaos suite
switches on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config as BotoConfig

from gpu_autoscaler.emulator.strict.faults import throttling
from tests.integration.strict.test_ec2_launch_rules import fleet, refused

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws


def _fleet(aws: EmbeddedAws, **extra: Any) -> dict[str, Any]:
    """An On-Demand fleet no capacity reservation of the other tests matches (those the reservations stand-in
    answers are not remembered: see `ec2_idempotency`)."""
    return fleet(aws, "on-demand", overrides=[{"InstanceType": "g4dn.xlarge",
                                               "SubnetId": aws.zone_subnets["us-east-1b"]}], **extra)


def _ids(response: dict[str, Any]) -> list[str]:
    return [i for item in response["Instances"] for i in item["InstanceIds"]]


def test_a_repeated_client_token_returns_the_first_fleets_instances(aws: EmbeddedAws, ec2: Any) -> None:
    params = _fleet(aws, ClientToken="chaos-token-1")
    first = ec2.create_fleet(**params)
    again = ec2.create_fleet(**params)

    assert _ids(first) and _ids(again) == _ids(first)
    assert again["FleetId"] == first["FleetId"]
    tagged = ec2.describe_instances(InstanceIds=_ids(first))["Reservations"]
    assert sum(len(r["Instances"]) for r in tagged) == 1


def test_a_client_token_reused_with_other_parameters_is_refused(aws: EmbeddedAws, ec2: Any) -> None:
    ec2.create_fleet(**_fleet(aws, ClientToken="chaos-token-2"))
    code, _ = refused(ec2.create_fleet, **_fleet(aws, target=2, ClientToken="chaos-token-2"))
    assert code == "IdempotentParameterMismatch"


def test_without_a_token_every_call_launches(aws: EmbeddedAws, ec2: Any) -> None:
    assert _ids(ec2.create_fleet(**_fleet(aws))) != _ids(ec2.create_fleet(**_fleet(aws)))


def test_throttling_answers_request_limit_exceeded_as_ec2_does(aws: EmbeddedAws) -> None:
    no_retries = boto3.client("ec2", region_name=aws.config.region, endpoint_url=aws.endpoint_url,
                              config=BotoConfig(retries={"max_attempts": 1, "mode": "standard"}))
    with throttling(1.0) as rule:
        code, message = refused(no_retries.describe_instances)
    assert (code, message) == ("RequestLimitExceeded", "Request limit exceeded.")
    assert rule.refused == rule.seen >= 1
    with throttling(0.0):
        no_retries.describe_instances()  # off: nothing refused
    no_retries.describe_instances()

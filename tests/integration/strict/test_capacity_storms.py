"""The insufficient-capacity fault the chaos suite scripts: an instant CreateFleet launches what it can and lists
an `InsufficientInstanceCapacity` error per override it could not launch (it does not fail); RunInstances is
refused; a repeated client token still hands back the first answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config as BotoConfig

from gpu_autoscaler.emulator.strict.faults import capacity_storm
from tests.integration.strict.test_ec2_launch_rules import fleet, refused

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws


def _overrides(aws: EmbeddedAws, *offerings: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"InstanceType": t, "SubnetId": aws.zone_subnets[z]} for t, z in offerings]


def _launched(response: dict[str, Any]) -> list[str]:
    return [item["InstanceType"] for item in response.get("Instances", []) for _ in item["InstanceIds"]]


def test_an_empty_family_is_answered_per_override_and_the_rest_launches(aws: EmbeddedAws, ec2: Any) -> None:
    overrides = _overrides(aws, ("g6.xlarge", "us-east-1a"), ("g6.2xlarge", "us-east-1b"), ("g5.xlarge", "us-east-1a"))
    with capacity_storm() as storm:
        storm.take("g6", "spot")
        response = ec2.create_fleet(**fleet(aws, "spot", overrides=overrides))

    assert _launched(response) == ["g5.xlarge"]
    errors = response["Errors"]
    assert {(e["LaunchTemplateAndOverrides"]["Overrides"]["InstanceType"], e["Lifecycle"], e["ErrorCode"])
            for e in errors} == {("g6.xlarge", "spot", "InsufficientInstanceCapacity"),
                                 ("g6.2xlarge", "spot", "InsufficientInstanceCapacity")}
    first = next(e for e in errors if e["LaunchTemplateAndOverrides"]["Overrides"]["InstanceType"] == "g6.xlarge")
    assert first["ErrorMessage"].startswith("We currently do not have sufficient g6.xlarge capacity in the "
                                            "Availability Zone you requested (us-east-1a).")
    assert storm.seen == 1 and storm.refused == 2


def test_nothing_left_launches_nothing_and_says_why_without_failing_the_call(aws: EmbeddedAws, ec2: Any) -> None:
    overrides = _overrides(aws, ("g6.xlarge", "us-east-1a"), ("g6.xlarge", "us-east-1b"))
    with capacity_storm() as storm:
        storm.take("g6", "spot")
        storm.take("g6", "on-demand")
        spot = ec2.create_fleet(**fleet(aws, "spot", overrides=overrides))
        on_demand = ec2.create_fleet(**fleet(aws, "on-demand", overrides=overrides))
        storm.give_back("g6", "spot")
        back = ec2.create_fleet(**fleet(aws, "spot", overrides=overrides))

    for response, lifecycle in ((spot, "spot"), (on_demand, "on-demand")):
        assert response["FleetId"] and not response["Instances"]
        assert [(e["ErrorCode"], e["Lifecycle"]) for e in response["Errors"]] == \
            [("InsufficientInstanceCapacity", lifecycle)] * 2
    assert _launched(back) == ["g6.xlarge"] and not back.get("Errors")


def test_a_repeated_client_token_is_answered_as_the_first_time_whatever_the_storm(
    aws: EmbeddedAws, ec2: Any,
) -> None:
    params = fleet(aws, "spot", overrides=_overrides(aws, ("g6.xlarge", "us-east-1c")), ClientToken="storm-token-1")
    first = ec2.create_fleet(**params)
    with capacity_storm() as storm:
        storm.take("g6", "spot")
        again = ec2.create_fleet(**params)

    assert _launched(first) == ["g6.xlarge"] and again["Instances"] == first["Instances"]
    assert not again.get("Errors")


def test_share_empties_the_same_pools_for_the_same_seed(aws: EmbeddedAws) -> None:
    def empty_pools(seed: int) -> set[str]:
        with capacity_storm(seed=seed, share=0.5) as storm:
            storm.take("g6", "spot")
            return {z for z in ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f")
                    if storm.empty("g6.xlarge", z, "spot")}

    assert empty_pools(3) == empty_pools(3)
    assert 0 < len(empty_pools(3) | empty_pools(4))


def test_run_instances_in_an_empty_pool_is_refused_with_ec2s_code(aws: EmbeddedAws) -> None:
    no_retries = boto3.client("ec2", region_name=aws.config.region, endpoint_url=aws.endpoint_url,
                              config=BotoConfig(retries={"max_attempts": 1, "mode": "standard"}))
    with capacity_storm() as storm:
        storm.take("g6", "on-demand")
        code, message = refused(no_retries.run_instances, ImageId=aws.config.ami.x86_64, InstanceType="g6.xlarge",
                                MinCount=1, MaxCount=1, Placement={"AvailabilityZone": "us-east-1a"})
    assert code == "InsufficientInstanceCapacity"
    assert "sufficient g6.xlarge capacity in the Availability Zone you requested (us-east-1a)" in message
    assert storm.refused == storm.seen >= 1  # a server error: botocore retries it (max_attempts counts retries)

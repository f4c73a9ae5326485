"""The account's instance metadata defaults (moto lacks them) and the launches EC2 refuses once tags are in
instance metadata: a tag key with `/` or a space."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from gpu_autoscaler.emulator.strict.ec2_instance_metadata_defaults import invalid_tag_key_message

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.emulator.aws import EmbeddedAws

OWNER = "gpu-autoscaler/cluster"
MESSAGE = ("'gpu-autoscaler/cluster' is not a valid tag key. Tag keys must match pattern "
           "([0-9a-zA-Z\\\\-_+=,.@:]{1,255}), and must not be a reserved name ('.', '..', '_index')")
"""As EC2 answers it (aws/karpenter-provider-aws#7012): two backslashes before the dash."""


@pytest.fixture
def tags_enabled(ec2: Any) -> Iterator[None]:
    """The account default a security baseline may set: tags in instance metadata for every launch."""
    ec2.modify_instance_metadata_defaults(InstanceMetadataTags="enabled")
    yield
    ec2.modify_instance_metadata_defaults(InstanceMetadataTags="no-preference")


def template(aws: EmbeddedAws, ec2: Any, metadata: dict[str, Any] | None = None) -> str:
    """A launch template of our own (not the project's): tags every instance with a key holding a `/`."""
    data: dict[str, Any] = {
        "ImageId": aws.config.ami.x86_64,
        "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": OWNER, "Value": "ml-prod"}]}],
    }
    if metadata is not None:
        data["MetadataOptions"] = metadata
    created = ec2.create_launch_template(LaunchTemplateName=f"imds-{secrets.token_hex(4)}", LaunchTemplateData=data)
    return str(created["LaunchTemplate"]["LaunchTemplateId"])


def fleet(aws: EmbeddedAws, template_id: str) -> dict[str, Any]:
    return {
        "Type": "instant",
        "LaunchTemplateConfigs": [{
            "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": "$Default"},
            "Overrides": [{"InstanceType": "g6.xlarge", "SubnetId": aws.zone_subnets[zone]}
                          for zone in ("us-east-1a", "us-east-1b")],
        }],
        "TargetCapacitySpecification": {"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"},
    }


def run(aws: EmbeddedAws, ec2: Any, key: str, **extra: Any) -> dict[str, Any]:
    return dict(ec2.run_instances(
        ImageId=aws.config.ami.x86_64, InstanceType="g6.xlarge", MinCount=1, MaxCount=1,
        SubnetId=aws.zone_subnets["us-east-1a"],
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": key, "Value": "x"}]}], **extra))


def test_the_account_defaults_are_kept_until_cleared(ec2: Any) -> None:
    assert ec2.get_instance_metadata_defaults()["AccountLevel"] == {}
    assert ec2.modify_instance_metadata_defaults(InstanceMetadataTags="enabled", HttpTokens="required")["Return"]
    assert ec2.get_instance_metadata_defaults()["AccountLevel"] == {"InstanceMetadataTags": "enabled",
                                                                    "HttpTokens": "required"}
    ec2.modify_instance_metadata_defaults(InstanceMetadataTags="no-preference", HttpTokens="no-preference")
    assert ec2.get_instance_metadata_defaults()["AccountLevel"] == {}


def test_the_message_is_ec2s() -> None:
    assert invalid_tag_key_message(OWNER) == MESSAGE


def test_without_tags_in_metadata_any_key_launches(aws: EmbeddedAws, ec2: Any) -> None:
    assert run(aws, ec2, OWNER)["Instances"]
    response = ec2.create_fleet(**fleet(aws, template(aws, ec2)))
    assert not response.get("Errors") and response["Instances"]


def test_the_account_default_fails_launches_tagged_with_a_slash_or_a_space(
        aws: EmbeddedAws, ec2: Any, tags_enabled: None) -> None:
    with pytest.raises(ClientError) as caught:
        run(aws, ec2, OWNER)
    assert caught.value.response["Error"] == {"Code": "InvalidParameterValue", "Message": MESSAGE}
    with pytest.raises(ClientError, match="'team name' is not a valid tag key"):
        run(aws, ec2, "team name")
    assert run(aws, ec2, "gpu-autoscaler:cluster")["Instances"]  # a key IMDS can serve
    # An instant fleet reports each override of the template it could not launch from.
    response = ec2.create_fleet(**fleet(aws, template(aws, ec2)))
    assert response["Instances"] == []
    assert [(e["ErrorCode"], e["ErrorMessage"], e["Lifecycle"]) for e in response["Errors"]] == \
        [("InvalidParameterValue", MESSAGE, "on-demand")] * 2


def test_the_launch_or_its_template_saying_disabled_wins_over_the_account(
        aws: EmbeddedAws, ec2: Any, tags_enabled: None) -> None:
    assert run(aws, ec2, OWNER, MetadataOptions={"InstanceMetadataTags": "disabled"})["Instances"]
    response = ec2.create_fleet(**fleet(aws, template(aws, ec2, {"InstanceMetadataTags": "disabled"})))
    assert not response.get("Errors") and response["Instances"]


def test_a_template_enabling_tags_fails_without_any_account_default(aws: EmbeddedAws, ec2: Any) -> None:
    response = ec2.create_fleet(**fleet(aws, template(aws, ec2, {"InstanceMetadataTags": "enabled"})))
    assert response["Instances"] == [] and {e["ErrorCode"] for e in response["Errors"]} == {"InvalidParameterValue"}

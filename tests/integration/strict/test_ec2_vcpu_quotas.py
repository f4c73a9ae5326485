"""EC2's vCPU quotas in an emulated account that set them: Service Quotas names each quota's usage metric, the
`AWS/Usage` metrics count the account's instances, and a launch past a quota is refused in EC2's words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.emulator.strict import strict_layer_disabled
from gpu_autoscaler.emulator.strict.ec2_vcpu_quotas import set_vcpu_quotas
from tests.integration.strict.test_ec2_launch_rules import fleet, refused

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.emulator.aws import EmbeddedAws

G_ON_DEMAND = "L-DB2E81BA"
P5_SPOT = "L-C4BD4855"


@pytest.fixture
def account(aws: EmbeddedAws, ec2: Any) -> Iterator[str]:
    """The emulator's account, its instances gone and its quotas unset again afterwards."""
    account_id = str(aws.clients.client("sts").get_caller_identity()["Account"])
    _terminate_all(ec2)
    yield account_id
    set_vcpu_quotas(account_id, aws.config.region, None)
    _terminate_all(ec2)


def _terminate_all(ec2: Any) -> None:
    ids = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
           if i["State"]["Name"] in ("pending", "running")]
    if ids:
        with strict_layer_disabled():  # instances of no cluster: the stack's roles may not end them, a test may
            ec2.terminate_instances(InstanceIds=ids)


def _usage(aws: EmbeddedAws, cls: str) -> float | None:
    now = datetime.now(UTC)
    answer = aws.clients.client("cloudwatch").get_metric_data(
        MetricDataQueries=[{"Id": "q", "MetricStat": {"Metric": {
            "Namespace": "AWS/Usage", "MetricName": "ResourceCount",
            "Dimensions": [{"Name": "Class", "Value": cls}, {"Name": "Resource", "Value": "vCPU"},
                           {"Name": "Service", "Value": "EC2"}, {"Name": "Type", "Value": "Resource"}]},
            "Period": 60, "Stat": "Maximum"}}],
        StartTime=now - timedelta(minutes=15), EndTime=now + timedelta(seconds=1), ScanBy="TimestampDescending")
    values = answer["MetricDataResults"][0]["Values"]
    return values[0] if values else None


def test_a_set_quota_is_answered_with_its_usage_metric_and_an_unset_one_is_not_there(
        aws: EmbeddedAws, account: str) -> None:
    quotas = aws.clients.client("service-quotas")
    set_vcpu_quotas(account, aws.config.region, {G_ON_DEMAND: 96})
    quota = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=G_ON_DEMAND)["Quota"]
    assert quota["Value"] == 96.0 and quota["QuotaName"] == "Running On-Demand G and VT instances"
    assert quota["UsageMetric"] == {
        "MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
        "MetricDimensions": {"Class": "G/OnDemand", "Resource": "vCPU", "Service": "EC2", "Type": "Resource"},
        "MetricStatisticRecommendation": "Maximum"}
    assert quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=G_ON_DEMAND)["Quota"]["Value"] == 96.0
    for call in (quotas.get_service_quota, quotas.get_aws_default_service_quota):
        code, _ = refused(call, ServiceCode="ec2", QuotaCode=P5_SPOT)
        assert code == "NoSuchResourceException"


def test_the_usage_metric_counts_the_account_s_instances_by_class(aws: EmbeddedAws, ec2: Any, account: str) -> None:
    set_vcpu_quotas(account, aws.config.region, {G_ON_DEMAND: 1000, "L-417A185B": 1000})
    ec2.run_instances(ImageId=aws.config.ami.x86_64, InstanceType="g5.12xlarge", MinCount=2, MaxCount=2)
    assert _usage(aws, "G/OnDemand") == 96.0  # 2 x 48: instances nobody tagged count as much as ours
    assert _usage(aws, "P/OnDemand") is None  # no P instance: no datapoint


def test_a_launch_past_the_quota_is_refused_in_ec2_s_words(aws: EmbeddedAws, ec2: Any, account: str) -> None:
    set_vcpu_quotas(account, aws.config.region, {G_ON_DEMAND: 96})
    ec2.run_instances(ImageId=aws.config.ami.x86_64, InstanceType="g5.16xlarge", MinCount=1, MaxCount=1)  # 64
    code, message = refused(ec2.run_instances, ImageId=aws.config.ami.x86_64, InstanceType="g5.12xlarge",
                            MinCount=1, MaxCount=1)
    assert code == "VcpuLimitExceeded"
    assert message.startswith("You have requested more vCPU capacity than your current vCPU limit of 96 allows "
                              "for the instance bucket that the specified instance type belongs to.")
    overrides = [{"InstanceType": t, "SubnetId": aws.zone_subnets["us-east-1a"]} for t in ("g5.12xlarge", "g5.8xlarge")]
    response = ec2.create_fleet(**fleet(aws, "on-demand", overrides=overrides))
    assert [i["InstanceType"] for i in response["Instances"]] == ["g5.8xlarge"]  # 32: exactly what is left
    assert [(e["LaunchTemplateAndOverrides"]["Overrides"]["InstanceType"], e["ErrorCode"])
            for e in response["Errors"]] == [("g5.12xlarge", "VcpuLimitExceeded")]
    full = ec2.create_fleet(**fleet(aws, "on-demand", overrides=overrides[1:]))
    assert not full["Instances"] and full["Errors"][0]["ErrorCode"] == "VcpuLimitExceeded"

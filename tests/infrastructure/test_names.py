"""Every physical name fits its AWS limit for the longest cluster name EKS allows (issue 14, defect 4)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.naming import NAME_LIMITS, ResourceNames, fit
from tests.infrastructure.conftest import infrastructure_config_data, synthesize

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized

LONGEST_CLUSTER = "ml-" + "a1b2c3d4e5" * 9 + "-prod-x"
"""100 characters: EKS CreateCluster allows names of 1-100 characters, `^[0-9A-Za-z][A-Za-z0-9\\-_]*`."""

NAME_PROPERTIES: dict[str, dict[str, int]] = {
    "AWS::Lambda::Function": {"FunctionName": 64},
    "AWS::Lambda::LayerVersion": {"LayerName": 140},
    "AWS::SQS::Queue": {"QueueName": 80},
    "AWS::Scheduler::ScheduleGroup": {"Name": 64},
    "AWS::Scheduler::Schedule": {"Name": 64, "GroupName": 64},
    "AWS::Events::Rule": {"Name": 64},
    "AWS::IAM::Role": {"RoleName": 64},
    "AWS::IAM::InstanceProfile": {"InstanceProfileName": 128},
    "AWS::IAM::ManagedPolicy": {"ManagedPolicyName": 128},
    "AWS::IAM::Policy": {"PolicyName": 128},
    "AWS::DynamoDB::Table": {"TableName": 255},
    "AWS::SSM::Parameter": {"Name": 1011},
    "AWS::Logs::LogGroup": {"LogGroupName": 512},
    "AWS::CloudWatch::Alarm": {"AlarmName": 255},
    "AWS::CloudWatch::Dashboard": {"DashboardName": 255},
    "AWS::SNS::Topic": {"DisplayName": 100},
    "AWS::EC2::LaunchTemplate": {"LaunchTemplateName": 128},
}
"""Each resource type's name properties and the length its service allows (the CloudFormation resource
reference, property `Maximum`). A name property of a type not listed here fails the test below."""

NOT_PHYSICAL_NAMES = {"MetricName", "ClusterName"}
"""Properties ending in `Name` that name something other than the resource (an alarm's metric, the EKS cluster an
access entry is in)."""

STACK_NAME_LIMIT = 128


def long_name_config() -> dict[str, Any]:
    data = infrastructure_config_data()
    data["clusterName"] = LONGEST_CLUSTER
    data["nodePools"].append({
        "name": "gpu-efa-training-gangs-with-a-long-pool-name",
        "capacityTypes": ["on-demand"],
        "requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["p5"]}],
        "efa": True,
    })  # fmt: skip
    data["scalingWindows"][0]["name"] = "w" * 64
    return data


@pytest.fixture(scope="module")
def long_named(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    return synthesize(long_name_config(), tmp_path_factory.mktemp("cdk.out.long"))


def test_the_longest_cluster_name_is_valid() -> None:
    assert len(LONGEST_CLUSTER) == 100


def test_every_physical_name_fits_its_limit(long_named: Synthesized) -> None:
    assert len(long_named.stack.stack_name) <= STACK_NAME_LIMIT
    checked = 0
    for logical_id, resource in long_named.resources.items():
        props = resource.get("Properties", {})
        limits = NAME_PROPERTIES.get(resource["Type"], {})
        for key, value in props.items():
            if not key.endswith("Name") or key in NOT_PHYSICAL_NAMES or not isinstance(value, str):
                continue  # references to other resources' names are checked where those are defined
            assert key in limits, f"{resource['Type']}.{key} of {logical_id}: add its limit to NAME_PROPERTIES"
            assert len(value) <= limits[key], f"{logical_id}.{key} has {len(value)} > {limits[key]}: {value}"
            checked += 1
    assert checked >= 20


def test_names_that_fit_are_unchanged_and_shortened_ones_are_distinct_and_readable() -> None:
    short = ResourceNames("ml-prod")
    assert short.function("interruption") == "ml-prod-gpu-autoscaler-interruption"
    assert short.pending_pods_dlq == "ml-prod-gpu-autoscaler-pending-pods-dlq.fifo"
    long = ResourceNames(LONGEST_CLUSTER)
    other = ResourceNames(LONGEST_CLUSTER[:-1] + "y")
    for names in (long, other):
        assert names.pending_pods_dlq.endswith("-pending-pods-dlq.fifo") and len(names.pending_pods_dlq) == 80
        assert names.function("interruption").startswith("ml-a1b2") and names.function("interruption").endswith(
            "-interruption"
        )
        assert names.function_of(names.function("consolidate")) == "consolidate"
    assert long.function("drain") != other.function("drain")
    assert len({long.function(f) for f in ("packer", "fleet", "drain")}) == 3
    assert long.table == LONGEST_CLUSTER + "-gpu-autoscaler"  # 255 allowed: no need to shorten


def test_fit_refuses_a_suffix_that_leaves_no_room() -> None:
    with pytest.raises(ValueError, match="no room"):
        fit("cluster", 10, keep="-a-very-long-suffix")
    assert set(NAME_LIMITS) >= {"function", "queue", "schedule_group", "rule", "role"}


def test_each_cluster_has_its_own_metrics_namespace() -> None:
    """The functions' own metrics (RecordsFailed, TicksRejected, …) and the dashboard and alarms reading them: two
    clusters in one account and region must not add up in one series."""
    assert ResourceNames("ml-prod").metrics_namespace == "GpuAutoscaler/ml-prod"
    assert ResourceNames("ml-prod").metrics_namespace != ResourceNames("ml-staging").metrics_namespace


def _other_region() -> dict[str, Any]:
    data = infrastructure_config_data()
    data["region"] = "eu-west-1"
    data["network"]["subnets"] = {"eu-west-1a": "subnet-0aaa", "eu-west-1b": "subnet-0bbb"}
    return data


def test_account_global_names_carry_the_region(synthesized: Synthesized,
                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    """EKS cluster names are unique per region, so `ml-prod` in us-east-1 and in eu-west-1 is ordinary; but IAM
    names are global to the account, and "All dashboards in your account are global, not region-specific"
    (AWS::CloudWatch::Dashboard). The second region's deploy failed: its instance profile "already exists"."""
    other = synthesize(_other_region(), tmp_path_factory.mktemp("cdk.out.eu"))
    for cfn_type, key in (("AWS::IAM::InstanceProfile", "InstanceProfileName"),
                          ("AWS::CloudWatch::Dashboard", "DashboardName")):
        [here] = synthesized.of_type(cfn_type).values()
        [there] = other.of_type(cfn_type).values()
        assert here["Properties"][key] != there["Properties"][key], cfn_type
        assert "us-east-1" in here["Properties"][key] and "eu-west-1" in there["Properties"][key], cfn_type


def test_the_region_survives_the_shortening_of_account_global_names() -> None:
    """Instance profile names allow `[\\w+=,.@-]+` up to 128 characters (IAM CreateInstanceProfile), dashboard names
    letters, digits, `-` and `_` up to 255 (AWS::CloudWatch::Dashboard `DashboardName`)."""
    for cluster in ("ml-prod", LONGEST_CLUSTER):
        names = ResourceNames(cluster)
        for region in ("us-east-1", "ap-southeast-2", "us-gov-west-1"):
            profile, dashboard = names.instance_profile(region), names.dashboard(region)
            assert profile.endswith(f"-{region}-node") and len(profile) <= 128
            assert dashboard.endswith(f"-{region}") and len(dashboard) <= 255
            assert re.fullmatch(r"[\w+=,.@-]+", profile) and re.fullmatch(r"[A-Za-z0-9_-]+", dashboard)
    assert ResourceNames("ml-prod").instance_profile("us-east-1") == "ml-prod-gpu-autoscaler-us-east-1-node"
    assert ResourceNames("ml-prod").dashboard("us-east-1") == "ml-prod-gpu-autoscaler-us-east-1"

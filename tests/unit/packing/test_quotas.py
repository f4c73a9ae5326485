"""vCPU quota keys and ledger, and the Service Quotas source: cached, overridden, falling back with a log."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.stub import Stubber

from gpu_autoscaler.adapters.aws.service_quotas import USAGE_WINDOW, ServiceQuotasSource
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.packing.quotas import (
    QUOTA_CODES,
    USAGE_METRIC_LAG,
    VcpuLedger,
    quota_group,
    quota_keys,
    vcpus_outside,
)
from gpu_autoscaler.models.claims import ClaimState, NodeClaim, StateTransition
from gpu_autoscaler.models.quotas import UsageReading
from tests.unit.packing.builders import NOW, make_catalog, make_claim, make_type
from tests.unit.packing.fakes import FakeServiceQuotasClient


def test_quota_keys_by_class_and_family() -> None:
    assert quota_keys(make_type("g6f.large"), "spot") == ("g/spot", "g6f/spot")
    assert quota_keys(make_type("p5.48xlarge"), "reserved") == ("p/on-demand", "p5/on-demand")
    assert quota_group(make_type("g5.xlarge").model_copy(update={"name": "gr6.4xlarge"})) == "g"


def test_p5_spot_has_its_own_quota_and_p4_keeps_the_older_one() -> None:
    """Service Quotas (EC2 User Guide, "Spot Instance quotas"): "All P4, P3 and P2 Spot Instance Requests"
    (L-7212CCBC) and "All P5 Spot Instance Requests" (L-C4BD4855); On-Demand P is one quota for all."""
    assert QUOTA_CODES["p/spot"] == "L-7212CCBC"
    assert QUOTA_CODES["p5/spot"] == "L-C4BD4855"
    assert quota_keys(make_type("p4d.24xlarge"), "spot")[0] == "p/spot"
    p5en = make_type("p5.48xlarge").model_copy(update={"name": "p5en.48xlarge"})
    assert quota_keys(p5en, "spot") == ("p5/spot", "p5en/spot")
    assert quota_keys(p5en, "on-demand")[0] == "p/on-demand"
    ledger = VcpuLedger({"p/spot": 1000, "p5/spot": 0})
    assert ledger.admits_type(make_type("p4d.24xlarge"), "spot")
    assert not ledger.admits_type(make_type("p5.48xlarge"), "spot")  # a zero P5 quota, whatever P4's is


def test_ledger_charges_the_largest_candidate_per_key() -> None:
    ledger = VcpuLedger({"g/spot": 100, "g5/spot": 10})
    consumption = ledger.consumption([make_type("g5.xlarge"), make_type("g5.2xlarge"), make_type("g6.xlarge")], "spot")
    assert consumption == {"g/spot": 8, "g5/spot": 8}
    ledger.charge(consumption)
    assert ledger.admits({"g/spot": 92}) and not ledger.admits({"g5/spot": 3})
    assert not ledger.admits_type(make_type("g5.2xlarge"), "spot")
    assert ledger.admits_type(make_type("g6.xlarge"), "spot")
    assert ledger.blocking([make_type("g5.2xlarge")], "spot") == "g5/spot"


def _launched(at: datetime, instance_type: str = "g5.12xlarge", capacity_type: str = "on-demand") -> NodeClaim:
    return make_claim(state=ClaimState.REGISTERED, instance_id="i-0123", instance_type=instance_type,
                      capacity_type=capacity_type, zone="us-east-1a",
                      history=(StateTransition(state=ClaimState.LAUNCHED, at=at),))


def test_what_others_use_is_the_account_usage_less_our_instances_the_metric_already_shows() -> None:
    """The metric counts every instance of the account, ours too: ours launched long enough before its datapoint
    are taken out; ours launched since (or too shortly before to be counted yet) stay in both, over-counted."""
    reading = NOW - timedelta(minutes=1)
    old = _launched(reading - USAGE_METRIC_LAG - timedelta(minutes=1))
    recent = _launched(reading - timedelta(minutes=1))
    pending = make_claim()
    spot = _launched(reading - timedelta(hours=1), capacity_type="spot")
    usage = {"g/on-demand": UsageReading(112, reading), "g/spot": UsageReading(48, reading)}
    outside = vcpus_outside(usage, [old, recent, pending, spot], make_catalog())
    assert outside == {"g/on-demand": 64, "g/spot": 0}  # 112 - the old g5.12xlarge's 48; 48 - the Spot one's
    assert vcpus_outside({"g/on-demand": UsageReading(40, reading)}, [old], make_catalog()) == {"g/on-demand": 0}
    ledger = VcpuLedger({"g/on-demand": 192, "p/on-demand": 96}, outside)
    for claim in (old, recent, pending):
        ledger.charge(ledger.consumption([make_type("g5.12xlarge")], claim.capacity_type))
    assert ledger.left("g/on-demand") == 192 - 64 - 3 * 48  # 64 others', three of ours: over by 16 already
    assert ledger.left("p/on-demand") == 96


def source(client: FakeServiceQuotasClient | None, overrides: dict[str, int] | None = None) -> tuple[
        ServiceQuotasSource, FixedClock]:
    clock = FixedClock(NOW)
    return ServiceQuotasSource(client, overrides, clock=clock, ttl=timedelta(hours=1)), clock


def test_values_from_service_quotas_with_configuration_overrides_winning() -> None:
    client = FakeServiceQuotasClient({QUOTA_CODES["g/spot"]: 256.0, QUOTA_CODES["p/on-demand"]: 192.0})
    quotas, _ = source(client, {"p/on-demand": 96})
    assert quotas.vcpu_quotas() == {"g/spot": 256, "p/on-demand": 96}


def test_a_quota_with_no_applied_value_counts_at_its_aws_default() -> None:
    """GetServiceQuota: "If the applied quota value is not available for a quota, the quota is not retrieved"
    (NoSuchResourceException); GetAWSDefaultServiceQuota "Retrieves the default value for the specified quota".
    A quota with neither is not in the region: unknown, so not a bound."""
    client = FakeServiceQuotasClient({QUOTA_CODES["g/spot"]: 256.0},
                                     defaults={QUOTA_CODES["g/on-demand"]: 64.0, QUOTA_CODES["g/spot"]: 8.0})
    quotas, _ = source(client)
    assert quotas.vcpu_quotas() == {"g/spot": 256, "g/on-demand": 64}
    assert client.default_calls == len(QUOTA_CODES) - 1  # only where no applied value came back


def test_a_quota_answered_with_an_error_reason_and_no_value_is_a_failed_read(
        caplog: pytest.LogCaptureFixture) -> None:
    """`Value` is optional in a ServiceQuota: Service Quotas answers HTTP 200 with `ErrorReason`
    (DEPENDENCY_ACCESS_DENIED_ERROR, DEPENDENCY_THROTTLING_ERROR, ...) and no value when it could not read the
    quota from the service (hashicorp/terraform-provider-aws#19719)."""
    client = FakeServiceQuotasClient(dict.fromkeys(QUOTA_CODES.values(), 96.0),
                                     reasons={QUOTA_CODES["p/on-demand"]: "DEPENDENCY_THROTTLING_ERROR"})
    quotas, _ = source(client, {"g/spot": 64})
    with caplog.at_level(logging.WARNING):
        assert quotas.vcpu_quotas() == {"g/spot": 64}
    assert "DEPENDENCY_THROTTLING_ERROR" in caplog.text and QUOTA_CODES["p/on-demand"] in caplog.text


def test_answers_are_cached_for_the_ttl() -> None:
    client = FakeServiceQuotasClient({QUOTA_CODES["g/spot"]: 256.0})
    quotas, clock = source(client)
    quotas.vcpu_quotas()
    quotas.vcpu_quotas()
    assert client.calls == len(QUOTA_CODES)
    clock.advance(timedelta(hours=1))
    quotas.vcpu_quotas()
    assert client.calls == 2 * len(QUOTA_CODES)


@pytest.mark.parametrize("error", [
    ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "GetServiceQuota"),
    EndpointConnectionError(endpoint_url="https://servicequotas.example"),
])
def test_without_the_api_the_configuration_stands_alone_and_says_so_once(
        error: Exception, caplog: pytest.LogCaptureFixture) -> None:
    quotas, clock = source(FakeServiceQuotasClient({}, error=error), {"g/spot": 64})
    with caplog.at_level(logging.WARNING):
        assert quotas.vcpu_quotas() == {"g/spot": 64}
        clock.advance(timedelta(hours=2))
        assert quotas.vcpu_quotas() == {"g/spot": 64}
    warnings = [r for r in caplog.records if "Service Quotas" in r.getMessage()]
    assert len(warnings) == 1 and "g/spot=64" in warnings[0].getMessage()


THROTTLED = ClientError({"Error": {"Code": "TooManyRequestsException", "Message": "slow down"}}, "GetServiceQuota")


def test_a_failed_read_keeps_the_last_values_and_is_tried_again_a_minute_later(
        caplog: pytest.LogCaptureFixture) -> None:
    """One throttled call does not make every quota unlimited for the TTL: the values last read stand, said once."""
    client = FakeServiceQuotasClient(dict.fromkeys(QUOTA_CODES.values(), 96.0))
    quotas, clock = source(client)
    assert quotas.vcpu_quotas()["g/on-demand"] == 96
    clock.advance(timedelta(hours=1))
    client.error = THROTTLED
    with caplog.at_level(logging.INFO):
        assert quotas.vcpu_quotas() == dict.fromkeys(QUOTA_CODES, 96)
        clock.advance(timedelta(minutes=1))
        assert quotas.vcpu_quotas() == dict.fromkeys(QUOTA_CODES, 96)
        calls = client.calls
        assert quotas.vcpu_quotas() == dict.fromkeys(QUOTA_CODES, 96) and client.calls == calls  # not every call
        client.error = None
        client.values[QUOTA_CODES["g/on-demand"]] = 128.0
        clock.advance(timedelta(minutes=1))
        assert quotas.vcpu_quotas()["g/on-demand"] == 128
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "TooManyRequestsException" in warnings[0] and "g/on-demand=96" in warnings[0]
    assert "read at 2026-11-22 10:00:00 UTC" in warnings[0] and "again every 60 s" in warnings[0]
    assert any("Service Quotas answers again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_a_failed_first_read_is_tried_again_a_minute_later_not_an_hour() -> None:
    client = FakeServiceQuotasClient(dict.fromkeys(QUOTA_CODES.values(), 96.0), error=THROTTLED)
    quotas, clock = source(client, {"p/spot": 8})
    assert quotas.vcpu_quotas() == {"p/spot": 8}
    client.error = None
    clock.advance(timedelta(minutes=1))
    assert quotas.vcpu_quotas() == {**dict.fromkeys(QUOTA_CODES, 96), "p/spot": 8}


def test_no_client_means_configuration_only() -> None:
    quotas, _ = source(None, {"p/spot": 8})
    assert quotas.vcpu_quotas() == {"p/spot": 8}


def test_moto_has_no_ec2_quotas_so_the_configuration_is_used() -> None:
    import boto3
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("service-quotas", region_name="us-east-1")
        quotas = ServiceQuotasSource(client, {"g/on-demand": 32}, clock=FixedClock(NOW))
        assert quotas.vcpu_quotas() == {"g/on-demand": 32}


def usage_metric(cls: str) -> dict[str, Any]:
    """A quota's `UsageMetric` as GetServiceQuota answers it for the EC2 vCPU quotas."""
    return {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
            "MetricDimensions": {"Class": cls, "Resource": "vCPU", "Service": "EC2", "Type": "Resource"},
            "MetricStatisticRecommendation": "Maximum"}


def metric_query(i: int, cls: str) -> dict[str, Any]:
    return {"Id": f"q{i}", "ReturnData": True, "MetricStat": {
        "Metric": {"Namespace": "AWS/Usage", "MetricName": "ResourceCount",
                   "Dimensions": [{"Name": "Class", "Value": cls}, {"Name": "Resource", "Value": "vCPU"},
                                  {"Name": "Service", "Value": "EC2"}, {"Name": "Type", "Value": "Resource"}]},
        "Period": 60, "Stat": "Maximum"}}


def usage_source(values: dict[str, float]) -> tuple[ServiceQuotasSource, FixedClock, Stubber]:
    """Quotas g/on-demand and g/spot with their usage metrics (the others not in the region); CloudWatch stubbed."""
    import boto3

    client = FakeServiceQuotasClient(values, metrics={QUOTA_CODES["g/on-demand"]: usage_metric("G/OnDemand"),
                                                      QUOTA_CODES["g/spot"]: usage_metric("G/Spot")})
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1", aws_access_key_id="k",
                              aws_secret_access_key="s")  # noqa: S106 (a stubbed client)
    clock = FixedClock(NOW)
    return ServiceQuotasSource(client, cloudwatch_client=cloudwatch, clock=clock), clock, Stubber(cloudwatch)


def expect_usage(stub: Stubber, at: datetime, results: list[dict[str, Any]]) -> None:
    """A read at `at` (on a whole minute), over whole minutes up to the end of the current one."""
    end = at + timedelta(minutes=1)
    stub.add_response("get_metric_data", {"MetricDataResults": results}, {
        "MetricDataQueries": [metric_query(0, "G/OnDemand"), metric_query(1, "G/Spot")],
        "StartTime": end - USAGE_WINDOW, "EndTime": end, "ScanBy": "TimestampDescending"})


def test_usage_is_read_from_the_metric_each_quota_names_its_latest_datapoint_or_none() -> None:
    """GetServiceQuota's `UsageMetric` names the metric (dimensions as the answer gives them); the latest datapoint
    of the window is the usage; a metric with no datapoint in it has nothing running."""
    quotas, clock, stub = usage_source({QUOTA_CODES["g/on-demand"]: 96.0, QUOTA_CODES["g/spot"]: 64.0})
    datapoint = NOW - timedelta(minutes=2)
    expect_usage(stub, NOW, [
        {"Id": "q0", "Timestamps": [datapoint, datapoint - timedelta(minutes=1)], "Values": [64.0, 72.0],
         "StatusCode": "Complete"},
        {"Id": "q1", "Timestamps": [], "Values": [], "StatusCode": "Complete"}])
    with stub:
        assert quotas.vcpu_usage() == {"g/on-demand": UsageReading(64, datapoint), "g/spot": UsageReading(0, NOW)}
        clock.advance(timedelta(seconds=30))
        quotas.vcpu_usage()  # cached: no second call (the stub would refuse it)
        stub.assert_no_pending_responses()


def test_a_failed_usage_read_keeps_the_last_values_tries_again_a_minute_later_and_says_so_once(
        caplog: pytest.LogCaptureFixture) -> None:
    quotas, clock, stub = usage_source({QUOTA_CODES["g/on-demand"]: 96.0, QUOTA_CODES["g/spot"]: 64.0})
    datapoint = NOW - timedelta(minutes=1)
    expect_usage(stub, NOW, [{"Id": "q0", "Timestamps": [datapoint], "Values": [32.0], "StatusCode": "Complete"}])
    for _ in range(2):
        stub.add_client_error("get_metric_data", "Throttling", "Rate exceeded")
    later = NOW + timedelta(minutes=3)
    expect_usage(stub, later, [{"Id": "q0", "Timestamps": [later], "Values": [48.0], "StatusCode": "Complete"}])
    with stub, caplog.at_level(logging.INFO):
        assert quotas.vcpu_usage()["g/on-demand"] == UsageReading(32, datapoint)
        for _ in range(2):
            clock.advance(timedelta(minutes=1))
            assert quotas.vcpu_usage()["g/on-demand"] == UsageReading(32, datapoint)
            assert quotas.vcpu_usage()["g/on-demand"].vcpus == 32  # not asked again within the minute
        clock.advance(timedelta(minutes=1))
        assert quotas.vcpu_usage()["g/on-demand"] == UsageReading(48, later)
        stub.assert_no_pending_responses()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Throttling" in warnings[0] and "g/on-demand=32" in warnings[0]
    assert any("usage metrics answer again" in r.getMessage() for r in caplog.records)


def test_without_a_usage_metric_or_a_cloudwatch_client_no_usage_is_counted() -> None:
    client = FakeServiceQuotasClient({QUOTA_CODES["g/on-demand"]: 96.0})
    assert ServiceQuotasSource(client, clock=FixedClock(NOW)).vcpu_usage() == {}
    assert ServiceQuotasSource(None, {"g/on-demand": 96}, clock=FixedClock(NOW)).vcpu_usage() == {}


def test_a_quota_the_configuration_alone_sets_has_its_usage_read_from_the_documented_metric() -> None:
    """`vcpuQuotas` is what doctor proposes where Service Quotas cannot be read (no permission, a region without
    it): the quota is then the configuration's, and its usage is still the account's, read from the metric AWS
    documents for its class (the one GetServiceQuota names when it answers). Without it, every other workload's
    vCPUs went uncounted again in exactly the accounts that set quotas by hand."""
    import boto3

    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1", aws_access_key_id="k",
                              aws_secret_access_key="s")  # noqa: S106 (a stubbed client)
    stub = Stubber(cloudwatch)
    quotas = ServiceQuotasSource(None, {"g/on-demand": 96, "p4d/on-demand": 96}, cloudwatch_client=cloudwatch,
                                 clock=FixedClock(NOW))
    datapoint = NOW - timedelta(minutes=1)
    end = NOW + timedelta(minutes=1)
    stub.add_response("get_metric_data", {"MetricDataResults": [
        {"Id": "q0", "Timestamps": [datapoint], "Values": [64.0], "StatusCode": "Complete"}]}, {
        "MetricDataQueries": [metric_query(0, "G/OnDemand")],
        "StartTime": end - USAGE_WINDOW, "EndTime": end, "ScanBy": "TimestampDescending"})
    with stub:
        assert quotas.vcpu_usage() == {"g/on-demand": UsageReading(64, datapoint)}  # a family key has no metric
        stub.assert_no_pending_responses()

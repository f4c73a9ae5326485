"""vCPU quotas from Service Quotas, cached, with the configuration's `vcpuQuotas` as override and fallback.

GPU instances count against five EC2 quotas (`QUOTA_CODES`: On-Demand G/VT and P; Spot G/VT, P2-P4 and P5). They change
rarely and the API is slow and throttled, so answers are kept for `ttl`. A quota is its applied value, or where
GetServiceQuota has none ("If the applied quota value is not available for a quota, the quota is not retrieved"),
its AWS default (GetAWSDefaultServiceQuota). A read that fails (throttled, no permission, a region without the
API, moto, which has no EC2 quotas) is tried again a minute later, not a TTL later: meanwhile the values of the
last read stand (a quota not read counts as no bound, so dropping them would lift every limit), or where none
succeeded yet the configuration's values alone; that is logged once per outage, and its end too. Configuration
values always win: they exist to override.

The account's use of each quota comes from the CloudWatch metric its answer names (`Quota.UsageMetric`, a
MetricInfo: "Information about the CloudWatch metric that reflects quota usage" — for these five `AWS/Usage`
`ResourceCount` with dimensions Service EC2, Type Resource, Resource vCPU and Class `G/OnDemand`, `P/OnDemand`,
`G/Spot`, `P/Spot`, `P5/Spot`; MetricStatisticRecommendation "The metric statistic that we recommend you use when
determining quota usage", `Maximum`), read with GetMetricData at a 60-second period ("Service quota usage metrics
are in the AWS/Usage namespace and are collected every minute", CloudWatch User Guide, "AWS usage metrics"): the
latest datapoint of the last `USAGE_WINDOW`, up to the end of the current minute (a window on whole minutes: "specify
StartTime and EndTime values that align with the value of the metric's Period", GetMetricData). A class with no
datapoint there has nothing running (usage 0). Usage moves with every launch, so it is kept `USAGE_TTL` only; a
failed read is handled as a failed quota read (last values kept, tried again a minute later, logged once per
outage). A quota whose answer names no metric has no usage: none is counted. A quota the configuration sets
(`vcpuQuotas`, what doctor proposes where Service Quotas cannot be read) is still the account's: its usage is read
from the metric documented for its class (`DOCUMENTED_USAGE_METRICS`) where no answer named one.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.domain.packing.quotas import QUOTA_CODES
from gpu_autoscaler.models.quotas import UsageReading

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from gpu_autoscaler.clock import Clock

__all__ = ["DEFAULT_QUOTA_TTL", "DOCUMENTED_USAGE_METRICS", "RETRY_AFTER_FAILURE", "USAGE_TTL", "USAGE_WINDOW",
           "ServiceQuotasSource"]

logger = logging.getLogger(__name__)

DEFAULT_QUOTA_TTL = timedelta(hours=1)
RETRY_AFTER_FAILURE = timedelta(minutes=1)
"""How soon a failed read is tried again: a throttle (Service Quotas allows GetServiceQuota 5 requests a second
per account) passes in seconds, and each packing round until then plans on older values."""
USAGE_TTL = timedelta(minutes=1)
"""How long a usage read stands: the metric's own period."""
USAGE_WINDOW = timedelta(minutes=15)
"""How far back a usage read looks for a metric's latest datapoint."""
_PERIOD = 60
DOCUMENTED_USAGE_METRICS: dict[str, dict[str, Any]] = {
    key: {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount", "MetricStatisticRecommendation": "Maximum",
          "MetricDimensions": {"Class": cls, "Resource": "vCPU", "Service": "EC2", "Type": "Resource"}}
    for key, cls in (("g/on-demand", "G/OnDemand"), ("p/on-demand", "P/OnDemand"), ("g/spot", "G/Spot"),
                     ("p/spot", "P/Spot"), ("p5/spot", "P5/Spot"))
}
"""The usage metric of each quota key (`QUOTA_CODES`), as GetServiceQuota names it (`UsageMetric`), for a quota the
configuration alone sets: family keys (`p4d/on-demand`) have none."""
_MISSING = "NoSuchResourceException"
"""GetServiceQuota: no applied value (the default is asked); GetAWSDefaultServiceQuota: a quota the region does
not have (that one is unknown, the others still count)."""
_UNAVAILABLE = (ClientError, BotoCoreError, NotImplementedError)
"""How a failed read shows itself: AWS errors, and moto in-process, which raises NotImplementedError for
GetAWSDefaultServiceQuota (the emulator answers it `UnknownOperationException`)."""


class _QuotaUnreadable(Exception):
    """Service Quotas answered a quota without its value: `ErrorReason` instead (`Value` is optional in a
    ServiceQuota; the API answers HTTP 200 with DEPENDENCY_ACCESS_DENIED_ERROR, DEPENDENCY_THROTTLING_ERROR,
    DEPENDENCY_SERVICE_ERROR or SERVICE_QUOTA_NOT_AVAILABLE_ERROR when it could not read the quota)."""


class _Quota(NamedTuple):
    value: int
    metric: Mapping[str, Any] | None
    """Its `UsageMetric` (MetricInfo), where the answer names one."""


class ServiceQuotasSource:
    """`QuotaSource`: Service Quotas (`ec2`) values by `<group>/<capacity type>`, overridden by configuration, and
    the account's usage of them from CloudWatch."""

    def __init__(
        self,
        service_quotas_client: Any | None,
        overrides: Mapping[str, int] | None = None,
        *,
        cloudwatch_client: Any | None = None,
        clock: Clock | None = None,
        ttl: timedelta = DEFAULT_QUOTA_TTL,
        codes: Mapping[str, str] = QUOTA_CODES,
    ) -> None:
        self._client = service_quotas_client
        self._cloudwatch = cloudwatch_client
        self._overrides = dict(overrides or {})
        self._clock = clock or SystemClock()
        self._ttl = ttl
        self._codes = dict(codes)
        self._values: dict[str, int] = {}
        """The quotas in force: the last read that did not fail."""
        self._read_at: datetime | None = None
        self._next_read: datetime | None = None
        self._failing = False
        self._warned_none = False
        self._metrics: dict[str, Mapping[str, Any]] = {}
        """Each quota's usage metric, from the same read as `_values`."""
        self._usage: dict[str, UsageReading] = {}
        """The usage in force: the last read that did not fail."""
        self._next_usage_read: datetime | None = None
        self._usage_failing = False

    def vcpu_quotas(self) -> dict[str, int]:
        now = self._clock.now()
        if self._next_read is None or now >= self._next_read:
            self._refresh(now)
        return {**self._values, **self._overrides}

    def vcpu_usage(self) -> dict[str, UsageReading]:
        self.vcpu_quotas()  # the metrics are named by the quotas' answers
        now = self._clock.now()
        if self._next_usage_read is None or now >= self._next_usage_read:
            self._refresh_usage(now)
        return dict(self._usage)

    def _refresh_usage(self, now: datetime) -> None:
        documented = {k: DOCUMENTED_USAGE_METRICS[k] for k in self._overrides if k in DOCUMENTED_USAGE_METRICS}
        metrics = {**documented, **self._metrics}
        if self._cloudwatch is None or not metrics:
            self._usage, self._next_usage_read = {}, now + USAGE_TTL
            return
        try:
            found = self._read_usage(self._cloudwatch, metrics, now)
        except _UNAVAILABLE as error:
            self._next_usage_read = now + RETRY_AFTER_FAILURE
            if not self._usage_failing:
                self._usage_failing = True
                kept = f"keeping the last read ({_listed_usage(self._usage)})" if self._usage else "none counted"
                logger.warning("CloudWatch usage metrics unavailable (%s: %s): vCPU usage %s; trying again every "
                               "%.0f s until it answers", type(error).__name__, error, kept,
                               RETRY_AFTER_FAILURE.total_seconds())
            return
        if self._usage_failing:
            logger.info("CloudWatch usage metrics answer again: vCPU usage %s", _listed_usage(found))
        self._usage, self._next_usage_read, self._usage_failing = found, now + USAGE_TTL, False

    @staticmethod
    def _read_usage(cloudwatch: Any, metrics: Mapping[str, Mapping[str, Any]], now: datetime,
                    ) -> dict[str, UsageReading]:
        """One GetMetricData for every quota's metric: each one's latest datapoint in the window, or 0."""
        keys = sorted(metrics)
        queries = [{
            "Id": f"q{i}",
            "MetricStat": {
                "Metric": {"Namespace": metrics[key]["MetricNamespace"], "MetricName": metrics[key]["MetricName"],
                           "Dimensions": [{"Name": k, "Value": v}
                                          for k, v in sorted(metrics[key].get("MetricDimensions", {}).items())]},
                "Period": _PERIOD,
                "Stat": metrics[key].get("MetricStatisticRecommendation") or "Maximum",
            },
            "ReturnData": True,
        } for i, key in enumerate(keys)]
        latest: dict[str, tuple[datetime, float]] = {}
        end = now.replace(second=0, microsecond=0) + timedelta(seconds=_PERIOD)  # the current minute's period too
        request: dict[str, Any] = {"MetricDataQueries": queries, "StartTime": end - USAGE_WINDOW, "EndTime": end,
                                   "ScanBy": "TimestampDescending"}
        while True:
            answer = cloudwatch.get_metric_data(**request)
            for result in answer.get("MetricDataResults", []):
                key = keys[int(result["Id"][1:])]
                for at, value in zip(result.get("Timestamps", []), result.get("Values", []), strict=False):
                    if key not in latest or at > latest[key][0]:
                        latest[key] = (at, value)
            if not answer.get("NextToken"):
                break
            request["NextToken"] = answer["NextToken"]
        return {key: UsageReading(int(latest[key][1]), latest[key][0]) if key in latest else UsageReading(0, now)
                for key in keys}

    def _refresh(self, now: datetime) -> None:
        if self._client is None:
            self._next_read = now + self._ttl
            return
        found: dict[str, int] = {}
        metrics: dict[str, Mapping[str, Any]] = {}
        try:
            for key, code in self._codes.items():
                quota = self._read(self._client, code)
                if quota is not None:
                    found[key] = quota.value
                    if quota.metric:
                        metrics[key] = quota.metric
        except (*_UNAVAILABLE, _QuotaUnreadable) as error:
            self._next_read = now + RETRY_AFTER_FAILURE
            self._failed(error)
            return
        if self._failing:
            logger.info("Service Quotas answers again: vCPU quotas %s", _listed(found))
        self._values, self._read_at, self._next_read, self._failing = found, now, now + self._ttl, False
        self._metrics = metrics
        if not found and not self._warned_none:
            self._warned_none = True
            logger.warning("Service Quotas has none of the EC2 GPU vCPU quotas: vCPU quotas come from the "
                           "configuration's vcpuQuotas only (%s)", _listed(self._overrides) or "none set: unlimited")

    @staticmethod
    def _read(client: Any, code: str) -> _Quota | None:
        """The quota's applied value, else its AWS default, with its usage metric; None for a quota the region does
        not have."""
        try:
            answer = client.get_service_quota(ServiceCode="ec2", QuotaCode=code)
        except ClientError as error:
            if _error_code(error) != _MISSING:
                raise
            try:
                answer = client.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)
            except ClientError as default_error:
                if _error_code(default_error) == _MISSING:
                    return None
                raise
        quota = answer["Quota"]
        if "Value" not in quota or quota.get("ErrorReason"):
            reason = quota.get("ErrorReason") or {}
            raise _QuotaUnreadable(f"{code}: {reason.get('ErrorCode', 'no value')} "
                                  f"({reason.get('ErrorMessage', 'no ErrorReason')})")
        metric = quota.get("UsageMetric")
        return _Quota(int(quota["Value"]), metric if metric and metric.get("MetricName") else None)

    def _failed(self, error: Exception) -> None:
        if self._failing:
            return
        self._failing = True
        why = f"Service Quotas unavailable ({type(error).__name__}: {error})"
        again = f"trying again every {RETRY_AFTER_FAILURE.total_seconds():.0f} s until it answers"
        if self._read_at is None or not self._values:
            logger.warning("%s: vCPU quotas come from the configuration's vcpuQuotas only (%s); %s",
                           why, _listed(self._overrides) or "none set: unlimited", again)
            return
        over = f", the configuration's vcpuQuotas over them ({_listed(self._overrides)})" if self._overrides else ""
        logger.warning("%s: keeping the vCPU quotas read at %s (%s)%s; %s",
                       why, f"{self._read_at:%Y-%m-%d %H:%M:%S %Z}", _listed(self._values), over, again)


def _listed(quotas: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(quotas.items()))


def _listed_usage(usage: Mapping[str, UsageReading]) -> str:
    return ", ".join(f"{k}={r.vcpus}" for k, r in sorted(usage.items())) or "none"


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))

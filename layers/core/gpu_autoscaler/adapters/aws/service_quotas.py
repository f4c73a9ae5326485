"""vCPU quotas from Service Quotas, cached, with the configuration's `vcpuQuotas` as override and fallback.

GPU instances count against five EC2 quotas (`QUOTA_CODES`: On-Demand G/VT and P; Spot G/VT, P2-P4 and P5). They change
rarely and the API is slow and throttled, so answers are kept for `ttl`. A quota is its applied value, or where
GetServiceQuota has none ("If the applied quota value is not available for a quota, the quota is not retrieved"),
its AWS default (GetAWSDefaultServiceQuota). A read that fails (throttled, no permission, a region without the
API, moto, which has no EC2 quotas) is tried again a minute later, not a TTL later: meanwhile the values of the
last read stand (a quota not read counts as no bound, so dropping them would lift every limit), or where none
succeeded yet the configuration's values alone; that is logged once per outage, and its end too. Configuration
values always win: they exist to override.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.domain.packing.quotas import QUOTA_CODES

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from gpu_autoscaler.clock import Clock

__all__ = ["DEFAULT_QUOTA_TTL", "RETRY_AFTER_FAILURE", "ServiceQuotasSource"]

logger = logging.getLogger(__name__)

DEFAULT_QUOTA_TTL = timedelta(hours=1)
RETRY_AFTER_FAILURE = timedelta(minutes=1)
"""How soon a failed read is tried again: a throttle (Service Quotas allows GetServiceQuota 5 requests a second
per account) passes in seconds, and each packing round until then plans on older values."""
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


class ServiceQuotasSource:
    """`QuotaSource`: Service Quotas (`ec2`) values by `<group>/<capacity type>`, overridden by configuration."""

    def __init__(
        self,
        service_quotas_client: Any | None,
        overrides: Mapping[str, int] | None = None,
        *,
        clock: Clock | None = None,
        ttl: timedelta = DEFAULT_QUOTA_TTL,
        codes: Mapping[str, str] = QUOTA_CODES,
    ) -> None:
        self._client = service_quotas_client
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

    def vcpu_quotas(self) -> dict[str, int]:
        now = self._clock.now()
        if self._next_read is None or now >= self._next_read:
            self._refresh(now)
        return {**self._values, **self._overrides}

    def _refresh(self, now: datetime) -> None:
        if self._client is None:
            self._next_read = now + self._ttl
            return
        found: dict[str, int] = {}
        try:
            for key, code in self._codes.items():
                value = self._read(self._client, code)
                if value is not None:
                    found[key] = value
        except (*_UNAVAILABLE, _QuotaUnreadable) as error:
            self._next_read = now + RETRY_AFTER_FAILURE
            self._failed(error)
            return
        if self._failing:
            logger.info("Service Quotas answers again: vCPU quotas %s", _listed(found))
        self._values, self._read_at, self._next_read, self._failing = found, now, now + self._ttl, False
        if not found and not self._warned_none:
            self._warned_none = True
            logger.warning("Service Quotas has none of the EC2 GPU vCPU quotas: vCPU quotas come from the "
                           "configuration's vcpuQuotas only (%s)", _listed(self._overrides) or "none set: unlimited")

    @staticmethod
    def _read(client: Any, code: str) -> int | None:
        """The quota's applied value, else its AWS default; None for a quota the region does not have."""
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
        return int(quota["Value"])

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


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))

"""vCPU quotas from Service Quotas, cached, with the configuration's `vcpuQuotas` as override and fallback.

GPU instances count against five EC2 quotas (`QUOTA_CODES`: On-Demand G/VT and P; Spot G/VT, P2-P4 and P5). They change
rarely and the API is slow and throttled, so answers are kept for `ttl`. A quota is its applied value, or where
GetServiceQuota has none ("If the applied quota value is not available for a quota, the quota is not retrieved"),
its AWS default (GetAWSDefaultServiceQuota). Where the API does not answer (no permission, a region without it,
moto, which has no EC2 quotas), the configuration's values stand alone, and that is logged once. Configuration
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

__all__ = ["DEFAULT_QUOTA_TTL", "ServiceQuotasSource"]

logger = logging.getLogger(__name__)

DEFAULT_QUOTA_TTL = timedelta(hours=1)
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
        self._cached: tuple[datetime, dict[str, int]] | None = None
        self._warned = False

    def vcpu_quotas(self) -> dict[str, int]:
        now = self._clock.now()
        if self._cached is None or now - self._cached[0] >= self._ttl:
            self._cached = (now, self._fetch())
        return {**self._cached[1], **self._overrides}

    def _fetch(self) -> dict[str, int]:
        if self._client is None:
            return {}
        found: dict[str, int] = {}
        for key, code in self._codes.items():
            try:
                value = self._read(self._client, code)
            except (*_UNAVAILABLE, _QuotaUnreadable) as error:
                self._fallback(error)
                return {}
            if value is not None:
                found[key] = value
        if not found:
            self._fallback(None)
        return found

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

    def _fallback(self, error: Exception | None) -> None:
        if self._warned:
            return
        self._warned = True
        why = f"unavailable ({type(error).__name__}: {error})" if error else "has none of the EC2 GPU vCPU quotas"
        logger.warning(
            "Service Quotas %s: vCPU quotas come from the configuration's vcpuQuotas only (%s)",
            why, ", ".join(f"{k}={v}" for k, v in sorted(self._overrides.items())) or "none set: unlimited",
        )


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))

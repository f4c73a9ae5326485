"""vCPU quotas from Service Quotas, cached, with the configuration's `vcpuQuotas` as override and fallback.

GPU instances count against five EC2 quotas (`QUOTA_CODES`: On-Demand G/VT and P; Spot G/VT, P2-P4 and P5). They change
rarely and the API is slow and throttled, so answers are kept for `ttl`. Where the API does not answer
(no permission, a region without it, moto, which has no EC2 quotas), the configuration's values stand
alone, and that is logged once. Configuration values always win: they exist to override.
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
_MISSING = ("NoSuchResourceException",)
"""A quota the account or region does not have: that one is unknown, the others still count."""


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
                answer = self._client.get_service_quota(ServiceCode="ec2", QuotaCode=code)
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") in _MISSING:
                    continue
                self._fallback(error)
                return {}
            except BotoCoreError as error:
                self._fallback(error)
                return {}
            found[key] = int(answer["Quota"]["Value"])
        if not found:
            self._fallback(None)
        return found

    def _fallback(self, error: Exception | None) -> None:
        if self._warned:
            return
        self._warned = True
        why = f"unavailable ({type(error).__name__}: {error})" if error else "has none of the EC2 GPU vCPU quotas"
        logger.warning(
            "Service Quotas %s: vCPU quotas come from the configuration's vcpuQuotas only (%s)",
            why, ", ".join(f"{k}={v}" for k, v in sorted(self._overrides.items())) or "none set: unlimited",
        )

"""boto3 clients, made on demand so a test or the emulator can point them anywhere first.

boto3 honours `AWS_ENDPOINT_URL`, which the emulator sets for every handler it drives; an
explicit `endpoint_url` (the CLI's `--endpoint-url`) wins over it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config as BotoConfig

if TYPE_CHECKING:
    from boto3.session import Session

__all__ = ["AwsClients", "worst_call_seconds"]

CONNECT_TIMEOUT = 3
READ_TIMEOUT = 10
"""Seconds without a byte before an attempt is given up; CreateFleet (`instant`) answers when its instances are
launched, in a few seconds, and a retry carries the same ClientToken, so EC2 answers it with the same fleet."""
MAX_ATTEMPTS = 3
_MAX_BACKOFF = 20
"""botocore's standard retry mode: attempt n waits up to min(2^(n-1), 20) s before it (`retries/standard.py`)."""

_RETRIES = BotoConfig(retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS}, connect_timeout=CONNECT_TIMEOUT,
                      read_timeout=READ_TIMEOUT)


def worst_call_seconds() -> float:
    """The longest one call can take when the endpoint stalls: every attempt timing out, and the backoffs between.
    A function's records are started only while this much of the invocation is left
    (`batch_failures.RECORD_RESERVE_SECONDS`)."""
    backoffs = sum(min(2 ** (attempt - 1), _MAX_BACKOFF) for attempt in range(1, MAX_ATTEMPTS))
    return float(MAX_ATTEMPTS * (CONNECT_TIMEOUT + READ_TIMEOUT) + backoffs)


class AwsClients:
    """One session, one client per service, all against the same endpoint and region."""

    def __init__(self, region: str, endpoint_url: str | None = None, session: Session | None = None) -> None:
        self.region = region
        self.endpoint_url = endpoint_url
        self._session = session or boto3.session.Session(region_name=region)
        self._clients: dict[str, Any] = {}

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self._session.client(
                service,  # type: ignore[call-overload]  # any service name: the stubs list literals only
                region_name=self.region, endpoint_url=self.endpoint_url, config=_RETRIES,
            )
        return self._clients[service]

    def aws_endpoint_client(self, service: str) -> Any:
        """A client of the service's own AWS endpoint for the region, whatever endpoint the others are pointed at
        (`endpoint_url`, `AWS_ENDPOINT_URL`): for a request signed here and sent by someone else. An EKS token is
        one: EKS replays it against STS and refuses any host but STS's own (`adapters.aws.eks_token`)."""
        return self._session.client(
            service,  # type: ignore[call-overload]  # any service name: the stubs list literals only
            region_name=self.region,
            config=_RETRIES.merge(BotoConfig(ignore_configured_endpoint_urls=True)),  # type: ignore[call-arg]
        )  # botocore has taken `ignore_configured_endpoint_urls` since 1.31; its type stubs do not list it

    def for_region(self, region: str) -> AwsClients:
        """Clients of another region on the same session and endpoint (the Price List API is served from a few
        regions, `pricing.pricing_endpoint`)."""
        return AwsClients(region, self.endpoint_url, self._session)

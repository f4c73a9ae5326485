"""EKS authentication for the Kubernetes API: bearer tokens from a presigned STS GetCallerIdentity.

EKS (aws-iam-authenticator) accepts `k8s-aws-v1.` + base64url (unpadded) of a presigned
`GET sts…/?Action=GetCallerIdentity&Version=2011-06-15&X-Amz-…` URL whose signature covers the header
`x-k8s-aws-id: <cluster name>`; the server replays the URL with that header to learn who we are. This is
what `aws eks get-token` prints. The URL is signed for 60 seconds, but EKS accepts a token for 15 minutes
from its signing time, so a token is cached and replaced after 14 (as `aws eks get-token` advertises).

`eks_api_client` builds the functions' small client (`adapters.kubernetes.rest`) for the configured cluster:
endpoint and CA from the configuration, or from EKS DescribeCluster when the configuration leaves the CA out,
and the cached token asked for before every request, so an expired one is replaced. The token's URL names STS's
regional endpoint (`https://sts.<region>.amazonaws.com`), whatever endpoint the other AWS clients use: EKS replays
it against STS and refuses any other host (aws-iam-authenticator, pkg/token/token.go `verifyHost`).
"""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.kubernetes.rest import FUNCTION_TIMEOUT, KubernetesRest, pem_from_base64
from gpu_autoscaler.clock import SystemClock

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config

__all__ = [
    "CLUSTER_ID_HEADER",
    "TOKEN_LIFETIME",
    "TOKEN_PREFIX",
    "ClusterAccess",
    "EksTokenSource",
    "cluster_access",
    "eks_api_client",
    "presigned_identity_url",
]

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
URL_EXPIRES_SECONDS = 60
TOKEN_LIFETIME = timedelta(minutes=14)
"""A cached token is replaced this long after it was made: a minute inside what EKS accepts."""

_HANDLER_ID = "gpu-autoscaler-x-k8s-aws-id"


def _stash_cluster_id(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    """GetCallerIdentity takes no such parameter: move it out of the params before validation."""
    if CLUSTER_ID_HEADER in params:
        context[CLUSTER_ID_HEADER] = params.pop(CLUSTER_ID_HEADER)


def _sign_cluster_id(request: Any, **_: Any) -> None:
    """…and into the request's headers just before signing, so the signature covers it."""
    if CLUSTER_ID_HEADER in request.context:
        request.headers[CLUSTER_ID_HEADER] = request.context[CLUSTER_ID_HEADER]


def presigned_identity_url(sts: Any, cluster_name: str, expires_in: int = URL_EXPIRES_SECONDS) -> str:
    """A GetCallerIdentity URL presigned with `x-k8s-aws-id: <cluster_name>` among its signed headers."""
    events = sts.meta.events
    events.register("provide-client-params.sts.GetCallerIdentity", _stash_cluster_id, unique_id=_HANDLER_ID)
    events.register("before-sign.sts.GetCallerIdentity", _sign_cluster_id, unique_id=_HANDLER_ID + "-sign")
    url: str = sts.generate_presigned_url(
        "get_caller_identity", Params={CLUSTER_ID_HEADER: cluster_name}, ExpiresIn=expires_in, HttpMethod="GET"
    )
    return url


def token_for_url(url: str) -> str:
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


class EksTokenSource:
    """A cached EKS token for one cluster, made anew once it is `lifetime` old. Thread-safe."""

    def __init__(self, sts: Any, cluster_name: str, clock: Clock | None = None,
                 lifetime: timedelta = TOKEN_LIFETIME) -> None:
        self._sts = sts
        self._cluster = cluster_name
        self._clock = clock or SystemClock()
        self._lifetime = lifetime
        self._lock = threading.Lock()
        self._token: str | None = None
        self._made_at: datetime | None = None

    def token(self) -> str:
        with self._lock:
            now = self._clock.now()
            if self._token is None or self._made_at is None or now - self._made_at >= self._lifetime:
                self._token = token_for_url(presigned_identity_url(self._sts, self._cluster))
                self._made_at = now
            return self._token

    def authorization(self) -> str:
        """The `Authorization` header's value, for `KubernetesRest`: asked before every request."""
        return f"Bearer {self.token()}"


@dataclass(frozen=True)
class ClusterAccess:
    endpoint: str
    certificate_authority: str | None
    """Base64 of the PEM bundle, as EKS and kubeconfig files carry it; None for a plain-HTTP endpoint."""


def cluster_access(config: Config, eks: Any | None = None) -> ClusterAccess:
    """The configured endpoint and CA; DescribeCluster fills in what the configuration leaves out."""
    access = config.kubernetes
    if access.certificate_authority or access.endpoint.startswith("http://") or eks is None:
        return ClusterAccess(access.endpoint, access.certificate_authority)
    cluster = eks.describe_cluster(name=config.cluster_name)["cluster"]
    return ClusterAccess(cluster.get("endpoint") or access.endpoint,
                         (cluster.get("certificateAuthority") or {}).get("data"))


def eks_api_client(config: Config, clients: AwsClients, clock: Clock | None = None,
                   *, access: ClusterAccess | None = None) -> KubernetesRest:
    """A client for the cluster, authenticated with a self-refreshing EKS token, trusting only its CA."""
    if access is None:
        eks = None if config.kubernetes.certificate_authority else clients.client("eks")
        access = cluster_access(config, eks)
    source = EksTokenSource(clients.aws_endpoint_client("sts"), config.cluster_name, clock)
    ca = pem_from_base64(access.certificate_authority) if access.certificate_authority else None
    return KubernetesRest(access.endpoint, authorization=source.authorization, ca_pem=ca, timeout=FUNCTION_TIMEOUT)

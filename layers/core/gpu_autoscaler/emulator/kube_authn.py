"""Who a request to the local Kubernetes API server is: its bearer token, verified as EKS verifies it.

A request carries one of:

- the server's admin token (`LocalKubernetes.token`, in the kubeconfig it writes): user `kubernetes-admin` in
  `system:masters`, as the cluster creator's identity on EKS and kubeadm's admin.conf. Tests setting up objects
  and the emulator's own actors use it; its kubelets, scheduler and controllers call the store in-process, as a
  real control plane's components carry their own permissions;
- a ServiceAccount token the server issued (`issue_service_account_token`, the TokenRequest API a projected
  token comes from): `system:serviceaccount:<namespace>:<name>` in `system:serviceaccounts`,
  `system:serviceaccounts:<namespace>` and `system:authenticated` (kubernetes.io, "Authenticating", "Service
  account tokens");
- a static token (`issue_static_token`, as kube-apiserver's `--token-auth-file` lists one: a token, a user and
  its groups; kubernetes.io, "Authenticating", "Static token file"), for a test that acts as a given group
  without an AWS account behind it;
- an EKS token (`k8s-aws-v1.` …), verified by the rules of aws-iam-authenticator's `Verify` (pkg/token/token.go):
  at most 4 KiB; the prefix; unpadded base64url of an `https` URL whose host is an STS endpoint of the cluster's
  partition (`sts.amazonaws.com`, `sts[-fips].<region>.<partition domain or its dual-stack domain>`,
  pkg/endpoints/partitions.go), path `/`, only the whitelisted query parameters, once each; Action
  GetCallerIdentity; `x-k8s-aws-id` among the signed headers; X-Amz-Expires an integer in 0..900; X-Amz-Date
  within the last 15 minutes. The URL is then replayed, as the authenticator replays it, with this cluster's name
  in `x-k8s-aws-id`, against the emulated STS (`sts_endpoint`: the emulator's AWS, where the STS host names
  resolve here; `emulator.strict.sts` checks the signature as STS does, so a token signed for another cluster or
  with unknown keys fails). The caller's ARN is canonicalized (an assumed role's to its role's IAM ARN,
  pkg/arn/arn.go `Canonicalize`) and mapped through the cluster's access entries (`strict.eks_access_entries`):
  the entry's username (its `{{SessionName}}` filled in) and groups, plus `system:authenticated`.

A request with no token is `system:anonymous` in `system:unauthenticated`, which RBAC then refuses almost
everything. A token that is present and not valid is answered 401 Unauthorized, as the API server answers a
failed authentication; the reason is logged (the API server does not tell the client). What it does not do:
ServiceAccount tokens are opaque (not JWTs) and do not expire; an access entry's role is matched by ARN, not by
the role's unique id (EKS would refuse a role deleted and made again under the same ARN); the `aws-auth`
ConfigMap is not read; a role ARN with a path is matched as the entry names it.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import secrets
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

from gpu_autoscaler.emulator.kube_objects import ApiError
from gpu_autoscaler.emulator.strict.eks_access_entries import access_entry

if TYPE_CHECKING:
    from gpu_autoscaler.clock import Clock

__all__ = ["ADMIN", "ANONYMOUS", "Authenticator", "UserInfo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UserInfo:
    """The authenticated user as the authorizer sees it (kubernetes.io, "Authenticating", "Users in Kubernetes")."""

    name: str
    groups: tuple[str, ...]


ADMIN = UserInfo("kubernetes-admin", ("system:masters", "system:authenticated"))
ANONYMOUS = UserInfo("system:anonymous", ("system:unauthenticated",))

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
MAX_TOKEN_BYTES = 4 * 1024
PRESIGNED_URL_VALIDITY = timedelta(minutes=15)
"""token.go `presignedURLExpiration`: STS accepts a presigned URL for 15 minutes after X-Amz-Date, whatever
X-Amz-Expires says; the authenticator refuses it after that too."""
_PARAMETERS = frozenset({"action", "version", "x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-expires",
                         "x-amz-security-token", "x-amz-signature", "x-amz-signedheaders"})
"""token.go `parameterWhitelist`."""
_PARTITION_DOMAINS = {"aws": ("amazonaws.com", "api.aws"), "aws-cn": ("amazonaws.com.cn",
                                                                     "api.amazonwebservices.com.cn"),
                      "aws-us-gov": ("amazonaws.com", "api.aws")}
"""pkg/endpoints/partitions.go: STS's domain and dual-stack domain of the partitions a cluster may be in here."""
_REGION = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$")
"""token.go `validateInputRegion`."""
_REPLAY_TIMEOUT = 10.0
"""token.go `NewVerifier`: the STS client's timeout."""


class Authenticator:
    def __init__(self, cluster_name: str, clock: Clock, admin_token: str, *, partition: str = "aws",
                 sts_endpoint: str | None = None) -> None:
        """`sts_endpoint`: the emulated STS (the embedded AWS's URL) the presigned URLs are replayed against;
        None: no STS is reachable, and every EKS token fails as on a cluster that cannot reach STS."""
        if partition not in _PARTITION_DOMAINS:
            raise ValueError(f"partition must be one of {', '.join(_PARTITION_DOMAINS)}, not {partition!r}")
        self.cluster_name = cluster_name
        self.sts_endpoint = sts_endpoint
        self._clock = clock
        self._admin_token = admin_token
        self._partition = partition
        self._issued: dict[str, UserInfo] = {}
        self._lock = threading.Lock()

    def issue_service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token for a ServiceAccount, as TokenRequest hands one to a pod's projected volume."""
        return self.issue_static_token(UserInfo(
            f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")))

    def issue_static_token(self, user: UserInfo) -> str:
        """A bearer token for `user`, as a line of a static token file gives one (`system:authenticated` added, as
        the API server adds it to every authenticated user)."""
        token = secrets.token_urlsafe(32)
        groups = user.groups if "system:authenticated" in user.groups else (*user.groups, "system:authenticated")
        with self._lock:
            self._issued[token] = UserInfo(user.name, groups)
        return token

    def authenticate(self, header: str | None) -> UserInfo:
        """The user a request's `Authorization` header names; ApiError 401 when it names none."""
        if not header:
            return ANONYMOUS
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized("not a bearer token")
        if secrets.compare_digest(token.encode(), self._admin_token.encode()):
            return ADMIN
        with self._lock:
            issued = self._issued.get(token)
        if issued is not None:
            return issued
        if token.startswith(TOKEN_PREFIX):
            return self._eks_user(token)
        raise _unauthorized("a token this server did not issue")

    # EKS tokens

    def _eks_user(self, token: str) -> UserInfo:
        url = self._verified_url(token)
        arn, session = self._replay(url)
        canonical = _canonical_arn(arn)
        entry = access_entry(self.cluster_name, canonical)
        if entry is None:
            raise _unauthorized(f"{canonical} has no access entry in cluster {self.cluster_name}")
        name = entry.username.replace("{{SessionName}}", session)
        return UserInfo(name, (*entry.kubernetes_groups, "system:authenticated"))

    def _verified_url(self, token: str) -> str:
        """The presigned URL, when it passes every check token.go's `Verify` makes before calling STS."""
        if len(token) > MAX_TOKEN_BYTES:
            raise _unauthorized("token is too large")
        try:
            url = base64.urlsafe_b64decode(_unpadded(token[len(TOKEN_PREFIX):])).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError) as error:
            raise _unauthorized(f"token is not base64url: {error}") from None
        parts = urlsplit(url)
        if parts.scheme != "https":
            raise _unauthorized(f"unexpected scheme {parts.scheme!r} in pre-signed URL")
        self._verify_host(parts.netloc)
        if parts.path != "/":
            raise _unauthorized("unexpected path in pre-signed URL")
        query = parse_qsl(parts.query, keep_blank_values=True)
        lowered = [key.lower() for key, _ in query]
        if len(set(lowered)) != len(lowered):
            raise _unauthorized("duplicate query parameter in pre-signed URL")
        unknown = sorted(set(lowered) - _PARAMETERS)
        if unknown:
            raise _unauthorized(f"non-whitelisted query parameter {unknown[0]!r}")
        params = {key.lower(): value for key, value in query}
        if params.get("action") != "GetCallerIdentity":
            raise _unauthorized("unexpected action parameter in pre-signed URL")
        if CLUSTER_ID_HEADER not in [h.lower() for h in params.get("x-amz-signedheaders", "").split(";")]:
            raise _unauthorized(f"client did not sign the {CLUSTER_ID_HEADER} header in the pre-signed URL")
        expires = params.get("x-amz-expires", "")
        if not expires.lstrip("-").isdigit() or not 0 <= int(expires) <= 900:
            raise _unauthorized(f"invalid X-Amz-Expires parameter in pre-signed URL: {expires!r}")
        try:
            signed_at = datetime.strptime(params.get("x-amz-date", ""), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        except ValueError:
            raise _unauthorized("X-Amz-Date parameter must be present in pre-signed URL") from None
        if self._clock.now() > signed_at + PRESIGNED_URL_VALIDITY:
            raise _unauthorized(f"X-Amz-Date parameter is expired (15 minute expiration) {signed_at}")
        return url

    def _verify_host(self, host: str) -> None:
        """token.go `verifySTSHostnameFormat`: the global endpoint (commercial partition only), or
        `sts` / `sts-fips` `.<region>.` the partition's domain or its dual-stack domain."""
        labels = host.split(".")
        if host == "sts.amazonaws.com" and self._partition == "aws":
            return
        domains = _PARTITION_DOMAINS[self._partition]
        if len(labels) < 4 or labels[0] not in ("sts", "sts-fips") or ".".join(labels[2:]) not in domains or (
                not _REGION.match(labels[1])):
            raise _unauthorized(f"unexpected hostname {host!r} in pre-signed URL")

    def _replay(self, url: str) -> tuple[str, str]:
        """GET the URL with this cluster's id, as token.go does (`accept: application/json`); (ARN, session)."""
        if self.sts_endpoint is None:
            raise _unauthorized("sts getCallerIdentity failed: no STS is reachable from this cluster")
        parts = urlsplit(url)
        request = urllib.request.Request(f"{self.sts_endpoint.rstrip('/')}{parts.path}?{parts.query}", headers={
            "Host": parts.netloc, CLUSTER_ID_HEADER: self.cluster_name, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=_REPLAY_TIMEOUT) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise _unauthorized(f"sts getCallerIdentity failed: error from AWS (expected 200, got {error.code}). "
                                f"Body: {error.read().decode(errors='replace')}") from None
        except (OSError, ValueError) as error:
            raise _unauthorized(f"sts getCallerIdentity failed: {error}") from None
        try:
            result = body["GetCallerIdentityResponse"]["GetCallerIdentityResult"]
            arn, user_id = str(result["Arn"]), str(result["UserId"])
        except (KeyError, TypeError):
            raise _unauthorized(f"sts getCallerIdentity failed: unexpected answer {body!r}") from None
        return arn, user_id.partition(":")[2]


def _canonical_arn(arn: str) -> str:
    """pkg/arn/arn.go `Canonicalize`: `arn:P:sts::A:assumed-role/ROLE/SESSION` is the role `arn:P:iam::A:role/ROLE`;
    IAM users, roles and the root, and federated users, are themselves."""
    fields = arn.split(":", 5)
    if len(fields) != 6 or fields[0] != "arn":
        raise _unauthorized(f"arn {arn!r} is invalid")
    _, partition, service, _, account, resource = fields
    parts = resource.split("/")
    if service == "sts" and parts[0] == "assumed-role" and len(parts) >= 3:
        return f"arn:{partition}:iam::{account}:role/{'/'.join(parts[1:-1])}"
    if (service, parts[0]) in (("sts", "federated-user"), ("iam", "role"), ("iam", "user"), ("iam", "root")):
        return arn
    raise _unauthorized(f"unrecognized resource {resource} for service {service}")


def _unpadded(text: str) -> str:
    """token.go decodes with `RawURLEncoding`: padding is not allowed."""
    if "=" in text:
        raise ValueError("padding in unpadded base64url")
    return text + "=" * (-len(text) % 4)


def _unauthorized(reason: str) -> ApiError:
    log.info("refused a bearer token: %s", reason)
    return ApiError(401, "Unauthorized", "Unauthorized")

"""STS GetCallerIdentity called through a presigned URL: the signature checked, the signer answered.

This is the call EKS's authenticator makes with a Kubernetes bearer token (aws-iam-authenticator,
pkg/token/token.go `Verify`: it replays the token's presigned URL with its own `x-k8s-aws-id` header and reads
the caller from the answer). STS answers only a request whose SigV4 signature matches, over everything the URL
says it signed (`X-Amz-SignedHeaders`, so the cluster header too); a token signed for another cluster fails
there. moto reads neither: it takes the caller from the Authorization header only (a presigned URL has none, so
it names a default user) and checks no signature. This stand-in does both, from the SigV4 documentation
("Authenticating Requests: Using Query Parameters" and "Create a signed AWS API request", IAM User Guide), with
the secret keys moto issued (AssumeRole sessions, IAM users' access keys); a key moto never issued is refused as
STS refuses an unknown key. Not modelled: a session's expiry (moto does not end sessions), the 15-minute validity
of a presigned STS URL (the authenticator checks it first).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.parse
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

from gpu_autoscaler.emulator.strict.core import Answer, Refusal, answer

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.strict.core import AwsRequest

__all__: list[str] = []

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_UNRESERVED = "-_.~"
_INVALID_KEY = ("InvalidClientTokenId", "The security token included in the request is invalid.")
_MISMATCH = ("SignatureDoesNotMatch", "The request signature we calculated does not match the signature you "
             "provided. Check your AWS Secret Access Key and signing method. Consult the service documentation "
             "for details.")


@answer("sts", "GetCallerIdentity")
def _presigned_caller_identity(request: AwsRequest) -> Answer | None:
    environ = request.environ
    query = urllib.parse.parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    params = dict(query)
    if "X-Amz-Signature" not in params:
        return None  # signed in the Authorization header: moto reads that caller itself
    secret, session_token, identity = _signer(request.access_key)
    if params.get("X-Amz-Security-Token", session_token) != session_token or (
            session_token and "X-Amz-Security-Token" not in params):
        raise Refusal(*_INVALID_KEY, status=403)
    if not hmac.compare_digest(_signature(environ, query, secret), params["X-Amz-Signature"]):
        raise Refusal(*_MISMATCH, status=403)
    account, arn, user_id = identity
    if "application/json" in environ.get("HTTP_ACCEPT", ""):
        body = json.dumps({"GetCallerIdentityResponse": {
            "GetCallerIdentityResult": {"Account": account, "Arn": arn, "UserId": user_id},
            "ResponseMetadata": {"RequestId": "00000000-0000-0000-0000-000000000000"}}}).encode()
        return Answer(raw=body, content_type="application/json")
    body = (f'<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult>'
            f"<Arn>{escape(arn)}</Arn><UserId>{escape(user_id)}</UserId><Account>{account}</Account>"
            f"</GetCallerIdentityResult></GetCallerIdentityResponse>").encode()
    return Answer(raw=body)


def _signature(environ: dict[str, Any], query: list[tuple[str, str]], secret: str) -> str:
    """SigV4 of a presigned GET: the canonical request (method, path, every query parameter but the signature,
    the signed headers as received, the empty payload's hash), the string to sign, the derived key."""
    params = dict(query)
    signed = params.get("X-Amz-SignedHeaders", "").split(";")
    headers = {name: _header(environ, name) for name in signed}
    canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query) if k != "X-Amz-Signature")
    canonical_headers = "".join(f"{name}:{headers[name]}\n" for name in signed)
    path = environ.get("PATH_INFO") or "/"
    canonical = "\n".join([environ.get("REQUEST_METHOD", "GET"), _quote(path, safe="/"), canonical_query,
                           canonical_headers, ";".join(signed), _EMPTY_SHA256])
    _, date, region, service, terminal = params.get("X-Amz-Credential", "").split("/")
    to_sign = "\n".join(["AWS4-HMAC-SHA256", params.get("X-Amz-Date", ""), f"{date}/{region}/{service}/{terminal}",
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, terminal):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def _header(environ: dict[str, Any], name: str) -> str:
    value = environ.get("HTTP_HOST", "") if name == "host" else environ.get(
        "HTTP_" + name.upper().replace("-", "_"), "")
    return " ".join(str(value).split())


def _quote(text: str, safe: str = "") -> str:
    return urllib.parse.quote(text, safe=_UNRESERVED + safe)


def _signer(access_key: str) -> tuple[str, str, tuple[str, str, str]]:
    """(secret key, session token or "", (account, ARN, user id)) of a key moto issued; `Refusal` otherwise."""
    from moto.iam.models import iam_backends
    from moto.sts.models import sts_backends

    for account in list(sts_backends):
        for backend in list(sts_backends[account].values()):
            for role in backend.assumed_roles:
                if role.access_key_id == access_key:
                    return role.secret_access_key, role.session_token, (role.account_id, role.arn, role.user_id)
    for account in list(iam_backends):
        for iam in list(iam_backends[account].values()):
            for user in iam.users.values():
                for key in user.access_keys:
                    if key.access_key_id == access_key:
                        return key.secret_access_key, "", (user.account_id, user.arn, user.id)
    raise Refusal(*_INVALID_KEY, status=403)

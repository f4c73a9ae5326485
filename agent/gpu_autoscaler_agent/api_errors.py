"""Failed calls to the API server, said as the server said them.

A refusal comes with a Status whose message says why: the admission webhook that denied an update and its
policy's words, or the verb, resource and group a missing permission would grant
(`pods "x" is forbidden: User "..." cannot patch resource "pods" in API group "" in the namespace "a"`).
"""

from __future__ import annotations

import json

import urllib3
from kubernetes.client.exceptions import ApiException

__all__ = ["CALL_FAILURES", "describe_error", "status_message"]

CALL_FAILURES = (ApiException, urllib3.exceptions.HTTPError, OSError)
"""What a call to the API server raises when it fails: an answer that is not a success, or no answer."""


def status_message(error: ApiException) -> str:
    """The `message` of the Status the server answered with (the body as it is when it is no Status)."""
    body = error.body.decode(errors="replace") if isinstance(error.body, bytes) else str(error.body or "")
    try:
        status = json.loads(body)
    except ValueError:
        return body
    return str(status.get("message") or "") if isinstance(status, dict) else body


def describe_error(error: BaseException) -> str:
    """`HTTP 403 Forbidden: <the server's message>`; anything else as it reads."""
    if not isinstance(error, ApiException):
        return str(error) or type(error).__name__
    return f"HTTP {error.status} {error.reason}: {status_message(error)}".rstrip(": ")

"""A small Kubernetes API client: JSON over HTTPS with a bearer token, for the few calls the functions make.

Why not the `kubernetes` package in the functions: with no byte code on Lambda's read-only `/opt`, its first
`CoreV1Api` compiles `kubernetes/client/api/core_v1_api.py` (~30,000 lines) at every cold start, seconds of the
five the interruption path may spend between a Spot warning and the node cordoned; and the package is a third
of the layer. The functions need a dozen requests on a handful of paths, all plain JSON, so they are made here
on urllib3 (already loaded by botocore). The in-cluster agent and the command line keep the `kubernetes`
client, and an `ApiClient` of theirs (a kubeconfig's, the local API's in tests) is accepted as it is
(`KubernetesRest.of`): its host, credentials and TLS settings are read, and its token hook runs per request.

The wire, as the API documents it (https://kubernetes.io/docs/reference/using-api/api-concepts/):
- Lists are paged with `limit` and the `continue` token of `metadata.continue`; a token too old for the
  server's history answers 410 Gone, and the list must start again ("Retrieving large results sets in chunks").
- A PATCH names its kind in `Content-Type` ("Patch and apply"; also https://kubernetes.io/docs/tasks/
  manage-kubernetes-objects/update-api-object-kubectl-patch/): `application/json-patch+json` (RFC 6902, a
  list of operations), `application/merge-patch+json` (RFC 7386: lists replaced whole),
  `application/strategic-merge-patch+json` (built-in types only: lists merged by their patch keys, what
  kubectl sends by default).
- A failed request answers a `Status` (`code`, `reason`, `message`, `details.causes`), so callers act on the
  HTTP status: 404 gone, 409 conflict, 410 expired, 429 too many requests (an eviction a
  PodDisruptionBudget refuses: the drain tries again on its own schedule, whatever `Retry-After` the server
  suggests), 5xx the server's own failure.
- A GET answered 429 is asked again, once or twice, after its `Retry-After` (at most `_MAX_PAUSE`): API
  Priority and Fairness rejects a request its priority level has no room for with 429 and `Retry-After: 1`
  (https://kubernetes.io/docs/concepts/cluster-administration/flow-control/: APF "is designed to work well with
  standard controllers, which use informers and react to failures of API requests with exponential back-off";
  the value: kubernetes/kubernetes#117734). A GET changes nothing, so asking again is safe; the page of a long
  list is asked again, not the whole list.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import json
import ssl
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import quote, urlencode

import urllib3

from gpu_autoscaler.errors import KubernetesApiError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import TracebackType

__all__ = [
    "DEFAULT_TIMEOUT",
    "FUNCTION_TIMEOUT",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "ApiClientLike",
    "KubernetesHttpError",
    "KubernetesRest",
    "path",
    "pem_from_base64",
    "worst_request_seconds",
]

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
_JSON = "application/json"
_GONE = 410
_FORBIDDEN = 403
_NAMESPACE_TERMINATING = "NamespaceTerminating"
_LIST_ATTEMPTS = 3
T = TypeVar("T")

_CONNECT_RETRIES = 2
_READ_RETRIES = 1
_RETRIES = urllib3.Retry(total=3, connect=_CONNECT_RETRIES, read=_READ_RETRIES, status=0, redirect=0, other=0,
                         allowed_methods={"GET"}, raise_on_status=False)
"""A refused or reset connection is tried again (a read error only on a GET, which is safe to repeat); an HTTP
status never is here: the caller decides what a 409 or a 429 means (a GET's 429: `KubernetesRest.request`)."""
_TOO_MANY = 429
_THROTTLED_RETRIES = 2
"""A GET answered 429 is sent again at most this many times."""
_MAX_PAUSE = 2.0
"""Seconds waited before a 429'd GET is sent again, at most, whatever `Retry-After` says (1 s when it says
nothing readable, what APF sends)."""
DEFAULT_TIMEOUT = (5.0, 30.0)
"""(connect, read) seconds for the commands and the agent's host."""
FUNCTION_TIMEOUT = (3.0, 10.0)
"""(connect, read) seconds in a Lambda function, whose records must finish within its timeout
(`worst_request_seconds`)."""


def worst_request_seconds(timeout: tuple[float, float]) -> float:
    """The longest one request can take: an attempt the API server stalls (three connections tried, a read retried
    once, `_RETRIES`), and a GET's pauses after 429s; a 429 is asked again only while a stalled attempt still fits
    after the pause (`KubernetesRest.request`)."""
    return _stalled_seconds(timeout) + _THROTTLED_RETRIES * _MAX_PAUSE


def _stalled_seconds(timeout: tuple[float, float]) -> float:
    connect, read = timeout
    return (1 + _CONNECT_RETRIES) * connect + (1 + _READ_RETRIES) * read


class KubernetesHttpError(KubernetesApiError):
    """The API server answered with an error status; `status_body` is its `Status`, when it sent one."""

    def __init__(self, method: str, target: str, status: int, reason: str,
                 status_body: Mapping[str, Any] | None) -> None:
        self.reason = reason
        self.status_body = dict(status_body or {})
        super().__init__(f"{method} {target}: HTTP {status} {self.message}", status)

    @property
    def message(self) -> str:
        """The Status' message and its causes' (a PDB's "needs 2 healthy pods and has 2"), else the reason."""
        causes = (self.status_body.get("details") or {}).get("causes") or ()
        parts = [self.status_body.get("message") or ""] + [c.get("message") or "" for c in causes]
        return ": ".join(p for p in parts if p) or self.reason

    @property
    def namespace_terminating(self) -> bool:
        """A create refused because its namespace is being deleted: the NamespaceLifecycle admission plugin's 403
        with a `NamespaceTerminating` cause (kubernetes plugin/pkg/admission/namespace/lifecycle/admission.go;
        k8s.io/api/core/v1 `NamespaceTerminatingCause`, in `details.causes[].reason` on the wire). It passes with
        the namespace, and says nothing of this identity's access."""
        causes = (self.status_body.get("details") or {}).get("causes") or ()
        return self.status == _FORBIDDEN and any(c.get("reason") == _NAMESPACE_TERMINATING for c in causes)

    @property
    def is_access_refused(self) -> bool:
        """As `KubernetesApiError`'s, but a namespace being deleted is no refused access."""
        return super().is_access_refused and not self.namespace_terminating


class ApiClientLike(Protocol):
    """The shape of a `kubernetes.client.ApiClient` this module reads (never imported here)."""

    @property
    def configuration(self) -> Any: ...


def path(*segments: str) -> str:
    """`/api/v1/namespaces/<ns>/pods/<name>` from its segments, each escaped."""
    return "/" + "/".join(quote(s, safe="") for s in segments)


class KubernetesRest:
    """JSON requests to one API server. Thread-safe (urllib3's pool); a context manager that closes it."""

    def __init__(
        self,
        host: str,
        *,
        authorization: Callable[[], str | None] | None = None,
        ca_pem: str | None = None,
        ca_file: str | None = None,
        client_cert: tuple[str, str | None] | None = None,
        verify: bool = True,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
    ) -> None:
        """`authorization` gives the `Authorization` header's value ("Bearer …") before every request, so a
        token source can replace an expiring token; `ca_pem` / `ca_file` trust only the cluster's CA."""
        self.host = host.rstrip("/")
        self._authorization = authorization
        self._timeout = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        self._stalled = _stalled_seconds(timeout)
        self._worst = worst_request_seconds(timeout)
        tls = _tls_context(ca_pem, ca_file, client_cert, verify) if self.host.startswith("https://") else None
        self._pool = urllib3.PoolManager(num_pools=2, maxsize=8, retries=_RETRIES, ssl_context=tls)
        self.server_date: datetime | None = None
        """The last answer's `Date` header (RFC 9110: when the server generated it, by its own clock)."""

    @classmethod
    def of(cls, api: KubernetesRest | ApiClientLike, timeout: tuple[float, float] = DEFAULT_TIMEOUT) -> KubernetesRest:
        """This client, or one speaking as a `kubernetes` `ApiClient` does: same host, credentials and TLS."""
        if isinstance(api, KubernetesRest):
            return api
        configuration = api.configuration

        def authorization() -> str | None:
            # What the kubernetes client sends: its auth settings run the token refresh hook, if any.
            settings = configuration.auth_settings().get("BearerToken") or {}
            value: str | None = settings.get("value")
            return value

        cert = (configuration.cert_file, configuration.key_file) if configuration.cert_file else None
        return cls(configuration.host, authorization=authorization, ca_file=configuration.ssl_ca_cert,
                   client_cert=cert, verify=bool(configuration.verify_ssl), timeout=timeout)

    def __enter__(self) -> KubernetesRest:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._pool.clear()

    # Verbs

    def get(self, target: str, query: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return self.request("GET", target, query=query)

    def post(self, target: str, body: Any) -> dict[str, Any]:
        return self.request("POST", target, body=body)

    def patch(self, target: str, body: Any, content_type: str) -> dict[str, Any]:
        if content_type not in (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH):
            raise ValueError(f"not a Kubernetes patch type: {content_type}")
        return self.request("PATCH", target, body=body, content_type=content_type)

    def delete(self, target: str, body: Any = None) -> dict[str, Any]:
        """`body`: DeleteOptions (preconditions, grace period), as the API reads them from a DELETE's body."""
        return self.request("DELETE", target, body=body)

    def list_items(self, target: str, parse: Callable[[dict[str, Any]], T], *, field_selector: str | None = None,
                   label_selector: str | None = None, page_size: int = 500) -> list[T]:
        """Every item of a list, page by page, each page's items turned by `parse` before the next page is asked
        for: only one page's raw JSON is held at a time, which is what paging is for ("Retrieving large results
        sets in chunks" limits the client's memory too), and a cluster's 20,000 raw pods (~0.7 GB as Python
        objects) never are. An expired continue token (410) starts the list again, from nothing."""
        for attempt in range(_LIST_ATTEMPTS):
            items: list[T] = []
            token: str | None = None
            try:
                while True:
                    parsed, token = self._page(target, parse, {
                        "fieldSelector": field_selector, "labelSelector": label_selector, "limit": page_size,
                        "continue": token})
                    items.extend(parsed)
                    if not token:
                        return items
            except KubernetesHttpError as error:
                if error.status != _GONE or attempt == _LIST_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _page(self, target: str, parse: Callable[[dict[str, Any]], T], query: Mapping[str, Any],
              ) -> tuple[list[T], str | None]:
        """One page's items parsed, and its continue token (None on the last page). The raw page lives only
        here, so it is freed before the next one arrives."""
        page = self.get(target, query)
        token: str | None = (page.get("metadata") or {}).get("continue") or None
        return [parse(item) for item in page.get("items") or ()], token

    def request(self, method: str, target: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
                content_type: str = _JSON) -> dict[str, Any]:
        """The response's JSON object; `KubernetesHttpError` for an error status, `KubernetesApiError` (no
        status) when the server cannot be reached. A GET answered 429 is sent again up to `_THROTTLED_RETRIES`
        times after min(`Retry-After`, `_MAX_PAUSE`), while the request stays within `worst_request_seconds`; any
        other method's 429 (an eviction a PodDisruptionBudget refuses) is the caller's at once."""
        url = self.host + target
        params = {k: v for k, v in (query or {}).items() if v is not None and v != ""}
        if params:
            url += "?" + urlencode(params)
        headers = {"Accept": _JSON, "User-Agent": "gpu-autoscaler"}
        token = self._authorization() if self._authorization is not None else None
        if token:
            headers["Authorization"] = token
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        started = time.monotonic()
        for retry in range(_THROTTLED_RETRIES + 1):
            try:
                response = self._pool.request(method, url, body=data, headers=headers, timeout=self._timeout,
                                              preload_content=True)
            except (urllib3.exceptions.HTTPError, OSError) as error:
                raise KubernetesApiError(f"Kubernetes API unreachable: {method} {target}: {error}") from error
            if response.status != _TOO_MANY or method != "GET" or retry == _THROTTLED_RETRIES:
                break
            pause = min(_retry_after(response.headers.get("Retry-After")), _MAX_PAUSE)
            if time.monotonic() - started + pause + self._stalled > self._worst:
                break
            time.sleep(pause)
        self.server_date = _date(response.headers.get("Date"))
        decoded = _json(response.data)
        if response.status >= 400:
            raise KubernetesHttpError(method, target, response.status, response.reason or "",
                                      decoded if decoded.get("kind") == "Status" else None)
        return decoded


def _retry_after(header: str | None) -> float:
    """`Retry-After`'s seconds (RFC 9110 §10.2.3: a number of seconds or an HTTP date); 1 s when absent or
    unreadable."""
    if header and header.strip().isdigit():
        return float(header.strip())
    when = _date(header)
    if when is None:
        return 1.0
    if when.tzinfo is None:  # "-0000": UTC, its zone not given (RFC 5322)
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _date(header: str | None) -> datetime | None:
    if not header:
        return None
    try:
        return email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None


def parse_time(text: str | None) -> datetime | None:
    """An object's timestamp as the API writes it (metav1.Time: RFC 3339 to the second, UTC); None when absent
    or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _json(data: bytes) -> dict[str, Any]:
    if not data:
        return {}
    try:
        decoded = json.loads(data)
    except ValueError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _tls_context(ca_pem: str | None, ca_file: str | None, client_cert: tuple[str, str | None] | None,
                 verify: bool) -> ssl.SSLContext:
    """The cluster's CA alone when given, else the system's; a CA that cannot be read is the caller's
    `KubernetesApiError` (no request could be trusted), not a crash."""
    try:
        context = ssl.create_default_context(cafile=ca_file, cadata=ca_pem)
        if client_cert is not None:
            context.load_cert_chain(client_cert[0], client_cert[1])
    except (ssl.SSLError, OSError, ValueError) as error:
        raise KubernetesApiError(f"the cluster's TLS settings cannot be used: {error}") from error
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def pem_from_base64(data: str) -> str:
    """A kubeconfig's or DescribeCluster's `certificate-authority-data`: base64 of the PEM text."""
    try:
        return base64.b64decode(data).decode()
    except (binascii.Error, UnicodeDecodeError) as error:
        raise KubernetesApiError(f"the cluster's certificate authority is not base64 of a PEM bundle: {error}") \
            from error

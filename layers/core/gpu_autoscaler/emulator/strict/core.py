"""The strict layer's machinery: requests as rules see them, the registry, and the WSGI middleware.

See the package docstring for how a rule module plugs in.
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import pkgutil
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.moto_fixes import EC2_REQUESTS
from gpu_autoscaler.emulator.strict import wire

if TYPE_CHECKING:
    from botocore.model import OperationModel

__all__ = ["Answer", "AwsRequest", "Refusal", "StrictLayer", "after", "answer", "answers", "ask_after", "before_any",
           "check", "load_rules", "on_reset", "strict_layer_disabled"]

log = logging.getLogger(__name__)

_SCOPE = re.compile(r"Credential=(?P<key>[^/]+)/\d{8}/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request")
_FRAMEWORK_MODULES = frozenset({"core", "wire"})


class Refusal(Exception):
    """What AWS answers instead of doing the request: its error code and message, word for word."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Answer:
    """A stand-in's answer: `result` in the operation's output shape (rendered as the service would), or
    `raw` bytes as they are."""

    result: dict[str, Any] | None = None
    raw: bytes | None = None
    status: int = 200
    content_type: str = "text/xml;charset=UTF-8"


@dataclass
class AwsRequest:
    """One request as a rule sees it: the service (SigV4 signing name), the action and its parameters
    in boto3's names and shapes (`params["LaunchTemplateConfigs"][0]["Overrides"]`)."""

    service: str
    action: str
    params: dict[str, Any]
    region: str
    access_key: str
    protocol: str
    operation: OperationModel | None = None
    environ: dict[str, Any] = field(default_factory=dict, repr=False)
    """The WSGI environ as received (headers, raw query string): for a rule that checks what a signature covers."""
    _forward: Callable[[bytes], tuple[int, list[tuple[str, str]], bytes]] | None = field(default=None, repr=False)

    @property
    def account(self) -> str:
        """The account moto files this request's resources under (it derives it from the access key)."""
        from moto.iam.models import get_account_id_from

        return str(get_account_id_from(self.access_key))

    def moto_backend(self, service: str | None = None) -> Any:
        """moto's state for this account and region (the service's backend), to read what AWS would know."""
        from moto.backends import get_backend

        backends = get_backend(service or self.service)  # type: ignore[call-overload]
        account = backends[self.account]
        return account[self.region] if self.region in account else account["global"]

    def forward(self, params: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """Ask moto (with `params` instead of the request's, if given) and return (status, parsed answer in
        boto3's shape, `Error` on a refusal): how a stand-in builds on what moto does (EC2/query protocols)."""
        assert self._forward is not None and self.operation is not None
        body = wire.serialize(self.protocol, self.operation, self.params if params is None else params)
        status, headers, payload = self._forward(body)
        return status, wire.parse_response(self.protocol, self.operation, status, headers, payload)


Check = Callable[[AwsRequest], None]
Respond = Callable[[AwsRequest], "Answer | None"]
Follow = Callable[[AwsRequest, dict[str, Any]], None]

_checks: dict[tuple[str, str], list[Check]] = {}
_answers: dict[tuple[str, str], list[Respond]] = {}
_afters: dict[tuple[str, str], list[Follow]] = {}
_befores: dict[str, list[Callable[[str, str], None]]] = {}
_services: set[str] = set()
_resets: list[Callable[[], None]] = []


def on_reset(hook: Callable[[], None]) -> Callable[[], None]:
    """Register what a stand-in must forget when moto's state is reset (`/moto-api/reset`)."""
    _resets.append(hook)
    return hook


def check(service: str, *actions: str) -> Callable[[Check], Check]:
    """Register a rule for these actions of `service` (SigV4 signing name: `ec2`, `iam`, `events`...).
    The rule raises `Refusal` to refuse the request; returning lets it through."""

    def register(rule: Check) -> Check:
        for action in actions:
            _checks.setdefault((service, action), []).append(rule)
        _services.add(service)
        return rule

    return register


def before_any(service: str) -> Callable[[Callable[[str, str], None]], Callable[[str, str], None]]:
    """Register what must happen in moto's state before any request of `service` is served, whatever its action
    and protocol (CloudWatch's CBOR requests are not parsed here): called with the request's account and region.
    How a stand-in keeps what AWS publishes on its own current for the next reader (the usage metrics)."""

    def register(hook: Callable[[str, str], None]) -> Callable[[str, str], None]:
        _befores.setdefault(service, []).append(hook)
        _services.add(service)
        return hook

    return register


def answer(service: str, *actions: str, first: bool = False, behind: Respond | None = None,
           ) -> Callable[[Respond], Respond]:
    """Register a stand-in for these actions: it returns an `Answer` to answer instead of moto, or None to
    let moto answer. It may also raise `Refusal`. `first`: asked before the stand-ins registered so far (one
    that wraps the others, as EC2's idempotency wraps whatever answers the request); `behind`: asked right
    after that stand-in (one that changes what the later ones are asked, as a capacity shortage does)."""

    def register(respond: Respond) -> Respond:
        for action in actions:
            registered = _answers.setdefault((service, action), [])
            if behind is not None:
                registered.insert(registered.index(behind) + 1, respond)
            else:
                registered.insert(0, respond) if first else registered.append(respond)
        _services.add(service)
        return respond

    return register


def after(service: str, *actions: str) -> Callable[[Follow], Follow]:
    """Register what must happen in moto's state once these actions succeeded (what AWS does that moto does
    not): called with the request and the answer (boto3's shape), whoever gave it; the answer is sent as is."""

    def register(follow: Follow) -> Follow:
        for action in actions:
            _afters.setdefault((service, action), []).append(follow)
        _services.add(service)
        return follow

    return register


def answers(service: str, action: str) -> list[Respond]:
    """The stand-ins registered for an action, in the order they are asked (for one that wraps the others)."""
    return list(_answers.get((service, action), ()))


def ask_after(respond: Respond, request: AwsRequest) -> Answer:
    """What the stand-ins registered after `respond`, else moto, answer `request` (moto's refusal raised as a
    `Refusal`): how a stand-in that wraps the others, or asks them something else, builds on them."""
    registered = answers(request.service, request.action)
    for later in registered[registered.index(respond) + 1:]:
        found = later(request)
        if found is not None:
            return found
    status, result = request.forward()
    if status >= 300:
        error = result.get("Error", {})
        raise Refusal(str(error.get("Code", "InternalError")), str(error.get("Message", "")), status)
    return Answer(result={k: v for k, v in result.items() if k != "ResponseMetadata"})


_loaded = False
_load_lock = threading.Lock()


def load_rules() -> None:
    """Import every rule module of this package (all but the framework's own): they register themselves."""
    global _loaded
    with _load_lock:
        if _loaded:
            return
        package = importlib.import_module("gpu_autoscaler.emulator.strict")
        for module in pkgutil.iter_modules(package.__path__):
            if module.name not in _FRAMEWORK_MODULES and not module.name.startswith("_"):
                importlib.import_module(f"{package.__name__}.{module.name}")
        _loaded = True


@contextmanager
def strict_layer_disabled() -> Iterator[None]:
    """Within this block, requests from this process's threads reach moto unchecked (for tests of moto's
    own behaviour, or of the layer itself). Process-wide: the server thread serves every client."""
    _Switch.enabled = False
    try:
        yield
    finally:
        _Switch.enabled = True


class _Switch:
    enabled = True


class StrictLayer:
    """WSGI middleware: refuse what AWS refuses, stand in for what moto lacks, pass the rest to `app`."""

    def __init__(self, app: Callable[..., Any]) -> None:
        load_rules()
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") == "/moto-api/reset":
            for hook in _resets:
                hook()
        scope = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", "")) or _SCOPE.search(
            urllib.parse.unquote(environ.get("QUERY_STRING", "")))  # a presigned URL carries it in X-Amz-Credential
        if scope is not None and scope["service"] == "ec2":
            with EC2_REQUESTS:  # the rules read moto's EC2 state: one EC2 request at a time (`moto_fixes`)
                return self._serve(environ, start_response, scope)
        return self._serve(environ, start_response, scope)

    def _serve(self, environ: dict[str, Any], start_response: Callable[..., Any],
               scope: re.Match[str] | None) -> Any:
        if not _Switch.enabled or scope is None or scope["service"] not in _services:
            return self.app(environ, start_response)
        if scope["service"] in _befores:
            from moto.iam.models import get_account_id_from

            for hook in _befores[scope["service"]]:
                hook(str(get_account_id_from(scope["key"])), scope["region"])
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        try:
            request = _request(environ, body, scope)
        except Exception:  # a request we cannot read is moto's to judge, as before this layer
            log.debug("strict layer could not read a %s request; passing it to moto", scope["service"],
                      exc_info=True)
            return self.app(environ, start_response)
        if request is None:
            return self.app(environ, start_response)
        request._forward = lambda new_body: self._ask_moto(environ, new_body)
        key = (request.service, request.action)
        try:
            for rule in _checks.get(key, ()):
                rule(request)
            for respond in _answers.get(key, ()):
                found = respond(request)
                if found is not None:
                    for follow in _afters.get(key, ()):
                        follow(request, found.result or {})
                    return _send(request, found, start_response)
        except Refusal as refusal:
            log.info("strict layer refused %s %s: %s %s", request.service, request.action, refusal.code,
                     refusal.message)
            json_version = str(request.operation.service_model.metadata.get("jsonVersion", "1.0")) \
                if request.operation is not None else "1.0"
            status, headers, payload = wire.error_response(request.protocol, refusal.code, refusal.message,
                                                           refusal.status, json_version)
            start_response(f"{status} Bad Request", [*headers, ("Content-Length", str(len(payload)))])
            return [payload]
        if key in _afters and request.operation is not None:
            status, headers, payload = self._ask_moto(environ, body)
            if status < 300:
                parsed = wire.parse_response(request.protocol, request.operation, status, headers, payload)
                for follow in _afters[key]:
                    follow(request, parsed)
            start_response(f"{status} {'OK' if status < 300 else 'Error'}", headers)
            return [payload]
        return self.app(environ, start_response)


    def _ask_moto(self, environ: dict[str, Any], body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        inner = dict(environ)
        inner["wsgi.input"] = io.BytesIO(body)
        inner["CONTENT_LENGTH"] = str(len(body))
        answer: dict[str, Any] = {}

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            answer["status"], answer["headers"] = int(status.split()[0]), headers
            return lambda _: None

        chunks = self.app(inner, start)
        try:
            payload = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return answer["status"], answer["headers"], payload


def _request(environ: dict[str, Any], body: bytes, scope: re.Match[str]) -> AwsRequest | None:
    service = scope["service"]
    protocol = str(wire.service_model(service).metadata.get("protocol", ""))
    form: list[tuple[str, str]] = urllib.parse.parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    action = ""
    if protocol in ("ec2", "query"):
        form += urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        action = next((v for k, v in form if k == "Action"), "")
    elif protocol == "json":
        action = environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2]
    if not action or all((service, action) not in table for table in (_checks, _answers, _afters)):
        return None
    operation = wire.operation_model(service, action)
    params = wire.parse_params(protocol, operation, form, body)
    return AwsRequest(service=service, action=action, params=params, region=scope["region"],
                      access_key=scope["key"], protocol=protocol, operation=operation, environ=environ)


def _send(request: AwsRequest, found: Answer, start_response: Callable[..., Any]) -> list[bytes]:
    if found.raw is not None:
        payload = found.raw
    elif request.protocol == "ec2" and request.operation is not None:
        payload = wire.ec2_response(request.operation, found.result or {})
    else:
        payload = json.dumps(found.result or {}, default=str).encode()
    start_response(f"{found.status} OK", [("Content-Type", found.content_type),
                                          ("Content-Length", str(len(payload)))])
    return [payload]

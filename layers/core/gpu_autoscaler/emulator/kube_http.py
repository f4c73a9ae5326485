"""The local Kubernetes API's HTTP side: REST paths, query parameters, discovery, and watch streams.

HTTP/1.1 with keep-alive, JSON bodies, `Status` objects for errors, and watches as chunked streams of
one JSON event per line — what the `kubernetes` client and kubectl read from a real API server — plus
the Table output and OpenAPI v3 documents kubectl asks for (`kube_tables`).
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import json
import logging
import socket
import sys
import threading
import time
from datetime import UTC
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from gpu_autoscaler.emulator.kube_objects import RESOURCES, ApiError
from gpu_autoscaler.emulator.kube_rbac import attributes
from gpu_autoscaler.emulator.kube_selectors import Selector, parse_field_selector, parse_label_selector
from gpu_autoscaler.emulator.kube_tables import openapi_document, openapi_index, table, wants_table

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable

    from gpu_autoscaler.emulator.kube_apiserver import ApiServer
    from gpu_autoscaler.emulator.kube_authn import UserInfo
    from gpu_autoscaler.emulator.kube_objects import ResourceType
    from gpu_autoscaler.emulator.kube_rbac import Attributes
    from gpu_autoscaler.emulator.kube_store import StoreEvent

__all__ = ["KUBERNETES_VERSION", "ApiHttpServer"]

log = logging.getLogger(__name__)

KUBERNETES_VERSION = {"major": "1", "minor": "31", "gitVersion": "v1.31.0-gpu-autoscaler-local",
                      "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                      "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.22.0", "compiler": "gc",
                      "platform": "linux/amd64"}

_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
_MAX_WATCH_SECONDS = 1800
_TLS_HANDSHAKE = b"\x16"
"""The first byte of a TLS connection: a handshake record (RFC 8446, 5.1, ContentType handshake(22))."""
_FIRST_BYTE_SECONDS = 5.0
_JSON = "application/json"


class ApiHttpServer(ThreadingHTTPServer):
    """One listening socket; `close_connections()` drops every open one, as a restarting API server does."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], api: ApiServer, *,
                 authenticate: Callable[[str | None], UserInfo], authorize: Callable[[UserInfo, Attributes], None],
                 bookmark_interval: float = 5.0, tls: ssl.SSLContext | None = None) -> None:
        """`authenticate` reads the `Authorization` header (ApiError 401 when it names no user); `authorize`
        decides on the request's attributes (ApiError 403), before the path is looked up, as the API server's
        filters run before its handlers. `tls`: a connection that opens with a TLS handshake is served over TLS
        with it (kubectl sends credentials over TLS only, `kube_tls`), any other as plain HTTP."""
        super().__init__(address, _Handler)
        self.tls = tls
        self.api = api
        self.authenticate = authenticate
        self.authorize = authorize
        self.bookmark_interval = bookmark_interval
        self.unavailable = False
        """Set during an outage (`LocalKubernetes.outage`): every request is answered 503 ServiceUnavailable."""
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = self.socket.accept()
        if self.tls is None:
            return connection, address
        connection.settimeout(_FIRST_BYTE_SECONDS)
        try:
            first = connection.recv(1, socket.MSG_PEEK)
        except OSError:
            first = b""
        connection.settimeout(None)
        if first == _TLS_HANDSHAKE:  # the handshake itself runs in the request's thread, on its first read
            return self.tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False), address
        return connection, address

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._connections.discard(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request is routine (watch stopped, process exiting): no traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            log.debug("connection from %s ended: %s", client_address, error)
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    server: ApiHttpServer
    protocol_version = "HTTP/1.1"
    server_version = "gpu-autoscaler-local-kube"
    disable_nagle_algorithm = True
    """Headers and body go out in separate writes: with Nagle on, each response would wait for a delayed ACK."""
    _as_table = False
    """Set per watch: events carry one-row Tables (kubectl get -w) instead of objects."""
    _table_columns = True
    _include_object = "Metadata"

    # Plumbing

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            body = self._read_body()
            if self.server.unavailable:
                self._send_unavailable()
                return
            if url.path in ("/healthz", "/livez", "/readyz"):
                self._send_text(200, "ok")
                return
            user = self.server.authenticate(self.headers.get("Authorization"))
            self.server.authorize(user, attributes(method, url.path, query))
            self._route(method, url.path.rstrip("/") or "/", query, body)
        except ApiError as error:
            self._send_json(error.code, error.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as error:  # an emulator bug: answer 500 as a real server would, and keep serving
            log.exception("local Kubernetes API failed on %s %s", method, self.path)
            self._send_json(500, ApiError(500, "InternalError", str(error)).status())

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        content_type = (self.headers.get("Content-Type") or _JSON).split(";", 1)[0].strip()
        if "json" not in content_type:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                           f"accepted media types include: {_JSON}")
        try:
            return json.loads(raw)
        except json.JSONDecodeError as error:
            raise ApiError.bad_request(f"invalid JSON body: {error}") from None

    def _send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", _JSON)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The `Date` header from the API server's own clock (its store's), as a real one sets it from its host's:
        a client can tell how far its clock is from the server's."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        return email.utils.format_datetime(self.server.api.store.clock.now().astimezone(UTC), usegmt=True)

    def _send_unavailable(self) -> None:
        """What a client sees while the control plane is down behind its load balancer: 503 with a Status and a
        Retry-After. The API conventions (kubernetes/community, api-conventions.md "HTTP Status codes") name
        `503 StatusServiceUnavailable` "required service is unavailable", the client's recovery "retry with
        exponential backoff"; the connection is closed, as a proxy with no healthy backend does."""
        status = ApiError(503, "ServiceUnavailable", "the server is currently unable to handle the request").status()
        data = json.dumps(status, separators=(",", ":")).encode()
        self.send_response(503)
        self.send_header("Content-Type", _JSON)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Retry-After", "1")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _send_text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # Routing

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> None:
        parts = [p for p in path.split("/") if p]
        if method == "GET" and (reply := self._discovery(parts)) is not None:
            self._send_json(200, reply)
            return
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        resource = _BY_PATH.get((group, version, rest[0]))
        if resource is None or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if resource.namespaced and namespace is None and len(rest) > 1:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if subresource is not None and subresource not in resource.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        scope = namespace or ""
        if name is None:
            self._collection(method, resource, namespace, query, body)
        else:
            self._item(method, resource, scope, name, subresource, query, body)

    def _collection(self, method: str, resource: ResourceType, namespace: str | None, query: dict[str, str],
                    body: Any) -> None:
        api = self.server.api
        selector = Selector(parse_label_selector(query.get("labelSelector")),
                            parse_field_selector(query.get("fieldSelector"), resource))
        if method == "GET":
            if query.get("watch") in ("true", "1"):
                self._watch(resource, namespace, selector, query)
            else:
                listed = self._list(resource, namespace, selector, query)
                if wants_table(self.headers.get("Accept")):
                    metadata = listed["metadata"]
                    listed = table(resource, listed["items"], api.store.clock.now(),
                                   version=metadata["resourceVersion"], token=metadata.get("continue", ""),
                                   include_object=query.get("includeObject", "Metadata"))
                self._send_json(200, listed)
        elif method == "POST":
            if not resource.namespaced or namespace is not None:
                self._send_json(201, api.create(resource, namespace or "", _object(body)))
            else:
                raise ApiError(405, "MethodNotAllowed", "create needs a namespace in the path")
        elif method == "DELETE":
            items = api.delete_collection(resource, namespace, selector)
            self._send_json(200, {"kind": resource.list_kind, "apiVersion": resource.api_version,
                                  "metadata": {}, "items": items})
        else:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a collection")

    def _item(self, method: str, resource: ResourceType, namespace: str, name: str, subresource: str | None,
              query: dict[str, str], body: Any) -> None:
        api = self.server.api
        if subresource == "eviction" and method == "POST":
            self._send_json(201, api.evict(namespace, name, _object(body)))
        elif subresource == "binding" and method == "POST":
            self._send_json(201, api.bind(namespace, name, _object(body)))
        elif subresource in ("eviction", "binding"):
            raise ApiError(405, "MethodNotAllowed", f"only POST is supported on {resource.plural}/{subresource}")
        elif method == "GET":
            obj = api.get(resource, namespace, name)
            if subresource is None and wants_table(self.headers.get("Accept")):
                obj = table(resource, [obj], api.store.clock.now(), version=obj["metadata"]["resourceVersion"],
                            include_object=query.get("includeObject", "Metadata"))
            self._send_json(200, obj)
        elif method == "PUT":
            self._send_json(200, api.update(resource, namespace, name, _object(body), subresource))
        elif method == "PATCH":
            content_type = self.headers.get("Content-Type") or ""
            if body is None:
                raise ApiError.bad_request("a patch needs a body")
            self._send_json(200, api.patch(resource, namespace, name, body, content_type, subresource))
        elif method == "DELETE" and subresource is None:
            options = dict(body or {})
            if "propagationPolicy" in query:
                options.setdefault("propagationPolicy", query["propagationPolicy"])
            if "gracePeriodSeconds" in query:
                options.setdefault("gracePeriodSeconds", query["gracePeriodSeconds"])
            self._send_json(200, api.delete(resource, namespace, name, options))
        else:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    # Lists and watches

    def _list(self, resource: ResourceType, namespace: str | None, selector: Selector,
              query: dict[str, str]) -> dict[str, Any]:
        store = self.server.api.store
        limit = int(query["limit"]) if query.get("limit", "").isdigit() and int(query["limit"]) > 0 else None
        after = None
        version_override = None
        if token := query.get("continue"):
            version_override, after = _decode_continue(token)
            store.check_version(version_override)
        items, version, last = store.select(resource, namespace, selector, after=after, limit=limit)
        version = version_override or version
        metadata: dict[str, Any] = {"resourceVersion": str(version)}
        if last is not None:
            metadata["continue"] = _encode_continue(version, last)
        return {"kind": resource.list_kind, "apiVersion": resource.api_version, "metadata": metadata,
                "items": items}

    def _watch(self, resource: ResourceType, namespace: str | None, selector: Selector,
               query: dict[str, str]) -> None:
        store = self.server.api.store
        timeout = float(query.get("timeoutSeconds") or _MAX_WATCH_SECONDS)
        deadline = time.monotonic() + min(timeout, _MAX_WATCH_SECONDS)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        requested = query.get("resourceVersion") or ""
        self._as_table = wants_table(self.headers.get("Accept"))
        self._table_columns = True
        self._include_object = query.get("includeObject", "Metadata")
        with store.lock:
            epoch = store.epoch
            initial: list[dict[str, Any]] = []
            gone: ApiError | None = None
            if requested in ("", "0"):
                items, cursor, _ = store.select(resource, namespace, selector)
                initial = [{"type": "ADDED", "object": obj} for obj in items]
            else:
                cursor = _version(requested)
                try:
                    store.check_version(cursor)
                except ApiError as error:
                    gone = error
        self.send_response(200)
        self.send_header("Content-Type", _JSON)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            if gone is not None:
                self._chunk({"type": "ERROR", "object": gone.status()})
                return
            for event in initial:
                self._chunk(event, resource)
            self._stream(resource, namespace, selector, cursor, epoch, deadline, bookmarks)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
            return
        self._end_chunks()

    def _stream(self, resource: ResourceType, namespace: str | None, selector: Selector, cursor: int,
                epoch: int, deadline: float, bookmarks: bool) -> None:
        store = self.server.api.store
        interval = self.server.bookmark_interval
        last_sent = time.monotonic()
        while not store.closed and not self.server.unavailable:
            if store.epoch != epoch:
                self._chunk({"type": "ERROR", "object": ApiError.gone("too old resource version: watch expired")
                             .status()})
                return
            try:
                events = store.events_after(cursor)
            except ApiError as error:
                self._chunk({"type": "ERROR", "object": error.status()})
                return
            for event in events:
                cursor = event.version
                if (translated := _translate(event, resource, namespace, selector)) is not None:
                    self._chunk(translated, resource)
                    last_sent = time.monotonic()
            now = time.monotonic()
            if now >= deadline:
                return
            if bookmarks and now - last_sent >= interval:
                self._chunk({"type": "BOOKMARK", "object": {
                    "kind": resource.kind, "apiVersion": resource.api_version,
                    "metadata": {"resourceVersion": str(cursor)}}})
                last_sent = now
            if not events:
                store.wait(cursor, epoch, min(deadline - now, interval if bookmarks else 1.0))

    def _chunk(self, event: dict[str, Any], resource: ResourceType | None = None) -> None:
        if resource is not None and self._as_table and event["type"] in ("ADDED", "MODIFIED", "DELETED"):
            obj = event["object"]
            event = {"type": event["type"], "object": table(
                resource, [obj], self.server.api.store.clock.now(), version=obj["metadata"]["resourceVersion"],
                include_object=self._include_object, columns=self._table_columns)}
            self._table_columns = False
        data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    # Discovery

    def _discovery(self, parts: list[str]) -> dict[str, Any] | None:
        if parts == ["version"]:
            return KUBERNETES_VERSION
        if parts[:2] == ["openapi", "v3"]:
            document = openapi_index() if len(parts) == 2 else openapi_document("/".join(parts[2:]))
            if document is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return document
        if parts == ["api"]:
            address, port = self.server.server_address[:2]
            host = f"{address!s}:{port}"
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]}
        if parts == ["apis"]:
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in _groups()]}
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in _groups():
            return {"kind": "APIGroup", "apiVersion": "v1", **_group(parts[1])}
        if parts == ["api", "v1"]:
            return _resource_list("", "v1")
        if len(parts) == 3 and parts[0] == "apis" and (parts[1], parts[2]) in {(r.group, r.version)
                                                                               for r in RESOURCES if r.group}:
            return _resource_list(parts[1], parts[2])
        return None


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError.bad_request("the request body must be a JSON object")
    return body


def _version(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ApiError.bad_request(f"invalid resource version {text!r}") from None


def _encode_continue(version: int, last: tuple[str, str]) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": version, "start": list(last)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), (str(data["start"][0]), str(data["start"][1]))
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
        raise ApiError.bad_request("continue key is not valid") from None


def _translate(event: StoreEvent, resource: ResourceType, namespace: str | None,
               selector: Selector) -> dict[str, Any] | None:
    """The event as this watch sees it: an object entering its selector is ADDED, one leaving it DELETED."""
    if event.resource is not resource:
        return None

    def visible(obj: dict[str, Any] | None) -> bool:
        return obj is not None and (namespace is None or obj["metadata"].get("namespace") == namespace) and (
            selector.matches(obj))

    now, before = visible(event.object), visible(event.previous)
    if event.type == "ADDED":
        kind = "ADDED" if now else None
    elif event.type == "DELETED":
        kind = "DELETED" if before else None
    elif now and before:
        kind = "MODIFIED"
    elif now:
        kind = "ADDED"
    elif before:
        kind = "DELETED"
    else:
        kind = None
    return {"type": kind, "object": event.object} if kind else None


def _groups() -> list[str]:
    return sorted({r.group for r in RESOURCES if r.group})


def _group(name: str) -> dict[str, Any]:
    versions = sorted({r.version for r in RESOURCES if r.group == name})
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def _resource_list(group: str, version: str) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for r in RESOURCES:
        if (r.group, r.version) != (group, version):
            continue
        resources.append({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                          "kind": r.kind, "verbs": list(r.verbs), "shortNames": list(r.short_names)})
        for sub in r.subresources:
            entry: dict[str, Any] = {"name": f"{r.plural}/{sub}", "singularName": "", "namespaced": r.namespaced,
                                     "kind": r.kind, "verbs": ["get", "patch", "update"]}
            if sub == "eviction":
                entry.update(kind="Eviction", group="policy", version="v1", verbs=["create"])
            elif sub == "binding":
                entry.update(kind="Binding", verbs=["create"])
            resources.append(entry)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources}


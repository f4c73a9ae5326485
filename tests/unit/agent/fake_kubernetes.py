"""A scripted stand-in for the pods endpoints of CoreV1Api, at the HTTP response level the real watch reads.

Lists return a response with `.data`; watches return a response whose `.stream()` yields the event lines
the API server would write, so the real `kubernetes.watch.Watch` parses them (ERROR events included).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator


class ListResponse:
    def __init__(self, pods: list[dict[str, Any]], version: str, token: str | None = None) -> None:
        metadata: dict[str, Any] = {"resourceVersion": version}
        if token:
            metadata["continue"] = token
        self.data = json.dumps({"kind": "PodList", "metadata": metadata, "items": pods}).encode()


class WatchResponse:
    status = 200

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._lines = [json.dumps(e).encode() + b"\n" for e in events]

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self._lines

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def event(kind: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": pod}


def expired() -> dict[str, Any]:
    return {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version"}}


def bookmark(version: str) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": version}}}


class FakeCoreApi:
    """`lists`: pages (or exceptions) served in order; `watches`: event lists (or exceptions) in order.
    When the watches run out, `stop` is set and an empty stream ends the last one."""

    def __init__(self, lists: list[Any], watches: list[Any], stop: threading.Event) -> None:
        self.lists = list(lists)
        self.watches = list(watches)
        self.stop = stop
        self.calls: list[dict[str, Any]] = []

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        script = self.watches if kwargs.get("watch") else self.lists
        if not script:
            self.stop.set()
            return WatchResponse([]) if kwargs.get("watch") else ListResponse([], "0")
        step = script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return WatchResponse(step) if kwargs.get("watch") else step

    def watch_versions(self) -> list[str | None]:
        return [c.get("resource_version") for c in self.calls if c.get("watch")]

    def list_count(self) -> int:
        return sum(1 for c in self.calls if not c.get("watch"))


def gone() -> ApiException:
    return ApiException(status=410, reason="Gone")

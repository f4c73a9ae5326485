"""Storage behind the local Kubernetes API: objects, one resourceVersion sequence, and the event history.

It plays etcd's part. Every write takes the next resourceVersion and appends an event to a bounded
history; watches replay the history after the version they ask for and then wait for more. A version older
than the history (compacted, as etcd compacts) is answered with 410 Gone — `expire()` forces that at once
for every version so far, and ends every open watch with an ERROR 410 event, which is how tests and the
demo exercise a client's recovery.

Thread-safe: one re-entrant lock guards everything, so a caller may hold `store.lock` across several
operations to make them atomic (an eviction checks budgets and deletes under it).
"""

from __future__ import annotations

import bisect
import copy
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.kube_objects import RESOURCES, ApiError, format_time

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_objects import ResourceType
    from gpu_autoscaler.emulator.kube_selectors import Selector

__all__ = ["Store", "StoreEvent"]

Key = tuple[str, str]
"""(namespace, name); the namespace is "" for cluster-scoped objects."""


@dataclass(frozen=True)
class StoreEvent:
    version: int
    resource: ResourceType
    type: str
    """ADDED, MODIFIED or DELETED."""
    object: dict[str, Any]
    previous: dict[str, Any] | None
    """The object before this change (None for ADDED): a selector watch needs both to tell enter from leave."""


class Store:
    def __init__(self, clock: Clock, *, history: int = 10_000, first_version: int = 1000) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._objects: dict[ResourceType, dict[Key, dict[str, Any]]] = {r: {} for r in RESOURCES}
        self._version = first_version
        self._log: list[StoreEvent] = []
        self._history = history
        self._compacted = first_version
        self._epoch = 0
        self._closed = False
        self._listeners: list[Callable[[StoreEvent], None]] = []

    # Reading

    @property
    def version(self) -> int:
        with self.lock:
            return self._version

    @property
    def epoch(self) -> int:
        """Bumped by `expire()`: a watch that saw another epoch must end with 410."""
        with self.lock:
            return self._epoch

    @property
    def closed(self) -> bool:
        return self._closed

    def get(self, resource: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            found = self._objects[resource].get((namespace, name))
            if found is None:
                raise ApiError.not_found(resource, name)
            return copy.deepcopy(found)

    def find(self, resource: ResourceType, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            found = self._objects[resource].get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def select(
        self, resource: ResourceType, namespace: str | None = None, selector: Selector | None = None,
        *, after: Key | None = None, limit: int | None = None,
    ) -> tuple[list[dict[str, Any]], int, Key | None]:
        """Matching objects in (namespace, name) order after `after`, at most `limit` of them, the list's
        version, and the key to continue from when the limit cut the list short."""
        with self.lock:
            keys = sorted(k for k in self._objects[resource] if namespace is None or k[0] == namespace)
            if after is not None:
                keys = keys[bisect.bisect_right(keys, after):]
            items: list[dict[str, Any]] = []
            last: Key | None = None
            for key in keys:
                obj = self._objects[resource][key]
                if selector is not None and not selector.matches(obj):
                    continue
                if limit is not None and len(items) >= limit:
                    return items, self._version, last
                items.append(copy.deepcopy(obj))
                last = key
            return items, self._version, None

    def objects(self, resource: ResourceType) -> list[dict[str, Any]]:
        """Every object of a type, uncopied: for controllers holding `lock` that only read."""
        with self.lock:
            return list(self._objects[resource].values())

    # Writing

    def create(self, resource: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object; fills uid, creationTimestamp and resourceVersion."""
        with self.lock:
            metadata = obj.setdefault("metadata", {})
            key = (metadata.get("namespace", "") if resource.namespaced else "", metadata["name"])
            if key in self._objects[resource]:
                raise ApiError.already_exists(resource, key[1])
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", format_time(self.clock.now()))
            stored = copy.deepcopy(obj)
            self._commit(resource, key, "ADDED", stored, None)
            return copy.deepcopy(stored)

    def update(
        self, resource: ResourceType, namespace: str, name: str,
        change: Callable[[dict[str, Any]], dict[str, Any]], *, expect_version: str | None = None,
    ) -> dict[str, Any]:
        """Read, change (on a copy), write — atomically. An unchanged object is not written (no new version),
        as the API server skips no-op updates. `expect_version` is the optimistic-concurrency precondition."""
        with self.lock:
            key = (namespace if resource.namespaced else "", name)
            current = self._objects[resource].get(key)
            if current is None:
                raise ApiError.not_found(resource, name)
            if expect_version and expect_version != current["metadata"].get("resourceVersion"):
                raise ApiError.conflict(resource, name,
                                        "the object has been modified; please apply your changes to the latest "
                                        "version and try again")
            updated = change(copy.deepcopy(current))
            metadata = updated.setdefault("metadata", {})
            for field in ("uid", "creationTimestamp", "name", "namespace"):
                if field in current["metadata"]:
                    metadata[field] = current["metadata"][field]
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
            if updated == current:
                return copy.deepcopy(current)
            self._commit(resource, key, "MODIFIED", updated, current)
            return copy.deepcopy(updated)

    def delete(
        self, resource: ResourceType, namespace: str, name: str,
        *, expect_uid: str | None = None, expect_version: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            key = (namespace if resource.namespaced else "", name)
            current = self._objects[resource].get(key)
            if current is None:
                raise ApiError.not_found(resource, name)
            metadata = current["metadata"]
            if expect_uid and expect_uid != metadata.get("uid"):
                raise ApiError.conflict(resource, name, f"Precondition failed: UID in precondition: {expect_uid}, "
                                        f"UID in object meta: {metadata.get('uid')}")
            if expect_version and expect_version != metadata.get("resourceVersion"):
                raise ApiError.conflict(resource, name, "Precondition failed: resourceVersion in precondition: "
                                        f"{expect_version}, resourceVersion in object meta: "
                                        f"{metadata.get('resourceVersion')}")
            del self._objects[resource][key]
            gone = copy.deepcopy(current)
            self._commit(resource, key, "DELETED", gone, current)
            return copy.deepcopy(gone)

    def dependents(self, owner_uid: str) -> list[tuple[ResourceType, dict[str, Any]]]:
        """Objects naming `owner_uid` in their ownerReferences (for garbage collection)."""
        with self.lock:
            return [
                (resource, copy.deepcopy(obj))
                for resource, objects in self._objects.items()
                for obj in objects.values()
                if any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences") or ())
            ]

    def _commit(self, resource: ResourceType, key: Key, kind: str, obj: dict[str, Any],
                previous: dict[str, Any] | None) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        if kind != "DELETED":
            self._objects[resource][key] = obj
        event = StoreEvent(self._version, resource, kind, copy.deepcopy(obj), previous)
        self._log.append(event)
        if len(self._log) > 2 * self._history:
            dropped = self._log[: len(self._log) - self._history]
            self._log = self._log[len(dropped):]
            self._compacted = max(self._compacted, dropped[-1].version)
        self._changed.notify_all()
        for listener in self._listeners:
            listener(event)

    # Watching

    def subscribe(self, listener: Callable[[StoreEvent], None]) -> None:
        """Call `listener` (under the lock: keep it short) on every change; controllers use it to wake up."""
        with self.lock:
            self._listeners.append(listener)

    def events_after(self, version: int) -> list[StoreEvent]:
        """Events newer than `version`; 410 Gone if the history no longer reaches back that far."""
        with self.lock:
            if version < self._compacted:
                raise ApiError.gone(f"too old resource version: {version} ({self._compacted})")
            start = bisect.bisect_right(self._log, version, key=lambda e: e.version)
            return self._log[start:]

    def check_version(self, version: int) -> None:
        with self.lock:
            if version < self._compacted:
                raise ApiError.gone(f"too old resource version: {version} ({self._compacted})")

    def wait(self, version: int, epoch: int, timeout: float) -> None:
        """Block until something newer than `version` is stored, the epoch changes, the store closes, or timeout."""
        with self.lock:
            if self._version > version or self._epoch != epoch or self._closed:
                return
            self._changed.wait(timeout)

    def expire(self) -> None:
        """Compact everything so far (any older version is 410 Gone) and end every open watch with 410."""
        with self.lock:
            self._compacted = self._version
            self._epoch += 1
            self._changed.notify_all()

    def close(self) -> None:
        """Wake every watch so it ends (the API server is going away)."""
        with self.lock:
            self._closed = True
            self._changed.notify_all()

    def reopen(self) -> None:
        with self.lock:
            self._closed = False

    def snapshot(self, resources: Iterable[ResourceType] | None = None) -> dict[str, list[dict[str, Any]]]:
        """Every object by plural name, for tests and the demo's summary."""
        with self.lock:
            return {r.plural: copy.deepcopy(list(self._objects[r].values())) for r in resources or RESOURCES}

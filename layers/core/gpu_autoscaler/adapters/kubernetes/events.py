"""`domain.pod_events.EventRecorder` over the Kubernetes API: core/v1 Events on pods, deduplicated, rate-limited.

Kubernetes' own recorder (client-go `tools/record`, the EventCorrelator) keeps one Event per (object, reason,
message) and raises its `count` and `lastTimestamp` when the same thing happens again, and rate-limits per
object. A Lambda keeps no memory between invocations, so the deduplication key is in the Event's name: a hash of
the pod's uid, the reason and the message. Creating an Event that exists (409) means "seen again": its count is
raised, unless it was last raised under `min_interval` ago (the rate limit: a pod reported every resync does not
rewrite its Event every time). At most `max_per_call` Events are written per call, so a burst of thousands of
pods does not flood the API server. Failures are logged and skipped: an Event is never worth failing a decision.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler.clock import SystemClock

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.domain.pod_events import PodEvent

__all__ = ["COMPONENT", "KubernetesEventRecorder", "event_name"]

log = logging.getLogger(__name__)

COMPONENT = "gpu-autoscaler"
_CONFLICT = 409
_NOT_FOUND = 404


def event_name(event: PodEvent) -> str:
    """`<pod>.<hash>`: the same (pod, reason, message) always names the same Event, across invocations."""
    digest = hashlib.sha256(f"{event.uid}\0{event.reason}\0{event.message}".encode()).hexdigest()[:16]
    return f"{event.name[:200]}.{digest}"


def _timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesEventRecorder:
    def __init__(
        self,
        connect: Callable[[], k8s.ApiClient],
        *,
        clock: Clock | None = None,
        min_interval: timedelta = timedelta(minutes=1),
        max_per_call: int = 200,
    ) -> None:
        """`connect` makes the ApiClient on first use (an invocation with nothing to say never connects)."""
        self._connect = connect
        self._core: k8s.CoreV1Api | None = None
        self.clock = clock or SystemClock()
        self.min_interval = min_interval
        self.max_per_call = max_per_call

    def _api(self) -> k8s.CoreV1Api:
        if self._core is None:
            self._core = k8s.CoreV1Api(self._connect())
        return self._core

    def record(self, events: Sequence[PodEvent]) -> int:
        written = 0
        for event in events:
            if written >= self.max_per_call:
                log.info("event budget of %d spent: %d event(s) not posted", self.max_per_call, len(events) - written)
                break
            try:
                written += self._post(event)
            except ApiException as error:
                log.warning("event %s on pod %s/%s not posted: %s %s", event.reason, event.namespace, event.name,
                            error.status, error.reason)
            except (urllib3.exceptions.HTTPError, OSError) as error:
                # The API server is not reachable: the rest would fail the same way, each after its retries.
                log.warning("Kubernetes API not reachable, %d event(s) not posted: %s", len(events) - written, error)
                break
        return written

    def _post(self, event: PodEvent) -> int:
        api = self._api()
        name = event_name(event)
        now = self.clock.now()
        try:
            body: Any = self._body(event, name, now)  # the client sends a plain manifest as it is
            api.create_namespaced_event(event.namespace, body, _request_timeout=(3, 10))
            return 1
        except ApiException as error:
            if error.status != _CONFLICT:
                raise
        existing: Any = api.read_namespaced_event(name, event.namespace, _request_timeout=(3, 10))
        last = existing.last_timestamp
        if last is not None and now - last < self.min_interval:
            return 0
        patch = {"count": int(existing.count or 1) + 1, "lastTimestamp": _timestamp(now)}
        api.patch_namespaced_event(name, event.namespace, patch, _request_timeout=(3, 10))
        return 1

    @staticmethod
    def _body(event: PodEvent, name: str, now: datetime) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": event.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": event.namespace, "name": event.name,
                               "uid": event.uid},
            "reason": event.reason,
            "message": event.message[:1024],
            "type": event.type,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": _timestamp(now),
            "lastTimestamp": _timestamp(now),
            "count": 1,
        }

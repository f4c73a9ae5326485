"""`domain.pod_events.EventRecorder` over the Kubernetes API: core/v1 Events on pods and nodes, deduplicated,
rate-limited.

Kubernetes' own recorder (client-go `tools/record`, the EventCorrelator) keeps one Event per (object, reason,
message) and raises its `count` and `lastTimestamp` when the same thing happens again, and rate-limits per
object. A Lambda keeps no memory between invocations, so the deduplication key is in the Event's name: a hash of
the pod's uid, the reason and the message. Creating an Event that exists (409) means "seen again": its count is
raised, unless it was last raised under `min_interval` ago (the rate limit: a pod reported every resync does not
rewrite its Event every time). Failures are logged and skipped: an Event is never worth failing a decision. Refused
access (401, 403: the functions' RBAC missing) ends the batch at its first Event, logged once as an error that names
the fix and counted (`Recorded.refused`), since every other Event would be refused alike; a 403 because the pod's
namespace is being deleted (`KubernetesHttpError.namespace_terminating`) is no refused access: only its Event is
skipped.

The Lambda's execution environment is kept warm between documents, and the agent reports every pending pod again
and again while its capacity launches: the recorder remembers the Events it wrote or found up to date, and skips
those under `min_interval` without asking the API server (each would cost a create refused 409 and a read: a
re-reported 1,000-pod document was 2,000 requests). At most `max_per_call` Events are tried per call, written or
found up to date, so a burst of thousands of pods does not flood the API server; pods left over are tried on the
next report, the ones done meanwhile being skipped from memory.

Within the invocation's time: given `time_left`, an Event is started only while one stalled request still fits in
what is left (`worst_request_seconds`; the first stalled one ends the batch), so Events never hold a record past the
function's timeout. A re-reported 200-pod document is up to 600 sequential requests (create refused 409, read,
patch): 30 s at 50 ms a request, an API server queueing a large submission, the moment hundreds of GPU pods pend.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.kubernetes.rest import (
    STRATEGIC_MERGE_PATCH,
    KubernetesHttpError,
    KubernetesRest,
    parse_time,
    path,
    worst_request_seconds,
)
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.domain.pod_events import Recorded
from gpu_autoscaler.errors import KubernetesAccessRefused, KubernetesApiError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.adapters.kubernetes.rest import ApiClientLike
    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.domain.pod_events import PodEvent

__all__ = ["COMPONENT", "KubernetesEventRecorder", "event_name"]

log = logging.getLogger(__name__)

COMPONENT = "gpu-autoscaler"
_CONFLICT = 409
_TIMEOUT = (3.0, 10.0)


def event_name(event: PodEvent) -> str:
    """`<pod>.<hash>`: the same (pod, reason, message) always names the same Event, across invocations."""
    digest = hashlib.sha256(f"{event.uid}\0{event.reason}\0{event.message}".encode()).hexdigest()[:16]
    return f"{event.name[:200]}.{digest}"


def _timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesEventRecorder:
    def __init__(
        self,
        connect: Callable[[], KubernetesRest | ApiClientLike],
        *,
        clock: Clock | None = None,
        min_interval: timedelta = timedelta(minutes=1),
        max_per_call: int = 200,
    ) -> None:
        """`connect` makes the client on first use (an invocation with nothing to say never connects)."""
        self._connect = connect
        self._rest: KubernetesRest | None = None
        self.clock = clock or SystemClock()
        self.min_interval = min_interval
        self.max_per_call = max_per_call
        self._done: dict[str, datetime] = {}
        """Event name → when this environment last wrote it or found it up to date."""

    def _api(self) -> KubernetesRest:
        if self._rest is None:
            self._rest = KubernetesRest.of(self._connect(), _TIMEOUT)
        return self._rest

    def record(self, events: Sequence[PodEvent], *, time_left: Callable[[], float] | None = None) -> Recorded:
        now = self.clock.now()
        self._forget(now)
        written = tried = 0
        reserve = worst_request_seconds(_TIMEOUT)
        for index, event in enumerate(events):
            name = event_name(event)
            if not self._due(name, now):
                continue
            if tried >= self.max_per_call:
                log.info("event budget of %d spent: the rest are tried on the next report", self.max_per_call)
                break
            if time_left is not None and (left := time_left()) < reserve:
                log.info("%.0f s of the invocation left, one stalled request may take %.0f s: the rest of the "
                         "events are tried on the next report", left, reserve)
                break
            tried += 1
            try:
                written += self._post(event, name, now)
            except KubernetesApiError as error:
                if error.is_access_refused:
                    # Every other Event would be refused alike: said once, counted, and the report goes on.
                    refused = 1 + sum(self._due(event_name(e), now) for e in events[index + 1:])
                    log.error("%d event(s) not posted: %s", refused, KubernetesAccessRefused(error))
                    return Recorded(written, refused)
                if not isinstance(error, KubernetesHttpError):
                    # The API server is not reachable: the rest would fail the same way, each after its retries.
                    log.warning("Kubernetes API not reachable, event(s) not posted: %s", error)
                    break
                log.warning("event %s on %s %s/%s not posted: %s %s", event.reason, event.kind.lower(),
                            event.namespace, event.name, error.status, error.message)
                continue
            self._done[name] = now
        return Recorded(written)

    def _due(self, name: str, now: datetime) -> bool:
        """Not written or found up to date by this environment within `min_interval`."""
        done = self._done.get(name)
        return done is None or now - done >= self.min_interval

    def _forget(self, now: datetime) -> None:
        """What is past `min_interval` is asked of the API server again anyway: kept no longer."""
        if len(self._done) > 4 * self.max_per_call:
            self._done = {n: t for n, t in self._done.items() if now - t < self.min_interval}

    def _post(self, event: PodEvent, name: str, now: datetime) -> int:
        api = self._api()
        events = ("api", "v1", "namespaces", event.namespace, "events")
        try:
            api.post(path(*events), self._body(event, name, now))
            return 1
        except KubernetesHttpError as error:
            if error.status != _CONFLICT:
                raise
        existing = api.get(path(*events, name))
        last = parse_time(existing.get("lastTimestamp"))
        if last is not None and now - last < self.min_interval:
            return 0
        patch = {"count": int(existing.get("count") or 1) + 1, "lastTimestamp": _timestamp(now)}
        api.patch(path(*events, name), patch, STRATEGIC_MERGE_PATCH)
        return 1

    @staticmethod
    def _body(event: PodEvent, name: str, now: datetime) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": event.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": event.kind, "name": event.name, "uid": event.uid,
                               **({"namespace": event.namespace} if event.kind == "Pod" else {})},
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

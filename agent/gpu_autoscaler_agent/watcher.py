"""List, then watch, the cluster's pods, and tell the dispatcher which ones to report.

The informer pattern without an informer: list (paginated) to learn everything and a resourceVersion,
watch from it, re-open the watch from the last version seen when it times out, list again when the API
server says the version is too old (410 Gone), and back off and reconnect when the server is away.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from gpu_autoscaler_agent.batcher import Report
from gpu_autoscaler_agent.claims import ClaimsUnplannable, KubernetesClaims, has_claims, is_gpu_class
from gpu_autoscaler_agent.document import pending_pod
from gpu_autoscaler_agent.placement import node_anti_affinity, zone_spread
from gpu_autoscaler_agent.selection import group_ref, resolve_group
from gpu_autoscaler_agent.sender import Backoff

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gpu_autoscaler_agent.dispatcher import PodSink
    from gpu_autoscaler_agent.gangs import GangHold
    from gpu_autoscaler_agent.health import Metrics
    from gpu_autoscaler_agent.placement import KubernetesPlacement
    from gpu_autoscaler_agent.selection import PodGroupSource, PodSelector

__all__ = ["PodWatcher"]

log = logging.getLogger(__name__)

_GONE = 410
_BAD_REQUEST = 400


class _RawWatch(watch.Watch):
    """A watch whose events keep the object as the API server's JSON (a dict), which is what the document
    copies from; the client's own `deserialize=False` mishandles ERROR events, this does not."""

    def get_return_type(self, func: Callable[..., Any]) -> str:
        return ""


class PodWatcher:
    def __init__(
        self,
        api_client: client.ApiClient,
        sink: PodSink,
        selector: PodSelector,
        groups: PodGroupSource,
        metrics: Metrics,
        *,
        field_selector: str = "",
        watch_timeout: int = 300,
        page_size: int = 500,
        backoff: Backoff | None = None,
        core_api: client.CoreV1Api | None = None,
        gangs: GangHold | None = None,
        placement: KubernetesPlacement | None = None,
        claims: KubernetesClaims | None = None,
    ) -> None:
        """`gangs`: keeps gang nodes for their gang (tolerations on members, taints off once bound);
        `placement`: volume zones and zone spread; `claims`: DRA device requests (each None: not reported)."""
        self._core = core_api or client.CoreV1Api(api_client)
        self._sink = sink
        self._selector = selector
        self._groups = groups
        self._metrics = metrics
        self._field_selector = field_selector or None
        self._watch_timeout = watch_timeout
        self._page_size = page_size
        self._backoff = backoff or Backoff(initial=0.5, maximum=30.0)
        self._watch: _RawWatch | None = None
        self._gangs = gangs
        self._placement = placement
        self._claims = claims
        self.synced = threading.Event()
        """Set once the first full list has been handed over: the agent has a complete view."""

    def run(self, stop: threading.Event) -> None:
        version: str | None = None
        failures = 0
        while not stop.is_set():
            try:
                if version is None:
                    version = self.sync()
                version = self._watch_from(version, stop)
                if self._gangs is not None:
                    self._gangs.sweep()
                failures = 0
                self._metrics.inc("watch_restarts_total", reason="timeout")
                continue
            except ApiException as error:
                if error.status == _GONE:
                    log.info("watch expired (410 Gone): listing again")
                    self._metrics.inc("watch_restarts_total", reason="expired")
                    version = None
                    continue
                if error.status == _BAD_REQUEST and self._field_selector:
                    log.warning("the API server refused field selector %r: filtering on the agent alone",
                                self._field_selector)
                    self._field_selector = None
                    continue
                failures += 1
                log.warning("pods API error %s %s; retrying", error.status, error.reason)
                self._metrics.inc("watch_restarts_total", reason=f"http_{error.status}")
            except (urllib3.exceptions.HTTPError, OSError, json.JSONDecodeError) as error:
                failures += 1
                log.warning("pods API unreachable (%s); retrying", error)
                self._metrics.inc("watch_restarts_total", reason="connection")
            stop.wait(self._backoff.delay(failures))

    def stop(self) -> None:
        """Unblock a watch waiting for the next event (the loop itself ends on its stop event)."""
        current = self._watch
        if current is not None:
            current.stop()

    def sync(self) -> str:
        """List every pod, hand over the reportable ones as the complete set, return the list's version."""
        pods, version = self._list()
        self._metrics.inc("pods_seen_total", len(pods))
        if self._gangs is not None:
            self._gangs.forget_all()
        reports = [r for r in (self.report(pod) for pod in pods) if r is not None]
        if self._gangs is not None:
            self._gangs.sweep()
        self._sink.replace_all(reports)
        self._metrics.inc("relists_total")
        self.synced.set()
        return version

    def _list(self) -> tuple[list[Mapping[str, Any]], str]:
        """All pages of one consistent list (an expired continue token is a 410: the caller lists again)."""
        pods: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            response: Any = self._core.list_pod_for_all_namespaces(  # raw (_preload_content=False)
                field_selector=self._field_selector,
                limit=self._page_size,
                _continue=token,
                _preload_content=False,
                _request_timeout=(10, 60),
            )
            page = json.loads(response.data)
            metadata = page.get("metadata") or {}
            pods.extend(page.get("items") or ())
            token = metadata.get("continue")
            if not token:
                return pods, str(metadata.get("resourceVersion") or "")

    def _watch_from(self, version: str, stop: threading.Event) -> str:
        self._watch = _RawWatch()
        if stop.is_set():  # stop() may have run before the watch existed: do not open it
            self._watch = None
            return version
        try:
            for event in self._watch.stream(
                self._core.list_pod_for_all_namespaces,
                resource_version=version or None,
                field_selector=self._field_selector,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                _request_timeout=(10, self._watch_timeout + 30),
            ):
                obj = event["raw_object"]
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                self._observe(event["type"], obj)
                if stop.is_set():
                    break
        finally:
            self._watch = None
        return version

    def _observe(self, kind: str, pod: Mapping[str, Any]) -> None:
        if kind == "BOOKMARK":
            return
        self._metrics.inc("pods_seen_total")
        uid = (pod.get("metadata") or {}).get("uid")
        if not uid:
            return
        report = None if kind == "DELETED" else self.report(pod)
        if report is None and self._gangs is not None:
            self._gangs.track(uid, None)
        if report is None:
            self._sink.remove(uid)
        else:
            self._sink.upsert(report)

    def report(self, pod: Mapping[str, Any]) -> Report | None:
        """The pod's report if it is to be reported; None otherwise (and for a pod that cannot be described)."""
        if not self._selector.reportable(pod):
            return None
        metadata = pod.get("metadata") or {}
        ref = group_ref(pod)
        try:
            context = self._context(pod)
            if context is None:
                return None
            group = resolve_group(ref, self._groups) if ref is not None else None
            gang = f"{metadata.get('namespace') or 'default'}/{group.name}" if group is not None else None
            if gang is not None and self._gangs is not None:
                pod = self._gangs.tolerate(pod, gang)
                metadata = pod.get("metadata") or {}
                self._gangs.track(str(metadata.get("uid")), gang)
            entry = pending_pod(pod, group, context)
        except (ValidationError, ValueError) as error:
            log.error("cannot report pod %s/%s: %s", metadata.get("namespace"), metadata.get("name"), error)
            self._metrics.inc("pods_invalid_total")
            return None
        return Report.of(entry, str(metadata.get("resourceVersion") or ""))

    def _context(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """What other objects say about where the pod may go; None when its DRA claims ask for no GPU and
        nothing else makes it a GPU pod (it was a candidate for its claims alone)."""
        context: dict[str, Any] = {}
        spec = pod.get("spec") or {}
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        if self._placement is not None:
            context["volumeZones"] = self._placement.volume_zones(pod)
            spread = [{"maxSkew": c.get("maxSkew", 1), "topologyKey": c["topologyKey"],
                       "whenUnsatisfiable": "DoNotSchedule",
                       "zoneCounts": self._placement.zone_counts(namespace, c.get("labelSelector"))}
                      for c in zone_spread(spec)]
            if spread:
                context["topologySpreadConstraints"] = spread
        if apart := node_anti_affinity(pod):
            context["podAntiAffinity"] = apart
        if self._claims is not None and has_claims(pod):
            requests: list[dict[str, Any]] = []
            try:
                requests = self._claims.device_requests(pod)
            except ClaimsUnplannable as error:
                context["unplannable"] = f"its DRA claims cannot be planned for: {error}"
            if requests:
                context["deviceRequests"] = requests
            gpu = any(is_gpu_class(r["deviceClassName"]) for r in requests)
            if not (gpu or "unplannable" in context or self._selector.gpu_by_spec(pod)):
                return None
        return context

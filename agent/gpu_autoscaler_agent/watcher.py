"""List, then watch, the cluster's pods, and tell the dispatcher which ones to report.

The informer pattern without an informer: list (paginated) to learn everything and a resourceVersion,
watch from it, re-open the watch from the last version seen when it times out, list again when the API
server says the version is too old (410 Gone), and back off and reconnect when the server is away.

Describing a pod may read or update other objects (its gang toleration, its volumes, its claims, its PodGroup).
When one of those calls fails — an admission webhook denying the update (Gatekeeper and Kyverno answer 400 or
403), a missing permission, a busy (429) or failing (500) server — that pod alone is skipped, the reason
logged, and it is tried again when the watch window ends (within `retry_after` seconds); every other pod is
reported as usual.
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

from gpu_autoscaler_agent.api_errors import CALL_FAILURES, describe_error, status_message
from gpu_autoscaler_agent.batcher import Report
from gpu_autoscaler_agent.claims import ClaimsUnplannable, KubernetesClaims, has_claims, is_gpu_class
from gpu_autoscaler_agent.document import pending_pod
from gpu_autoscaler_agent.placement import (
    ZONE_KEYS,
    VolumesUnplannable,
    host_ports,
    node_spread,
    pod_affinity,
    pod_anti_affinity,
    spread_nodes,
    spread_selector,
    zone_spread,
)
from gpu_autoscaler_agent.selection import group_ref, resolve_group
from gpu_autoscaler_agent.sender import Backoff

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from gpu_autoscaler_agent.dispatcher import PodSink
    from gpu_autoscaler_agent.gangs import GangHold
    from gpu_autoscaler_agent.health import Metrics
    from gpu_autoscaler_agent.placement import KubernetesPlacement
    from gpu_autoscaler_agent.selection import PodGroupSource, PodSelector

__all__ = ["PodWatcher"]

log = logging.getLogger(__name__)

_GONE = 410
_BAD_REQUEST = 400
_FIELD_UNSUPPORTED = "field label not supported"
"""How the API server refuses a field it cannot select on: 400 Bad Request, the message ending in
`field label not supported: <field>` (apimachinery's `runtime.Scheme.ConvertFieldLabel` and the pods' own
conversion; the list handler wraps the error in `NewBadRequest`)."""


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
        retry_after: int = 30,
    ) -> None:
        """`gangs`: keeps gang nodes for their gang (tolerations on members, taints off once bound);
        `placement`: volume zones and zone spread; `claims`: DRA device requests (each None: not reported);
        `retry_after`: the longest watch window while pods whose description failed wait to be tried again."""
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
        self._retry_after = retry_after
        self._failed: dict[str, Mapping[str, Any]] = {}
        """uid → the pod (as last seen) whose description failed on a call to the API server."""
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
                self._retry_failed()
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
                if self._field_selector and _field_unsupported(error):
                    log.warning("the API server refused field selector %r (%s): filtering on the agent alone",
                                self._field_selector, describe_error(error))
                    self._field_selector = None
                    continue
                failures += 1
                log.warning("pods API error (%s); retrying", describe_error(error))
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
        """List every pod, hand over the reportable ones as the complete set, return the list's version.

        Each page's reports are built before the next page is fetched, and its raw pods dropped: a burst holds
        its reports and one page of raw JSON, not every pod at once (7,500 pending pods of ~5 KB held whole took
        the agent to ~268 MiB). The sink is handed the reports only once the last page has come, so a list that
        fails part-way (a 410 on an expired continue token: the caller lists again) hands over nothing."""
        if self._gangs is not None:
            self._gangs.forget_all()
        self._failed.clear()
        reports: list[Report] = []
        seen = 0
        version = ""
        for pods, page_version in self._pages():
            version = page_version
            seen += len(pods)
            reports.extend(r for r in (self._attempt(pod) for pod in pods) if r is not None)
            del pods  # this page's raw pods go before the next page is fetched
        self._metrics.inc("pods_seen_total", seen)
        if self._gangs is not None:
            self._gangs.sweep()
        self._sink.replace_all(reports)
        self._metrics.inc("relists_total")
        self.synced.set()
        return version

    def _pages(self) -> Iterator[tuple[list[Mapping[str, Any]], str]]:
        """Each page of one consistent list with the list's resourceVersion, fetched only when the caller asks
        for the next one (an expired continue token is a 410: the caller lists again). Neither the response nor
        the page's items are kept here while the caller reads them."""
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
            del response  # its bytes go before the caller reads the page
            metadata = page.get("metadata") or {}
            yield page.pop("items", None) or [], str(metadata.get("resourceVersion") or "")
            token = metadata.get("continue")
            if not token:
                return

    def _watch_from(self, version: str, stop: threading.Event) -> str:
        self._watch = _RawWatch()
        timeout = min(self._watch_timeout, self._retry_after) if self._failed else self._watch_timeout
        if stop.is_set():  # stop() may have run before the watch existed: do not open it
            self._watch = None
            return version
        try:
            for event in self._watch.stream(
                self._core.list_pod_for_all_namespaces,
                resource_version=version or None,
                field_selector=self._field_selector,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _request_timeout=(10, timeout + 30),
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
        self._failed.pop(uid, None)
        report = None if kind == "DELETED" else self._attempt(pod)
        if uid in self._failed:
            return  # as it was, until it is tried again
        if report is None and self._gangs is not None:
            self._gangs.track(uid, None)
        if report is None:
            self._sink.remove(uid)
        else:
            self._sink.upsert(report)

    def _retry_failed(self) -> None:
        for uid, pod in list(self._failed.items()):
            del self._failed[uid]
            self._observe("MODIFIED", pod)

    def _attempt(self, pod: Mapping[str, Any]) -> Report | None:
        """`report`, or None with the pod kept for another try when a call to the API server failed."""
        try:
            return self.report(pod)
        except CALL_FAILURES as error:
            metadata = pod.get("metadata") or {}
            reason = f"http_{error.status}" if isinstance(error, ApiException) else "connection"
            log.warning("cannot report pod %s/%s now, trying again within %d s: %s", metadata.get("namespace"),
                        metadata.get("name"), self._retry_after, describe_error(error))
            self._metrics.inc("pods_failed_total", reason=reason)
            self._failed[str(metadata.get("uid"))] = pod
            return None

    def report(self, pod: Mapping[str, Any]) -> Report | None:
        """The pod's report if it is to be reported; None otherwise (and for a pod that cannot be described).
        Raises what a call to the API server for another object raised (ApiException, a connection error)."""
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

    def _pod_terms(self, pod: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Its required pod anti-affinity and affinity terms, with where the pods they select run (zone terms: per
        zone; affinity terms on the node: their nodes) when the agent may read it."""
        out: dict[str, Any] = {}
        if apart := pod_anti_affinity(pod):
            if self._placement is not None:
                for term in apart:
                    if term["topologyKey"] in ZONE_KEYS:
                        term["zoneCounts"] = self._placement.term_counts(term, namespace)
            out["podAntiAffinity"] = apart
        if beside := pod_affinity(pod):
            if self._placement is not None:
                for term in beside:
                    if term["topologyKey"] in ZONE_KEYS:
                        term["zoneCounts"] = self._placement.term_counts(term, namespace)
                    else:
                        term["nodes"] = self._placement.term_nodes(term, namespace)
            out["podAffinity"] = beside
        return out

    def _context(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """What other objects say about where the pod may go; None when its DRA claims ask for no GPU and
        nothing else makes it a GPU pod (it was a candidate for its claims alone)."""
        context: dict[str, Any] = {}
        spec = pod.get("spec") or {}
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if self._placement is not None:
            try:
                context["volumeZones"] = self._placement.volume_zones(pod)
            except VolumesUnplannable as error:
                context["unplannable"] = f"its volumes cannot be used on any node: {error}"
            spread = [{"maxSkew": c.get("maxSkew", 1), "topologyKey": c["topologyKey"],
                       "whenUnsatisfiable": "DoNotSchedule",
                       "zoneCounts": self._placement.zone_counts(namespace, spread_selector(c, labels),
                                                                 spread_nodes(spec, c), c["topologyKey"]),
                       **({"minDomains": c["minDomains"]} if c.get("minDomains") else {})}
                      for c in zone_spread(spec)]
            if spread:
                context["topologySpreadConstraints"] = spread
        if per_node := node_spread(pod):
            context["topologySpreadConstraints"] = [*context.get("topologySpreadConstraints", ()), *per_node]
        context.update(self._pod_terms(pod, namespace))
        if ports := host_ports(spec):
            context["hostPorts"] = ports
        if self._claims is not None and has_claims(pod):
            requests: list[dict[str, Any]] = []
            refused: str | None = None
            try:
                requests = self._claims.device_requests(pod)
            except ClaimsUnplannable as error:
                refused = f"its DRA claims cannot be planned for: {error}"
            gpu = any(is_gpu_class(r["deviceClassName"]) for r in requests)
            if not (gpu or refused or self._selector.gpu_by_spec(pod)):
                return None
            if requests:
                context["deviceRequests"] = requests
            if refused:
                context.setdefault("unplannable", refused)
        return context


def _field_unsupported(error: ApiException) -> bool:
    return error.status == _BAD_REQUEST and _FIELD_UNSUPPORTED in status_message(error)

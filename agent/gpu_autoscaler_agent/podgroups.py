"""Gang sizes the pods do not carry: PodGroup resources (coscheduling, KAI, Volcano), labelled members, and
the Jobs and JobSets Kueue admits whole.

Answers are cached for a while: every pod of an eight-pod gang asks the same question within a second.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler_agent.selection import COSCHEDULING_LABEL, KUEUE_GROUP_LABEL, GroupRef

if TYPE_CHECKING:
    from datetime import datetime

    from gpu_autoscaler.clock import Clock

__all__ = ["POD_GROUP_RESOURCES", "KubernetesPodGroups"]

log = logging.getLogger(__name__)

POD_GROUP_RESOURCES = {
    "coscheduling": ("scheduling.x-k8s.io", "v1alpha1", "podgroups"),
    "kai": ("scheduling.run.ai", "v2alpha2", "podgroups"),
    "volcano": ("scheduling.volcano.sh", "v1beta1", "podgroups"),
}
JOBSET_RESOURCE = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""On a Job or JobSet Kueue manages (the label, or the older annotation of the same name)."""
_MEMBER_LABELS = {"coscheduling": COSCHEDULING_LABEL, "kueue": KUEUE_GROUP_LABEL}
_ABSENT = 404
"""No such object, or no such resource (its scheduler's CRD is not installed). Not allowed (403) is an error: the
ClusterRole grants every group read here, so a refusal is a misconfiguration to say, not a gang to guess."""


class KubernetesPodGroups:
    """`PodGroupSource` over the API server; failures other than absence propagate to the watcher's retry."""

    def __init__(
        self,
        api_client: client.ApiClient,
        clock: Clock,
        ttl: timedelta = timedelta(seconds=30),
        *,
        custom_api: client.CustomObjectsApi | None = None,
        core_api: client.CoreV1Api | None = None,
        batch_api: client.BatchV1Api | None = None,
    ) -> None:
        self._custom = custom_api or client.CustomObjectsApi(api_client)
        self._core = core_api or client.CoreV1Api(api_client)
        self._batch = batch_api or client.BatchV1Api(api_client)
        self._clock = clock
        self._ttl = ttl
        self._cache: dict[tuple[str, GroupRef], tuple[datetime, int | None]] = {}

    def min_member(self, ref: GroupRef) -> int | None:
        return self._cached("minMember", ref, self._fetch_min_member)

    def member_count(self, ref: GroupRef) -> int | None:
        return self._cached("members", ref, self._count_members)

    def workload_size(self, ref: GroupRef) -> int | None:
        return self._cached("workload", ref, self._fetch_workload_size)

    def _cached(self, what: str, ref: GroupRef, fetch: Any) -> int | None:
        now = self._clock.now()
        hit = self._cache.get((what, ref))
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        value: int | None = fetch(ref)
        self._cache[(what, ref)] = (now, value)
        if len(self._cache) > 4096:  # gangs come and go; forget the stale ones
            self._cache = {k: v for k, v in self._cache.items() if now - v[0] < self._ttl}
        return value

    def _fetch_min_member(self, ref: GroupRef) -> int | None:
        resource = POD_GROUP_RESOURCES.get(ref.kind)
        if resource is None:
            return None
        group, version, plural = resource
        try:
            obj: Any = self._custom.get_namespaced_custom_object(group, version, ref.namespace, plural, ref.name)
        except ApiException as error:
            if error.status == _ABSENT:
                log.debug("no %s PodGroup %s/%s (%s)", ref.kind, ref.namespace, ref.name, error.status)
                return None
            raise
        value = (obj.get("spec") or {}).get("minMember")
        return value if isinstance(value, int) and value >= 1 else None

    def _fetch_workload_size(self, ref: GroupRef) -> int | None:
        try:
            if ref.kind == "job":
                response: Any = self._batch.read_namespaced_job(ref.name, ref.namespace, _preload_content=False)
                obj = json.loads(response.data)
            elif ref.kind == "jobset":
                obj = self._custom.get_namespaced_custom_object(*JOBSET_RESOURCE[:2], ref.namespace,
                                                                JOBSET_RESOURCE[2], ref.name)
            else:
                return None
        except ApiException as error:
            if error.status == _ABSENT:
                return None
            raise
        metadata = obj.get("metadata") or {}
        if KUEUE_QUEUE_LABEL not in (metadata.get("labels") or {}) | (metadata.get("annotations") or {}):
            return None
        spec = obj.get("spec") or {}
        if ref.kind == "job":
            return _job_pods(spec, int((obj.get("status") or {}).get("succeeded") or 0))
        total = sum(int(r.get("replicas", 1)) * _job_pods((r.get("template") or {}).get("spec") or {})
                    for r in spec.get("replicatedJobs") or ())
        return total or None

    def _count_members(self, ref: GroupRef) -> int | None:
        label = _MEMBER_LABELS.get(ref.kind)
        if label is None:
            return None
        try:
            response: Any = self._core.list_namespaced_pod(  # raw (_preload_content=False)
                ref.namespace, label_selector=f"{label}={ref.name}", _preload_content=False
            )
        except ApiException as error:
            if error.status == _ABSENT:
                return None
            raise
        items = json.loads(response.data).get("items") or []
        live = [p for p in items if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        return len(live) or None


def _job_pods(spec: dict[str, Any], succeeded: int = 0) -> int:
    """Pods a Job runs at once: its parallelism (default 1), never more than the completions it still needs ("For
    fixed completion count Jobs, the actual number of pods running in parallel will not exceed the number of
    remaining completions": kubernetes.io, Jobs › Controlling parallelism)."""
    parallelism = int(spec.get("parallelism", 1) or 0)
    completions = spec.get("completions")
    return max(min(parallelism, int(completions) - succeeded), 0) if completions is not None else parallelism

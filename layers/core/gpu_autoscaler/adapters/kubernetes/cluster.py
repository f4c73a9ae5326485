"""`ports.ClusterAPI` over the Kubernetes API: nodes and pods in, cordons, evictions and deletions out.

Requests go through `rest.KubernetesRest` (plain JSON: a drain lists every pod of a node, and the functions
never build the `kubernetes` client's models). The JSON is turned into the domain's `ClusterNode` /
`ClusterPod` with the same formulas the agent uses (`models.pod_spec`), so a pod's requests here are what the
packer planned with.

Writes follow kubectl's: cordon is a strategic-merge patch of `spec.unschedulable`, the node's taints and the
label that takes it out of external load balancers (as Karpenter's terminator), conditional on the
resourceVersion read (retried on conflict) — tainting and untainting alone patch the same way; eviction is a
policy/v1 Eviction with the pod's uid as precondition — 429 means a PodDisruptionBudget refused it, a 403 for
a namespace being deleted that its controller will delete the pod (both: retry later), 404 (or a uid mismatch:
the name now belongs to a new pod) means the pod is gone. VolumeAttachments (storage.k8s.io/v1) are listed and
filtered by `spec.nodeName` here (the API offers no field selector for it), each resolved to the claim its
PersistentVolume is bound to. Bound pods carry the zones their claims' volumes attach in (one list of claims and
one of volumes per pod list that has claims). Anything else is a `KubernetesApiError`, so the caller's message is
retried whole.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from gpu_autoscaler.adapters.kubernetes.rest import (
    STRATEGIC_MERGE_PATCH,
    KubernetesHttpError,
    KubernetesRest,
    parse_time,
    path,
)
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.domain.drain import LOAD_BALANCER_EXCLUSION
from gpu_autoscaler.errors import KubernetesApiError, NodeNotFound
from gpu_autoscaler.models.cluster import (
    DEFAULT_GRACE_SECONDS,
    ClusterNode,
    ClusterPod,
    EvictionOutcome,
    VolumeAttachment,
)
from gpu_autoscaler.models.labels import HOSTNAME
from gpu_autoscaler.models.pod_spec import (
    effective_requests,
    preferred_node_affinity,
    required_node_affinity,
    required_pod_terms,
)
from gpu_autoscaler.models.pods import PodAntiAffinity
from gpu_autoscaler.models.requirements import NodeSelectorTerm, PreferredSchedulingTerm
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint, Toleration
from gpu_autoscaler.models.volumes import persistent_volume_zones

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.adapters.kubernetes.rest import ApiClientLike
    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config

__all__ = ["MIRROR_ANNOTATION", "KubernetesCluster", "node_from_json", "pod_from_json"]

log = logging.getLogger(__name__)
T = TypeVar("T")

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_NOT_FOUND, _CONFLICT, _TOO_MANY, _INTERNAL = 404, 409, 429, 500
_MULTIPLE_BUDGETS = "more than one PodDisruptionBudget"
"""In the API server's 500 for an eviction of a pod several budgets select (registry/core/pod/storage/eviction.go:
"This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.")."""
_CORDON_ATTEMPTS = 5
_NODES = ("api", "v1", "nodes")
_PODS = ("api", "v1", "pods")
_UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"
_VOLUME_ATTACHMENTS = ("apis", "storage.k8s.io", "v1", "volumeattachments")
_CLAIMS = ("api", "v1", "persistentvolumeclaims")
_VOLUMES = ("api", "v1", "persistentvolumes")
CLOCK_TOLERANCE = timedelta(seconds=5)
"""A `Date` header is to the second and a round trip takes some: within this, the clocks are taken to agree
and timestamps are left exactly as the API server wrote them."""


class KubernetesCluster:
    def __init__(
        self,
        api: KubernetesRest | ApiClientLike,
        *,
        page_size: int = 500,
        request_timeout: tuple[float, float] = (5.0, 30.0),
        clock: Clock | None = None,
    ) -> None:
        """`api`: the small client, or a `kubernetes` ApiClient (the command line's kubeconfig, tests).
        `clock`: the caller's (the domain's `now`): timestamps the API server wrote are handed over on it."""
        self._rest = KubernetesRest.of(api, request_timeout)
        self._clock = clock or SystemClock()
        self._skew_seen = False
        self._page_size = page_size

    @classmethod
    def for_eks(cls, config: Config, clients: AwsClients, clock: Clock | None = None) -> KubernetesCluster:
        """The configured cluster, authenticated with a refreshing EKS token (what the Lambdas use)."""
        from gpu_autoscaler.adapters.aws.eks_token import eks_api_client

        return cls(eks_api_client(config, clients, clock), clock=clock)

    # Reading

    def list_nodes(self) -> list[ClusterNode]:
        nodes, offset = self._list_timed(_NODES, node_from_json)
        if offset is None:
            return nodes
        return [n.model_copy(update=_shifted(n, ("created_at", "ready_since"), offset)) for n in nodes]

    def list_pods(self, node_name: str | None = None, *, volume_zones: bool = True) -> list[ClusterPod]:
        """Every pod not finished, or every pod bound to one node, finished too (a drain's list). Both selected by
        the API server: `spec.nodeName` and `status.phase` are fields pods can be selected by (kubernetes.io
        "Field Selectors", supported fields). Succeeded and Failed pods hold nothing on a node and nothing that
        reads the cluster-wide list counts them (`ClusterPod.finished`), while a cluster keeps Jobs' finished
        pods until a TTL or the pod garbage collector's threshold removes them: the consolidate tick lists that
        every minute, so they stay on the server."""
        selector = f"spec.nodeName={node_name}" if node_name is not None else _UNFINISHED
        pods, offset = self._list_timed(_PODS, pod_from_json, selector)
        if volume_zones:
            pods = self._with_volume_zones(pods)
        if offset is None:
            return pods
        fields = ("created_at", "started_at", "deletion_timestamp")
        return [p.model_copy(update=_shifted(p, fields, offset)) for p in pods]

    def _with_volume_zones(self, pods: list[ClusterPod]) -> list[ClusterPod]:
        """The pods with the zones their claims' bound PersistentVolumes can be attached in (`volume_zones`): a
        pod recreated elsewhere keeps its claims, so its replacement or its move must stay there. One list of
        claims and one of volumes, only when some pod has a claim (each item reduced as its page is read). A claim
        not bound, or gone, restricts nothing: a running pod's claims are bound, and one the pod's owner will
        make again is provisioned where the new pod lands."""
        if not any(p.volume_claims for p in pods):
            return pods
        volume_of = dict(self._list(_CLAIMS, _claim_volume))
        zones_of = dict(self._list(_VOLUMES, _volume_zones))
        out = []
        for pod in pods:
            zones: frozenset[str] | None = None
            for claim in pod.volume_claims:
                volume = volume_of.get(f"{pod.namespace}/{claim}")
                allowed = zones_of.get(volume) if volume else None
                if allowed is not None:
                    zones = allowed if zones is None else zones & allowed
            out.append(pod if zones is None else pod.model_copy(update={"volume_zones": tuple(sorted(zones))}))
        return out

    def _list_timed(self, resource: tuple[str, ...], parse: Callable[[dict[str, Any]], T],
                    field_selector: str | None = None) -> tuple[list[T], timedelta | None]:
        """The list, and how far the API server's clock is ahead of ours when that is more than
        `CLOCK_TOLERANCE` (else None: nothing to correct). Read from the `Date` header of the last page's answer
        (what a server's clock says, to the second) against our clock when it arrived."""
        items = self._list(resource, parse, field_selector)
        date, received = self._rest.server_date, self._clock.now()
        if date is None:
            return items, None
        offset = date - received
        if abs(offset) <= CLOCK_TOLERANCE:
            return items, None
        if not self._skew_seen:
            log.warning("the Kubernetes API server's clock is %+.0f s off ours: its timestamps are read on ours",
                        offset.total_seconds())
            self._skew_seen = True
        return items, offset

    def volume_attachments(self, node_name: str) -> list[VolumeAttachment]:
        """The node's VolumeAttachments, each with the claim of its PersistentVolume (one GET per attachment: a
        drain asks only once its node is empty, and nodes hold a handful)."""
        out = []
        for name, on_node, volume in self._list(_VOLUME_ATTACHMENTS, _attachment):
            if on_node == node_name:
                out.append(VolumeAttachment(name=name, node_name=node_name, persistent_volume=volume,
                                            claim=self._claim_of(volume) if volume else None))
        return out

    def _claim_of(self, volume: str) -> str | None:
        try:
            pv = self._rest.get(path("api", "v1", "persistentvolumes", volume))
        except KubernetesHttpError as error:
            if error.status == _NOT_FOUND:
                return None
            raise
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        return f"{ref['namespace']}/{ref['name']}" if ref.get("name") and ref.get("namespace") else None

    def _list(self, resource: tuple[str, ...], parse: Callable[[dict[str, Any]], T],
              field_selector: str | None = None) -> list[T]:
        return self._rest.list_items(path(*resource), parse, field_selector=field_selector,
                                     page_size=self._page_size)

    # Writing

    def cordon(self, node_name: str, taint: Taint) -> None:
        """`spec.unschedulable`, our taint (added once, replacing one with the same key and effect) and, in the same
        patch, the label that takes the node out of external load balancers (`LOAD_BALANCER_EXCLUSION`; one
        already there is kept as it is)."""
        self._patch_taints(node_name, taint, add=True, unschedulable=True)

    def taint(self, node_name: str, taint: Taint) -> None:
        """Our taint only (the node stays schedulable for pods that tolerate it): added once."""
        self._patch_taints(node_name, taint, add=True)

    def untaint(self, node_name: str, taint: Taint, *, unless_cordoned: bool = False) -> bool:
        """Our taint (key and effect) removed, if there, and the load-balancer label if its value is ours; a node
        already gone is not an error. `unless_cordoned` leaves both on a node unschedulable on the read the patch is
        made against (its resourceVersion in the patch: a cordon after the read is a 409, read again), as
        Karpenter's disruption controller leaves the taint of a node its termination controller owns
        (kubernetes-sigs/karpenter pkg/controllers/state/statenode.go `RequireNoScheduleTaint`)."""
        try:
            return self._patch_taints(node_name, taint, add=False, unless_cordoned=unless_cordoned)
        except NodeNotFound:
            return True

    def _patch_taints(self, node_name: str, taint: Taint, *, add: bool, unschedulable: bool = False,
                      unless_cordoned: bool = False) -> bool:
        """False when `unless_cordoned` left the node as it was; True once it is as wanted."""
        label, ours = LOAD_BALANCER_EXCLUSION
        for _ in range(_CORDON_ATTEMPTS):
            node = self._read_node(node_name)
            spec = node.get("spec") or {}
            if unless_cordoned and spec.get("unschedulable"):
                return False
            labels = node["metadata"].get("labels") or {}
            taints = list(spec.get("taints") or ())
            wanted = taint.model_dump()
            present = any(_same_taint(t, wanted) for t in taints)
            # Cordoning adds the label if missing; untainting removes it if ours; tainting alone leaves it.
            relabel = ({label: ours} if unschedulable and label not in labels
                       else {label: None} if not add and labels.get(label) == ours else {})
            if present is add and (not unschedulable or spec.get("unschedulable")) and not relabel:
                return True
            taints = [t for t in taints if not (t.get("key") == taint.key and t.get("effect") == taint.effect)]
            if add:
                taints.append(wanted)
            body: dict[str, Any] = {"taints": taints}
            if unschedulable:
                body["unschedulable"] = True
            metadata: dict[str, Any] = {"resourceVersion": node["metadata"]["resourceVersion"]}
            if relabel:
                metadata["labels"] = relabel
            try:
                self._rest.patch(path(*_NODES, node_name), {"metadata": metadata, "spec": body}, STRATEGIC_MERGE_PATCH)
                return True
            except KubernetesHttpError as error:
                if error.status == _NOT_FOUND:
                    raise NodeNotFound(f"node {node_name} not found") from error
                if error.status != _CONFLICT:
                    raise
                log.debug("node %s changed while its taints were patched; reading it again", node_name)
        raise KubernetesApiError(f"node {node_name} kept changing while its taints were patched", _CONFLICT)

    def evict(self, pod: ClusterPod) -> EvictionOutcome:
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod.name, "namespace": pod.namespace},
                "deleteOptions": {"preconditions": {"uid": pod.uid}}}
        try:
            self._rest.post(path("api", "v1", "namespaces", pod.namespace, "pods", pod.name, "eviction"), body)
        except KubernetesHttpError as error:
            if (error.status == _TOO_MANY or (error.status == _INTERNAL and _MULTIPLE_BUDGETS in error.message)
                    or error.namespace_terminating):
                # A budget refuses it now (429), or several select it (500, which lasts while they do): Karpenter's
                # eviction queue retries both alike, and so does the drain. A namespace being deleted refuses it
                # until its controller has deleted the pod: kubectl's drain retries that too (`evictPods`).
                return EvictionOutcome(pod=pod.key, evicted=False, blocked=True, message=error.message)
            if error.status in (_NOT_FOUND, _CONFLICT):
                return EvictionOutcome(pod=pod.key, evicted=False, gone=True, message=error.message)
            raise
        return EvictionOutcome(pod=pod.key, evicted=True)

    def delete_pod(self, pod: ClusterPod, grace_period_seconds: int | None = None) -> None:
        """Bypasses budgets; only this pod (uid precondition), and one already gone is not an error.
        `grace_period_seconds` shortens the pod's own (never below 1: 0 would remove it from etcd before its
        kubelet stopped it)."""
        options: dict[str, Any] = {"preconditions": {"uid": pod.uid}}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = max(1, grace_period_seconds)
        try:
            self._rest.delete(path("api", "v1", "namespaces", pod.namespace, "pods", pod.name), options)
        except KubernetesHttpError as error:
            if error.status not in (_NOT_FOUND, _CONFLICT):
                raise

    def delete_node(self, node_name: str) -> None:
        try:
            self._rest.delete(path(*_NODES, node_name))
        except KubernetesHttpError as error:
            if error.status != _NOT_FOUND:
                raise

    # Plumbing

    def _read_node(self, node_name: str) -> dict[str, Any]:
        try:
            return self._rest.get(path(*_NODES, node_name))
        except KubernetesHttpError as error:
            if error.status == _NOT_FOUND:
                raise NodeNotFound(f"node {node_name} not found") from error
            raise


def _same_taint(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    def identity(t: Mapping[str, Any]) -> tuple[Any, ...]:
        return (t.get("key"), t.get("value") or "", t.get("effect"))

    return identity(a) == identity(b)


def _resources(quantities: Mapping[str, Any] | None, what: str) -> Resources:
    try:
        return Resources.from_quantities(quantities or {})
    except ValueError as error:
        log.warning("ignoring unreadable %s: %s", what, error)
        return Resources()


def node_from_json(node: Mapping[str, Any]) -> ClusterNode:
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = next((c for c in status.get("conditions") or () if c.get("type") == "Ready" and c.get("status") == "True"),
                 None)
    return ClusterNode(
        name=metadata["name"],
        provider_id=spec.get("providerID") or None,
        labels=dict(metadata.get("labels") or {}),
        taints=tuple(Taint(key=t["key"], value=t.get("value") or "", effect=t.get("effect") or "NoSchedule")
                     for t in spec.get("taints") or ()),
        allocatable=_resources(status.get("allocatable"), f"allocatable of node {metadata['name']}"),
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready is not None,
        created_at=parse_time(metadata.get("creationTimestamp")),
        ready_since=parse_time(ready.get("lastTransitionTime")) if ready is not None else None,
        annotations=dict(metadata.get("annotations") or {}),
    )


def _grace_seconds(value: Any) -> int:
    return int(value) if value is not None else DEFAULT_GRACE_SECONDS


def _owner_kind(metadata: Mapping[str, Any]) -> str | None:
    refs = list(metadata.get("ownerReferences") or ())
    controller = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    return controller.get("kind") if controller else None


def pod_from_json(pod: Mapping[str, Any]) -> ClusterPod:
    """A pod as the domain sees it; a pod whose constraints cannot be read keeps its identity and requests,
    so a drain still finds and evicts it."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = dict(metadata.get("annotations") or {})
    key = f"{metadata.get('namespace')}/{metadata.get('name')}"
    try:
        requests = Resources.from_quantities(effective_requests(spec, pod.get("status")))
    except ValueError as error:
        log.warning("ignoring unreadable requests of pod %s: %s", key, error)
        requests = Resources()
    base: dict[str, Any] = {
        "uid": metadata["uid"],
        "namespace": metadata.get("namespace") or "default",
        "name": metadata["name"],
        "node_name": spec.get("nodeName") or None,
        "requests": requests,
        "annotations": annotations,
        "labels": dict(metadata.get("labels") or {}),
        "owner_kind": _owner_kind(metadata),
        "mirror": MIRROR_ANNOTATION in annotations,
        "phase": (pod.get("status") or {}).get("phase") or "Pending",
        "ready": any(c.get("type") == "Ready" and c.get("status") == "True"
                     for c in (pod.get("status") or {}).get("conditions") or ()),
        "unschedulable": any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                             and c.get("reason") == "Unschedulable"
                             for c in (pod.get("status") or {}).get("conditions") or ()),
        "priority": int(spec.get("priority") or 0),
        "created_at": parse_time(metadata.get("creationTimestamp")),
        "priority_class_name": spec.get("priorityClassName") or None,
        "started_at": parse_time((pod.get("status") or {}).get("startTime")),
        "deletion_timestamp": parse_time(metadata.get("deletionTimestamp")),
        "termination_grace_period_seconds": _grace_seconds(spec.get("terminationGracePeriodSeconds")),
        "volume_claims": tuple(v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes") or ()
                               if (v.get("persistentVolumeClaim") or {}).get("claimName")),
    }
    try:
        return ClusterPod(
            **base,
            node_selector=dict(spec.get("nodeSelector") or {}),
            required_node_affinity=tuple(NodeSelectorTerm.model_validate(t) for t in required_node_affinity(spec)),
            preferred_node_affinity=tuple(PreferredSchedulingTerm.model_validate(t)
                                          for t in preferred_node_affinity(spec)),
            tolerations=tuple(Toleration.model_validate(t) for t in spec.get("tolerations") or ()),
            pod_anti_affinity=tuple(PodAntiAffinity.model_validate(t)
                                    for t in required_pod_terms(spec, "podAntiAffinity")
                                    if t.get("topologyKey") == HOSTNAME and t.get("labelSelector") is not None),
        )
    except ValidationError as error:
        log.warning("pod %s: unreadable placement constraints (%s); keeping it without them", key, error)
        return ClusterPod(**base)


def _shifted(model: Any, fields: tuple[str, ...], offset: timedelta) -> dict[str, datetime]:
    """The model's timestamps (the API server's clock) on ours: `offset` earlier."""
    return {name: value - offset for name in fields if (value := getattr(model, name)) is not None}


def _claim_volume(claim: Mapping[str, Any]) -> tuple[str, str | None]:
    """A PersistentVolumeClaim's `namespace/name` and the volume it is bound to (None while unbound)."""
    metadata = claim.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}", (claim.get("spec") or {}).get("volumeName") or None


def _volume_zones(volume: Mapping[str, Any]) -> tuple[str, frozenset[str] | None]:
    return volume["metadata"]["name"], persistent_volume_zones(volume)


def _attachment(attachment: Mapping[str, Any]) -> tuple[str, str | None, str | None]:
    """A VolumeAttachment's name, node and PersistentVolume (None for an inline volume)."""
    spec = attachment.get("spec") or {}
    volume = (spec.get("source") or {}).get("persistentVolumeName") or None
    return attachment["metadata"]["name"], spec.get("nodeName"), volume

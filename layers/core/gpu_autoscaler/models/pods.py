"""The pending-pods document the agent sends, and the pods in it.

Kubernetes shapes and quantity strings, so the agent copies fields straight from the Pod.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidatorFunctionWrapHandler, field_validator

from gpu_autoscaler.models.cached import CachedModel, unlocked_cached_property
from gpu_autoscaler.models.labels import DO_NOT_DISRUPT
from gpu_autoscaler.models.requirements import NodeSelectorTerm, PreferredSchedulingTerm, holds
from gpu_autoscaler.models.resources import DRA_PREFIX, PODS, QUANTITY_CEILING, Resources
from gpu_autoscaler.models.taints import Toleration

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["DeviceRequest", "HostPort", "PendingPod", "PendingPodsDocument", "PodAffinity", "PodAntiAffinity",
           "PodGroup", "TopologySpread", "device_totals", "selects", "with_requests"]


_SELECTOR_OPERATORS = {"In": True, "NotIn": True, "Exists": False, "DoesNotExist": False}
"""A LabelSelector's operators (metav1.LabelSelectorRequirement), and whether each takes values: `In` and `NotIn`
need some, `Exists` and `DoesNotExist` none."""


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector matches these labels (an empty selector matches everything; none, nothing). One the
    API server would have refused (an expression without a key, an operator it does not know, values where it takes
    none or none where it needs some) selects nothing."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or ():
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or ()
        if not key or op not in _SELECTOR_OPERATORS or bool(values) != _SELECTOR_OPERATORS[op]:
            return False
        if not holds(op, labels.get(key), values):
            return False
    return True


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class PodGroup(_Wire):
    """A gang: all `min_member` pods are placed together or none is."""

    name: str = Field(min_length=1)
    min_member: int = Field(alias="minMember", ge=1)


class TopologySpread(_Wire):
    """A `topologySpreadConstraints` entry kube-scheduler enforces (`DoNotSchedule`), keyed on the zone (new nodes
    for the pods that share it are spread over zones, so the scheduler can place them all) or on the node
    (`kubernetes.io/hostname`, sent when the pod matches its selector: a new node takes at most `maxSkew` of
    them)."""

    max_skew: int = Field(alias="maxSkew", ge=1)
    topology_key: str = Field(alias="topologyKey", min_length=1)
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        default="DoNotSchedule", alias="whenUnsatisfiable")
    zone_counts: dict[str, int] = Field(default_factory=dict, alias="zoneCounts")
    """Matching pods already running per zone kube-scheduler counts (the zones of the nodes its inclusion policies
    keep, 0 included), when the agent knows them; the zones new nodes may open count 0 when absent."""
    min_domains: int | None = Field(default=None, alias="minDomains", ge=1)
    """Below this many zones, kube-scheduler takes the least count as 0."""
    label_selector: dict[str, object] | None = Field(default=None, alias="labelSelector")
    """The pods it counts (`matchLabelKeys` ANDed in): the group a node-keyed constraint caps per node."""


class DeviceRequest(_Wire):
    """One device request of a pod's DRA claim (resource.k8s.io/v1 `devices.requests[].exactly`)."""

    device_class: str = Field(alias="deviceClassName", min_length=1)
    count: int = Field(default=1, ge=1)
    claim: str = ""
    """The claim (or template) it comes from, for reasons."""


class PodAntiAffinity(_Wire):
    """A required pod anti-affinity term the pod matches itself (so no two such pods share a topology domain);
    the agent sends those keyed on the node (`kubernetes.io/hostname`: one such pod per new node) or on the zone
    (one per zone, none in a zone where one runs)."""

    topology_key: str = Field(alias="topologyKey", min_length=1)
    label_selector: dict[str, object] = Field(default_factory=dict, alias="labelSelector")
    namespaces: tuple[str, ...] = ()
    """The namespaces whose pods it counts, when it names them (else the pod's own)."""
    namespace_selector: dict[str, object] | None = Field(default=None, alias="namespaceSelector")
    """`{}`: it counts the pods of every namespace (the agent sends no other selector)."""
    zone_counts: dict[str, int] = Field(default_factory=dict, alias="zoneCounts")
    """For a term on the zone: matching pods already running per zone."""

    def counts(self, owner: str, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether the term, of a pod in namespace `owner`, counts a pod of `namespace` with `labels`: its label
        selector matches, in the namespaces it names (else the owner's). Any `namespaceSelector` counts every
        namespace: `{}` does ("An empty selector ({}) matches all namespaces", core/v1 PodAffinityTerm), and which
        namespaces another selects depends on their labels, which are not read — taken as all, so a pod it might
        repel is kept apart (the packer's per-node groups read it so too, `packing.zones`)."""
        if self.namespace_selector is None and namespace not in (self.namespaces or (owner,)):
            return False
        return selects(self.label_selector, labels)


class PodAffinity(_Wire):
    """A required pod affinity term on the node (`kubernetes.io/hostname`) or the zone: the pod may run only in a
    domain that holds a pod it selects, or anywhere if it is the first of a group that selects itself."""

    topology_key: str = Field(alias="topologyKey", min_length=1)
    label_selector: dict[str, object] = Field(default_factory=dict, alias="labelSelector")
    namespaces: tuple[str, ...] = ()
    namespace_selector: dict[str, object] | None = Field(default=None, alias="namespaceSelector")
    self_match: bool = Field(default=False, alias="selfMatch")
    """The pod's own labels match it (in its namespace)."""
    zone_counts: dict[str, int] = Field(default_factory=dict, alias="zoneCounts")
    """For a term on the zone: matching pods already running per zone."""
    nodes: tuple[str, ...] = ()
    """For a term on the node: the nodes matching pods run on."""


class HostPort(_Wire):
    """A port the pod holds on its node's addresses: a container's `hostPort` (a `hostNetwork` pod's container ports
    are host ports too). kube-scheduler's NodePorts filter keeps two pods holding one on a node apart."""

    port: int = Field(alias="hostPort", ge=1, le=65535)
    protocol: str = "TCP"
    host_ip: str = Field(default="", alias="hostIP")
    """Empty or 0.0.0.0: every address of the node."""


class PendingPod(_Wire, CachedModel):
    uid: str = Field(min_length=1)
    namespace: str = "default"
    name: str
    created_at: datetime | None = Field(default=None, alias="createdAt")
    requests: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    required_node_affinity: tuple[NodeSelectorTerm, ...] = Field(default=(), alias="requiredNodeAffinity")
    preferred_node_affinity: tuple[PreferredSchedulingTerm, ...] = Field(default=(), alias="preferredNodeAffinity")
    """As written: the packer takes them as required, heaviest first, while an offering fits (`packing.preferences`)."""
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    pod_group: PodGroup | None = Field(default=None, alias="podGroup")
    annotations: dict[str, str] = Field(default_factory=dict)
    volume_zones: tuple[str, ...] | None = Field(default=None, alias="volumeZones")
    """Zones every one of the pod's persistent volumes can be used in (bound volumes' node affinity, or the
    allowed topologies of a WaitForFirstConsumer class); absent when they allow any. Empty: no common zone."""
    topology_spread: tuple[TopologySpread, ...] = Field(default=(), alias="topologySpreadConstraints")
    """The pod's spread constraints keyed on the zone or on the node."""
    pod_anti_affinity: tuple[PodAntiAffinity, ...] = Field(default=(), alias="podAntiAffinity")
    pod_affinity: tuple[PodAffinity, ...] = Field(default=(), alias="podAffinity")
    host_ports: tuple[HostPort, ...] = Field(default=(), alias="hostPorts")
    device_requests: tuple[DeviceRequest, ...] = Field(default=(), alias="deviceRequests")
    """What the pod's Dynamic Resource Allocation claims ask for, per device class."""
    unplannable: str | None = None
    """Why the agent knows no node we launch can run the pod (a DRA claim it cannot read, say)."""

    model_config = ConfigDict(
        populate_by_name=True, extra="ignore", frozen=True, ignored_types=(unlocked_cached_property,))

    @field_validator("requests")
    @classmethod
    def _quantities(cls, requests: dict[str, str]) -> dict[str, str]:
        _parsed(requests)  # raises with the offending quantity named
        return requests

    @field_validator("tolerations", mode="wrap")
    @classmethod
    def _shared_tolerations(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> tuple[Toleration, ...]:
        """One tuple of models per distinct list of tolerations of string (or null) fields: the pods of a
        burst mostly carry the same few, and building ten thousand equal frozen models costs a fifth of
        reading the document.

        Only a list of such fields is ever kept, so a list found equal to a kept one is one too (a string
        or null equals nothing else) and is not checked again: the check is for the first of each list, and
        a pod whose list is known costs one lookup (half the time: ~5 ms of 10,000 pods). Anything else
        (not a list, items that are not mappings, values that cannot be hashed) is validated as usual.
        """
        if type(value) is not list:
            return handler(value)
        try:
            key = tuple([tuple(t.items()) for t in value])
            found: tuple[Toleration, ...] | None = _TOLERATIONS.get(key)
        except (AttributeError, TypeError):
            return handler(value)
        if found is None:
            found = handler(value)
            if len(_TOLERATIONS) < _SHARED_LIMIT and all(
                    type(t) is dict and all(v is None or type(v) is str for v in t.values()) for t in value):
                _TOLERATIONS[key] = found
        return found

    @unlocked_cached_property
    def resources(self) -> Resources:
        return _parsed(self.requests)[0]

    @unlocked_cached_property
    def beyond_any_node(self) -> str | None:
        """Why no node could hold the pod, when it asks for `QUANTITY_CEILING` of something (the API server accepts
        `memory: 10E`): read by the packer, which reports it and plans the rest of the document; None otherwise.
        Read there (kept: consolidation asks it of the same pods every pass), not refused while parsing; found once
        per distinct request map (`_parsed`), as a burst's ten thousand pods ask for a few dozen."""
        return _parsed(self.requests)[1]

    @unlocked_cached_property
    def footprint(self) -> Resources:
        """What the pod takes on a node: its requests and the one `pods` slot (`fit.pod_requests`). Kept: the
        consolidation search asks it of the same pods every pass."""
        return self.resources + {PODS: 1}

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def do_not_disrupt(self) -> bool:
        return self.annotations.get(DO_NOT_DISRUPT) == "true"

    @property
    def gang(self) -> str | None:
        """Gang identity, scoped to the namespace as pod groups are."""
        return f"{self.namespace}/{self.pod_group.name}" if self.pod_group else None


_PARSED: dict[tuple[tuple[str, str], ...], tuple[Resources, str | None]] = {}
_TOLERATIONS: dict[tuple[tuple[tuple[str, str | None], ...], ...], tuple[Toleration, ...]] = {}
_SHARED_LIMIT = 4096


def _parsed(requests: dict[str, str]) -> tuple[Resources, str | None]:
    """`Resources.from_quantities` and `PendingPod.beyond_any_node`, once per distinct request map: a burst is
    mostly replicas asking for the same, and validating a pod and then reading its `resources` would otherwise
    parse its map twice (`Resources` is immutable, so pods may share one); the packer reads whether each of ten
    thousand pods asks for more than any node holds, which depends on the map alone."""
    key = tuple(requests.items())
    found = _PARSED.get(key)
    if found is None:
        resources = Resources.from_quantities(requests)
        beyond = sorted(name for name, value in resources.items() if value >= QUANTITY_CEILING)
        found = (resources, "it asks for more than any node holds: " + ", ".join(f"{n} {requests[n]}" for n in beyond)
                 if beyond else None)
        if len(_PARSED) < _SHARED_LIMIT:
            _PARSED[key] = found
    return found


def with_requests(pod: PendingPod, extra: dict[str, int]) -> PendingPod:
    """The pod asking for more (a new model, so `resources` is computed afresh): the packer sizes nodes for
    what is not a resource request in the Pod (DRA devices, per-node caps) as for any other resource."""
    if not extra:
        return pod
    data = pod.model_dump(by_alias=True)
    data["requests"] = {**pod.requests, **{k: str(v) for k, v in extra.items()}}
    return PendingPod.model_validate(data)


def device_totals(pod: PendingPod) -> dict[str, int]:
    """DRA device requests as `resource.k8s.io/<device class>` counts."""
    totals: dict[str, int] = {}
    for request in pod.device_requests:
        name = DRA_PREFIX + request.device_class
        totals[name] = totals.get(name, 0) + request.count
    return totals


class PendingPodsDocument(_Wire):
    schema_version: Literal[1] = Field(alias="schemaVersion")
    cluster: str = Field(min_length=1)
    sent_at: datetime = Field(alias="sentAt")
    pods: list[PendingPod]

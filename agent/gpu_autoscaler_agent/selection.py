"""Which pods the agent reports, and which gang each belongs to.

Gangs are recognised by the conventions their schedulers use: Kueue pod groups (label
`kueue.x-k8s.io/pod-group-name`, size in annotation `kueue.x-k8s.io/pod-group-total-count`), the coscheduling
plugin (label `scheduling.x-k8s.io/pod-group` and its PodGroup), NVIDIA KAI scheduler (`pod-group-name`, an
annotation its pod-grouper sets, or a label, with a `scheduling.run.ai` PodGroup), Volcano, and workloads Kueue
admits whole: a batch Job or a JobSet labelled `kueue.x-k8s.io/queue-name` (its pods start together or not at
all, so they are planned as one gang of the Job's parallelism, or the JobSet's replicas × parallelism).

Pods arrive as plain mappings in their Kubernetes JSON shape (camelCase, quantity strings), exactly as
the API server sends them, so nothing here needs the Kubernetes client and the tests need no server.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gpu_autoscaler.models.pods import PodGroup
from gpu_autoscaler.models.resources import is_gpu_resource, parse_quantity

__all__ = [
    "COSCHEDULING_LABEL",
    "JOBSET_LABEL",
    "KAI_GROUP_KEY",
    "KUEUE_GROUP_LABEL",
    "KUEUE_TOTAL_ANNOTATION",
    "VOLCANO_GROUP_ANNOTATIONS",
    "VOLCANO_MIN_MEMBER_ANNOTATION",
    "GroupRef",
    "PodGroupSource",
    "PodSelector",
    "group_ref",
    "is_provisionable",
    "is_unschedulable",
    "requests_gpus",
    "resolve_group",
    "tolerates_gpu_pool",
]

log = logging.getLogger(__name__)

Pod = Mapping[str, Any]
GroupKind = Literal["kueue", "coscheduling", "kai", "volcano", "job", "jobset"]

KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
VOLCANO_MIN_MEMBER_ANNOTATION = "scheduling.volcano.sh/group-min-member"
KAI_GROUP_KEY = "pod-group-name"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
WORKLOAD_KINDS = ("job", "jobset")
"""Gangs only when Kueue manages the workload: the source says so (and how big it is), or it is no gang."""

_HARD_EFFECTS = (None, "", "NoSchedule", "NoExecute")


def is_unschedulable(pod: Pod) -> bool:
    """The scheduler tried and found no node: PodScheduled is False with reason Unschedulable.

    Other reasons (SchedulingGated, say, while Kueue has not admitted the pod) mean new capacity would not help yet.
    """
    for condition in pod.get("status", {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled":
            return condition.get("status") == "False" and condition.get("reason") == "Unschedulable"
    return False


def is_provisionable(pod: Pod) -> bool:
    """Pending, unbound, not being deleted, not waiting on a preemption, and not a DaemonSet's.

    A pod with a nominated node will run there once its victims are gone; a DaemonSet pod is pinned to
    one existing node. New capacity helps neither.
    """
    metadata = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    if metadata.get("deletionTimestamp") or spec.get("nodeName") or status.get("nominatedNodeName"):
        return False
    if status.get("phase", "Pending") != "Pending":
        return False
    return not any(ref.get("kind") == "DaemonSet" for ref in metadata.get("ownerReferences") or ())


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield from spec.get("containers") or ()
    yield from spec.get("initContainers") or ()


def requests_gpus(pod: Pod) -> bool:
    """A whole GPU or a MIG slice, in requests or in limits (extended resources may give limits only)."""
    spec = pod.get("spec", {})
    for container in _containers(spec):
        resources = container.get("resources") or {}
        for amounts in (resources.get("requests") or {}, resources.get("limits") or {}):
            for name, quantity in amounts.items():
                if is_gpu_resource(name) and _positive(quantity):
                    return True
    return False


def _positive(quantity: object) -> bool:
    try:
        return parse_quantity(quantity) > 0  # type: ignore[arg-type]
    except ValueError:
        return False


def tolerates_gpu_pool(pod: Pod, taint_keys: Iterable[str]) -> bool:
    """A toleration naming a GPU pool's taint key: the pod is meant for GPU nodes even without a GPU request.

    A key-less `Exists` toleration (tolerate everything, as system pods do) says nothing about intent and
    does not count; nor does one only for PreferNoSchedule, which never keeps a pod off a node.
    """
    keys = set(taint_keys)
    for toleration in pod.get("spec", {}).get("tolerations") or ():
        if toleration.get("key") in keys and toleration.get("effect") in _HARD_EFFECTS:
            return True
    return False


class PodSelector:
    """The rule for what is reported: unschedulable, provisionable, and GPU by request or by toleration."""

    def __init__(self, gpu_taint_keys: Iterable[str]) -> None:
        self.gpu_taint_keys = tuple(gpu_taint_keys)

    def is_gpu_pod(self, pod: Pod) -> bool:
        """A GPU request or toleration; or DRA claims, which may ask for GPUs (the watcher reads them to know)."""
        return (requests_gpus(pod) or tolerates_gpu_pool(pod, self.gpu_taint_keys)
                or bool(pod.get("spec", {}).get("resourceClaims")))

    def gpu_by_spec(self, pod: Pod) -> bool:
        return requests_gpus(pod) or tolerates_gpu_pool(pod, self.gpu_taint_keys)

    def reportable(self, pod: Pod) -> bool:
        return is_provisionable(pod) and is_unschedulable(pod) and self.is_gpu_pod(pod)


@dataclass(frozen=True)
class GroupRef:
    """A pod's gang as its scheduler names it, with the size when the pod itself says it."""

    kind: GroupKind
    namespace: str
    name: str
    min_member: int | None = None


def group_ref(pod: Pod) -> GroupRef | None:
    """Kueue, the coscheduling plugin, KAI, Volcano, then the JobSet or Job the pod belongs to."""
    metadata = pod.get("metadata", {})
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    namespace = metadata.get("namespace") or "default"
    if name := labels.get(KUEUE_GROUP_LABEL):
        return GroupRef("kueue", namespace, name, _count(annotations.get(KUEUE_TOTAL_ANNOTATION)))
    if name := labels.get(COSCHEDULING_LABEL):
        return GroupRef("coscheduling", namespace, name)
    if name := annotations.get(KAI_GROUP_KEY) or labels.get(KAI_GROUP_KEY):
        return GroupRef("kai", namespace, name)
    for key in VOLCANO_GROUP_ANNOTATIONS:
        if name := annotations.get(key):
            return GroupRef("volcano", namespace, name, _count(annotations.get(VOLCANO_MIN_MEMBER_ANNOTATION)))
    if name := labels.get(JOBSET_LABEL):
        return GroupRef("jobset", namespace, name)
    for owner in metadata.get("ownerReferences") or ():
        if owner.get("kind") == "Job" and str(owner.get("apiVersion", "")).startswith("batch/") and owner.get("name"):
            return GroupRef("job", namespace, owner["name"])
    return None


def _count(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        log.warning("ignoring gang size %r: not an integer", text)
        return None
    return value if value >= 1 else None


class PodGroupSource(Protocol):
    """What the cluster says about a gang beyond the pod: its PodGroup resource, or its members."""

    def min_member(self, ref: GroupRef) -> int | None:
        """`spec.minMember` of the group's PodGroup resource; None when there is none (or no such CRD)."""
        ...

    def member_count(self, ref: GroupRef) -> int | None:
        """How many live pods carry the group's label; None when members cannot be found by label."""
        ...

    def workload_size(self, ref: GroupRef) -> int | None:
        """Pods a Kueue-managed Job or JobSet starts together; None when Kueue does not manage it."""
        ...


def resolve_group(ref: GroupRef, source: PodGroupSource) -> PodGroup | None:
    """The pod's own count wins, then the PodGroup resource, then the members seen; at least 1.

    A gang whose size is unknown is still reported under its name, so the packer keeps its pods together.
    A Job or JobSet is a gang only when Kueue admits it (None otherwise), named after its kind.
    """
    if ref.kind in WORKLOAD_KINDS:
        total = source.workload_size(ref)
        return PodGroup(name=f"{ref.kind}.{ref.name}", min_member=total) if total else None
    size = ref.min_member
    if size is None and ref.kind in ("coscheduling", "kai", "volcano"):
        size = source.min_member(ref)
    if size is None and ref.kind in ("coscheduling", "kueue"):
        size = source.member_count(ref)
    return PodGroup(name=ref.name, min_member=max(size or 1, 1))

"""What the autoscaler sees of the Kubernetes cluster: nodes, the pods bound to them, volume attachments."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from gpu_autoscaler.models.cached import CachedModel
from gpu_autoscaler.models.durations import parse_duration
from gpu_autoscaler.models.labels import DO_NOT_DISRUPT
from gpu_autoscaler.models.pods import PodAntiAffinity
from gpu_autoscaler.models.requirements import NodeSelectorTerm, PreferredSchedulingTerm
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint, Toleration

__all__ = ["CRITICAL_PRIORITY_CLASSES", "ClusterNode", "ClusterPod", "EvictionOutcome", "VolumeAttachment"]

CRITICAL_PRIORITY_CLASSES = frozenset({"system-cluster-critical", "system-node-critical"})
"""Pods of these classes are evicted after every other pod of a node (Kubernetes' graceful node shutdown order,
which Karpenter's terminator follows)."""
DEFAULT_GRACE_SECONDS = 30
"""`spec.terminationGracePeriodSeconds` when a pod does not say (the API server's default)."""


class ClusterNode(CachedModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, ignored_types=(cached_property,))

    name: str
    provider_id: str | None = None
    """`aws:///<zone>/<instance-id>`."""
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: Resources = Field(default_factory=Resources)
    unschedulable: bool = False
    ready: bool = False
    created_at: datetime | None = None
    ready_since: datetime | None = None
    """The Ready condition's `lastTransitionTime`, while the node is Ready: its boot's end, for boot times."""
    annotations: dict[str, str] = Field(default_factory=dict)

    @property
    def do_not_disrupt(self) -> bool:
        """`karpenter.sh/do-not-disrupt: "true"` on the Node: no voluntary disruption of it (Karpenter reads only
        "true" at node level; durations are a pod-level form)."""
        return self.annotations.get(DO_NOT_DISRUPT) == "true"

    @cached_property
    def instance_id(self) -> str | None:
        return self.provider_id.rsplit("/", 1)[-1] if self.provider_id else None


class ClusterPod(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    uid: str
    namespace: str
    name: str
    node_name: str | None = None
    requests: Resources = Field(default_factory=Resources)
    annotations: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    owner_kind: str | None = None
    """`DaemonSet` pods are never evicted by a drain; mirror pods (static) neither."""
    mirror: bool = False
    phase: str = "Pending"
    unschedulable: bool = False
    """Its `PodScheduled` condition is False with reason Unschedulable: the scheduler tried and found no node (not
    SchedulingGated, say, while Kueue has not admitted it). What the agent reports; `domain.agent_witness` counts
    it."""
    ready: bool = True
    """Its `Ready` condition is True (the API server's `IsPodReady`; a pod read from the API without it is not). Only
    PodDisruptionBudgets read it: a pod not Ready is not among a budget's healthy pods, and its eviction may go past
    a spent budget (`unhealthyPodEvictionPolicy`)."""
    # What the pod asks of a node, copied from its spec: a replacement for an interrupted node is planned
    # from these, by the same solver that plans pending pods.
    node_selector: dict[str, str] = Field(default_factory=dict)
    required_node_affinity: tuple[NodeSelectorTerm, ...] = ()
    preferred_node_affinity: tuple[PreferredSchedulingTerm, ...] = ()
    """As written: a replacement or a consolidation move honours it as a pending pod's (`PendingPod`), as Karpenter's
    scheduler does for the pods its disruption simulates moving."""
    tolerations: tuple[Toleration, ...] = ()
    pod_anti_affinity: tuple[PodAntiAffinity, ...] = ()
    """Its required pod anti-affinity terms on the node (`kubernetes.io/hostname`) that select pods, as written:
    kube-scheduler puts the pod recreated elsewhere on no node holding a pod one of them counts, nor any pod beside
    it whose own terms count it (InterPodAffinity), so a consolidation move is planned the same way."""
    priority: int = 0
    created_at: datetime | None = None
    priority_class_name: str | None = None
    started_at: datetime | None = None
    """`status.startTime`: a do-not-disrupt duration counts from it."""
    deletion_timestamp: datetime | None = None
    """`metadata.deletionTimestamp`: set once the pod is being deleted (evicted or deleted), to the moment its
    grace period ends; the pod stays listed, terminating, until its kubelet confirms it stopped."""
    termination_grace_period_seconds: int = DEFAULT_GRACE_SECONDS
    volume_claims: tuple[str, ...] = ()
    """Names of the PersistentVolumeClaims its volumes use (same namespace)."""
    volume_zones: tuple[str, ...] | None = None
    """Zones every one of those claims' bound PersistentVolumes can be attached in (their node affinity: an EBS
    volume lives in one zone); None when they allow any, or were not read. The pod recreated elsewhere keeps its
    claims, so kube-scheduler's VolumeBinding filter holds it to these zones: a replacement or a consolidation
    move is planned within them, as `PendingPod.volume_zones`. Empty: no zone holds them all."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminating(self) -> bool:
        return self.deletion_timestamp is not None

    @property
    def finished(self) -> bool:
        """Succeeded or Failed: its containers will not run again, it holds nothing on its node."""
        return self.phase in ("Succeeded", "Failed")

    @property
    def critical(self) -> bool:
        return self.priority_class_name in CRITICAL_PRIORITY_CLASSES

    def do_not_disrupt_active(self, now: datetime | None = None) -> bool:
        """`karpenter.sh/do-not-disrupt` as Karpenter reads it (pkg/utils/pod `IsDoNotDisruptActive`): "true"
        protects for as long as it is there; a duration (`"30m"`, `"1h30m"`) protects until the pod's start time
        plus that long (always, while the start is unknown or `now` is not given); anything else is as if absent."""
        value = self.annotations.get(DO_NOT_DISRUPT)
        if value is None:
            return False
        if value == "true":
            return True
        try:
            duration = parse_duration(value)
        except ValueError:
            return False
        if duration <= timedelta(0):
            return False
        if self.started_at is None or now is None:
            return True
        return now < self.started_at + duration


class EvictionOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    pod: str
    evicted: bool
    blocked: bool = False
    """A PodDisruptionBudget refused the eviction (HTTP 429, or 500 for a pod several budgets select): retry later."""
    gone: bool = False
    message: str = ""


class VolumeAttachment(BaseModel):
    """A storage.k8s.io/v1 VolumeAttachment on a node: the attach/detach controller deletes it once the volume is
    detached, which happens only after the pods using it are gone. Terminating the instance before then risks
    the volume's data (Karpenter's termination controller waits for them)."""

    model_config = ConfigDict(frozen=True)

    name: str
    node_name: str
    persistent_volume: str | None = None
    """`spec.source.persistentVolumeName` (None for an inline volume)."""
    claim: str | None = None
    """`namespace/name` of the PersistentVolumeClaim bound to that volume, when known."""

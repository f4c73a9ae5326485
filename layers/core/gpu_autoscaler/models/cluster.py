"""What the autoscaler sees of the Kubernetes cluster: nodes and the pods bound to them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from gpu_autoscaler.models.labels import DO_NOT_DISRUPT
from gpu_autoscaler.models.requirements import NodeSelectorTerm
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint, Toleration

__all__ = ["ClusterNode", "ClusterPod", "EvictionOutcome"]


class ClusterNode(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

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

    @property
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
    # What the pod asks of a node, copied from its spec: a replacement for an interrupted node is planned
    # from these, by the same solver that plans pending pods.
    node_selector: dict[str, str] = Field(default_factory=dict)
    required_node_affinity: tuple[NodeSelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    created_at: datetime | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def do_not_disrupt(self) -> bool:
        return self.annotations.get(DO_NOT_DISRUPT) == "true"


class EvictionOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    pod: str
    evicted: bool
    blocked: bool = False
    """A PodDisruptionBudget refused the eviction (HTTP 429): retry later."""
    gone: bool = False
    message: str = ""

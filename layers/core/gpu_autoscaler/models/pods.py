"""The pending-pods document the agent sends, and the pods in it.

Kubernetes shapes and quantity strings, so the agent copies fields straight from the Pod.
"""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpu_autoscaler.models.labels import DO_NOT_DISRUPT
from gpu_autoscaler.models.requirements import NodeSelectorTerm
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Toleration

__all__ = ["PendingPod", "PendingPodsDocument", "PodGroup"]


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class PodGroup(_Wire):
    """A gang: all `min_member` pods are placed together or none is."""

    name: str = Field(min_length=1)
    min_member: int = Field(alias="minMember", ge=1)


class PendingPod(_Wire):
    uid: str = Field(min_length=1)
    namespace: str = "default"
    name: str
    created_at: datetime | None = Field(default=None, alias="createdAt")
    requests: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    required_node_affinity: tuple[NodeSelectorTerm, ...] = Field(default=(), alias="requiredNodeAffinity")
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    pod_group: PodGroup | None = Field(default=None, alias="podGroup")
    annotations: dict[str, str] = Field(default_factory=dict)

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True, ignored_types=(cached_property,))

    @field_validator("requests")
    @classmethod
    def _quantities(cls, requests: dict[str, str]) -> dict[str, str]:
        Resources.from_quantities(requests)  # raises with the offending quantity named
        return requests

    @cached_property
    def resources(self) -> Resources:
        return Resources.from_quantities(self.requests)

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


class PendingPodsDocument(_Wire):
    schema_version: Literal[1] = Field(alias="schemaVersion")
    cluster: str = Field(min_length=1)
    sent_at: datetime = Field(alias="sentAt")
    pods: list[PendingPod]

"""Taints on nodes and tolerations on pods, with Kubernetes' matching rules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpu_autoscaler.models.labels import GANG_LABEL, label_value

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["Taint", "Toleration", "gang_taint", "tolerates_all"]

Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Taint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(min_length=1)
    value: str = ""
    effect: Effect = "NoSchedule"


class Toleration(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Effect | None = None
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")

    def tolerates(self, taint: Taint) -> bool:
        """An empty key with Exists tolerates everything; an empty effect matches every effect."""
        if self.effect is not None and self.effect != taint.effect:
            return False
        if self.key is None or self.key == "":
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or (self.value or "") == taint.value


def tolerates_all(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> bool:
    """PreferNoSchedule never blocks scheduling, so only the hard effects must be tolerated."""
    tols = list(tolerations)
    return all(
        taint.effect == "PreferNoSchedule" or any(t.tolerates(taint) for t in tols) for taint in taints
    )


def gang_taint(gang: str) -> Taint:
    """Keeps a gang's nodes for the gang until it is bound: registered by the kubelet with the node, tolerated
    by the gang's pods (the agent adds the toleration to them), removed by the agent once no member is pending,
    so no other pod takes the room first and leaves the gang waiting for another node."""
    return Taint(key=GANG_LABEL, value=label_value(gang), effect="NoSchedule")

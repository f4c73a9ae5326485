"""`ports.DisruptionBudgets` over a `MemoryCluster`'s budgets: the same rule its evictions apply."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpu_autoscaler.adapters.memory.cluster import MemoryCluster
    from gpu_autoscaler.models.cluster import ClusterPod

__all__ = ["MemoryDisruptionBudgets"]


class MemoryDisruptionBudgets:
    """A running pod is blocked while a budget selecting it allows no disruption (as `MemoryCluster.evict`)."""

    def __init__(self, cluster: MemoryCluster) -> None:
        self.cluster = cluster

    def blocked(self, pods: Sequence[ClusterPod]) -> set[str]:
        budgets = list(self.cluster.budgets().values())
        if not budgets:
            return set()
        everyone = self.cluster.list_pods()
        exhausted = [b for b in budgets if b.disruptions_allowed(everyone) < 1]
        return {p.uid for p in pods if p.phase == "Running" and any(b.selects(p) for b in exhausted)}

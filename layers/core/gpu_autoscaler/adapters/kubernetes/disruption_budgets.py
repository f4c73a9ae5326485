"""`ports.DisruptionBudgets` over the Kubernetes API: policy/v1 PodDisruptionBudgets, read as JSON.

The eviction subresource (kubernetes `registry/core/pod/storage/eviction.go`; the Kubernetes documentation's
"API-initiated eviction" and "Specifying a Disruption Budget for your Application") refuses an eviction of a pod

- selected by more than one budget, whatever they allow: 500 (Karpenter's `isEvictable` holds such a pod
  unevictable too);
- selected by one budget whose `status.disruptionsAllowed` is 0: 429 — unless the pod is Running but not Ready
  and the budget's `unhealthyPodEvictionPolicy` is `AlwaysAllow`, or is the default `IfHealthyBudget` while the
  budget's healthy pods still meet it (`currentHealthy >= desiredHealthy > 0`): such a pod is not among the
  healthy ones the budget guards, and goes. An unknown policy is read as the API server reads it, like a Ready pod.

Consolidation asks the same question before it starts a drain. A budget the disruption controller has not
written a status for yet allows nothing (the API server treats it so); pods not Running are evicted whatever
their budgets say, so they are never blocked.
Selectors follow `metav1.LabelSelector`: `matchLabels` and `matchExpressions` (In, NotIn, Exists,
DoesNotExist) all hold; an empty selector selects every pod of the namespace, a missing one none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.kubernetes.rest import KubernetesRest, path
from gpu_autoscaler.models.pods import selects

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gpu_autoscaler.adapters.kubernetes.rest import ApiClientLike
    from gpu_autoscaler.models.cluster import ClusterPod

__all__ = ["KubernetesDisruptionBudgets"]

_PAGE = 500


def _may_evict(pod: ClusterPod, budget: Mapping[str, Any]) -> bool:
    """Whether the one budget selecting this running pod lets its eviction through now."""
    status = budget.get("status") or {}
    if not pod.ready:
        policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
        if policy == "AlwaysAllow":
            return True
        desired = int(status.get("desiredHealthy") or 0)
        if policy == "IfHealthyBudget" and int(status.get("currentHealthy") or 0) >= desired > 0:
            return True
    return int(status.get("disruptionsAllowed") or 0) >= 1


class KubernetesDisruptionBudgets:
    def __init__(self, api: KubernetesRest | ApiClientLike, *,
                 request_timeout: tuple[float, float] = (5.0, 30.0)) -> None:
        self._rest = KubernetesRest.of(api, request_timeout)

    def blocked(self, pods: Sequence[ClusterPod]) -> set[str]:
        budgets = self._budgets()
        if not budgets:
            return set()
        by_namespace: dict[str | None, list[dict[str, Any]]] = {}
        for budget in budgets:
            by_namespace.setdefault((budget.get("metadata") or {}).get("namespace"), []).append(budget)
        out: set[str] = set()
        for pod in pods:
            if pod.phase != "Running":
                continue
            covering = [b for b in by_namespace.get(pod.namespace, ())
                        if selects((b.get("spec") or {}).get("selector"), pod.labels)]
            if len(covering) > 1 or (covering and not _may_evict(pod, covering[0])):
                out.add(pod.uid)
        return out

    def _budgets(self) -> list[dict[str, Any]]:
        """Every budget of the cluster (an error status or an unreachable server: `KubernetesApiError`)."""
        return self._rest.list_items(path("apis", "policy", "v1", "poddisruptionbudgets"), lambda budget: budget,
                                     page_size=_PAGE)

"""`ports.DisruptionBudgets` over the Kubernetes API: policy/v1 PodDisruptionBudgets, read as JSON.

The eviction subresource refuses (429) an eviction of a pod selected by a budget whose
`status.disruptionsAllowed` is 0; consolidation asks the same question before it starts a drain. A budget
the disruption controller has not written a status for yet allows nothing (the API server treats it so);
pods not Running are evicted whatever their budgets say, so they are never blocked.
Selectors follow `metav1.LabelSelector`: `matchLabels` and `matchExpressions` (In, NotIn, Exists,
DoesNotExist) all hold; an empty selector selects every pod of the namespace, a missing one none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpu_autoscaler.adapters.kubernetes.rest import KubernetesRest, path
from gpu_autoscaler.models.requirements import Requirement

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gpu_autoscaler.adapters.kubernetes.rest import ApiClientLike
    from gpu_autoscaler.models.cluster import ClusterPod

__all__ = ["KubernetesDisruptionBudgets", "selector_matches"]

_PAGE = 500


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A `metav1.LabelSelector` against a pod's labels (None: selects nothing)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        try:
            requirement = Requirement(key=expression["key"], operator=expression["operator"],
                                      values=tuple(expression.get("values") or ()))
        except (KeyError, ValidationError):
            return False  # a selector the API server would have rejected: treat it as selecting nothing
        if not requirement.matches(labels):
            return False
    return True


class KubernetesDisruptionBudgets:
    def __init__(self, api: KubernetesRest | ApiClientLike, *,
                 request_timeout: tuple[float, float] = (5.0, 30.0)) -> None:
        self._rest = KubernetesRest.of(api, request_timeout)

    def blocked(self, pods: Sequence[ClusterPod]) -> set[str]:
        exhausted = [b for b in self._budgets() if int((b.get("status") or {}).get("disruptionsAllowed") or 0) < 1]
        out: set[str] = set()
        for budget in exhausted:
            namespace = (budget.get("metadata") or {}).get("namespace")
            selector = (budget.get("spec") or {}).get("selector")
            out.update(p.uid for p in pods if p.phase == "Running" and p.namespace == namespace
                       and selector_matches(selector, p.labels))
        return out

    def _budgets(self) -> list[dict[str, Any]]:
        """Every budget of the cluster (an error status or an unreachable server: `KubernetesApiError`)."""
        return self._rest.list_items(path("apis", "policy", "v1", "poddisruptionbudgets"), page_size=_PAGE)

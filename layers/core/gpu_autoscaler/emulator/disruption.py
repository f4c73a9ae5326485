"""PodDisruptionBudgets: their status, and whether an eviction may go ahead — the eviction subresource's rules.

Follows `registry/core/pod/storage/eviction.go` and the disruption controller:

- a pod that is Pending, Succeeded, Failed or already terminating is evicted without consulting budgets;
- a pod covered by no budget is evicted; by more than one, the eviction fails (500), as upstream;
- otherwise the budget must allow a disruption: healthy pods (Running and Ready) above the desired number
  (`minAvailable`, or the selected pods less `maxUnavailable`; percentages rounded up). If not: 429
  TooManyRequests, with the `DisruptionBudget` cause the real server gives;
- an unready pod is evicted without spending the budget when the budget is already met
  (`unhealthyPodEvictionPolicy: IfHealthyBudget`, the default) or always (`AlwaysAllow`).

The status is computed from the pods at the moment of the eviction, under the store's lock, so two
concurrent evictions can never both spend the last allowed disruption. There are no workload controllers
here to ask for their scale, and nothing recreates an evicted pod, so the expected pod count is the most
pods the budget has selected (kept in its status): an eviction lowers the healthy count, never the
expectation, and `maxUnavailable: 1` allows one pod down until a replacement is Running and Ready.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.kube_objects import ApiError
from gpu_autoscaler.emulator.kube_selectors import labels_match, selector_from_object

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = ["BudgetStatus", "budget_status", "budgets_for", "check_eviction", "is_ready", "is_terminal"]

_TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class BudgetStatus:
    expected_pods: int
    current_healthy: int
    desired_healthy: int

    @property
    def disruptions_allowed(self) -> int:
        return max(self.current_healthy - self.desired_healthy, 0)

    def as_status(self, generation: int) -> dict[str, Any]:
        return {"observedGeneration": generation, "disruptionsAllowed": self.disruptions_allowed,
                "currentHealthy": self.current_healthy, "desiredHealthy": self.desired_healthy,
                "expectedPods": self.expected_pods}


def is_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in _TERMINAL


def _scaled(value: int | str, total: int) -> int:
    """An IntOrString: an integer, or a percentage of `total` rounded up."""
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.endswith("%"):
        return math.ceil(int(text[:-1]) * total / 100)
    return int(text)


def budgets_for(pod: Mapping[str, Any], budgets: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Budgets in the pod's namespace whose selector matches it (policy/v1: `{}` matches all, null none)."""
    metadata = pod.get("metadata") or {}
    namespace = metadata.get("namespace")
    labels = metadata.get("labels") or {}
    return [
        b for b in budgets
        if (b.get("metadata") or {}).get("namespace") == namespace
        and labels_match(selector_from_object((b.get("spec") or {}).get("selector")), labels)
    ]


def budget_status(budget: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> BudgetStatus:
    spec = budget.get("spec") or {}
    namespace = (budget.get("metadata") or {}).get("namespace")
    selector = selector_from_object(spec.get("selector"))
    selected = [
        p for p in pods
        if (p.get("metadata") or {}).get("namespace") == namespace
        and not is_terminal(p)
        and labels_match(selector, (p.get("metadata") or {}).get("labels") or {})
    ]
    healthy = sum(1 for p in selected if is_ready(p) and not (p.get("metadata") or {}).get("deletionTimestamp"))
    status = budget.get("status") or {}
    seen = status.get("expectedPods") or 0
    if status.get("observedGeneration") != (budget.get("metadata") or {}).get("generation", 1):
        seen = 0  # a changed budget starts counting again
    expected = max(len(selected), seen)
    if spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected)
    elif spec.get("maxUnavailable") is not None:
        desired = max(expected - _scaled(spec["maxUnavailable"], expected), 0)
    else:
        desired = expected
    return BudgetStatus(expected, healthy, desired)


def check_eviction(pod: Mapping[str, Any], budgets: Iterable[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
                   ) -> None:
    """Return if the pod may be evicted now; raise the API server's error (429, 500) if not."""
    metadata = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") in ("Pending", *_TERMINAL) or metadata.get("deletionTimestamp"):
        return
    covering = budgets_for(pod, budgets)
    if not covering:
        return
    if len(covering) > 1:
        raise ApiError(500, "InternalError",
                       "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
                       "support.")
    budget = covering[0]
    status = budget_status(budget, pods)
    if not is_ready(pod):
        policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
        if policy == "AlwaysAllow" or (status.current_healthy >= status.desired_healthy > 0):
            return
    if status.disruptions_allowed <= 0:
        name = (budget.get("metadata") or {}).get("name")
        raise ApiError(
            429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
            {"causes": [{"reason": "DisruptionBudget",
                         "message": f"The disruption budget {name} needs {status.desired_healthy} healthy pods "
                                    f"and has {status.current_healthy} currently"}]},
        )

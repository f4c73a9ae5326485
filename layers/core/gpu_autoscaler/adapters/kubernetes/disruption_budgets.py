"""`ports.DisruptionBudgets` over the real `kubernetes` client: policy/v1 PodDisruptionBudgets, read as JSON.

The eviction subresource refuses (429) an eviction of a pod selected by a budget whose
`status.disruptionsAllowed` is 0; consolidation asks the same question before it starts a drain. A budget
the disruption controller has not written a status for yet allows nothing (the API server treats it so);
pods not Running are evicted whatever their budgets say, so they are never blocked.
Selectors follow `metav1.LabelSelector`: `matchLabels` and `matchExpressions` (In, NotIn, Exists,
DoesNotExist) all hold; an empty selector selects every pod of the namespace, a missing one none.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from gpu_autoscaler.errors import KubernetesApiError
from gpu_autoscaler.models.requirements import Requirement

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

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
    def __init__(self, api_client: k8s.ApiClient, *, policy_api: k8s.PolicyV1Api | None = None,
                 request_timeout: tuple[float, float] = (5.0, 30.0)) -> None:
        self._policy = policy_api or k8s.PolicyV1Api(api_client)
        self._timeout = request_timeout

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
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            try:
                # Raw JSON (`_preload_content=False`): the response is urllib3's, not the client's model.
                response: Any = self._policy.list_pod_disruption_budget_for_all_namespaces(
                    limit=_PAGE, _continue=token, _preload_content=False, _request_timeout=self._timeout)
            except ApiException as error:
                raise KubernetesApiError(f"list PodDisruptionBudgets: HTTP {error.status} {error.reason}") from error
            except (urllib3.exceptions.HTTPError, OSError) as error:
                raise KubernetesApiError(f"Kubernetes API unreachable: {error}") from error
            page = json.loads(response.data)
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

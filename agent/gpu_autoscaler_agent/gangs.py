"""Keeps the nodes launched for a gang for the gang, from the moment they join until the gang is bound.

A gang's nodes register with the taint `gpu-autoscaler/gang=<gang>:NoSchedule` (their user data says so, see
`gpu_autoscaler.models.taints.gang_taint`). Without it, kube-scheduler fills the first gang node to join
with whatever small pods are pending, and the gang — which binds whole or not at all — waits another
scheduling round and another node boot. Here the agent:

- adds the toleration for that taint to each pending member of a gang (adding tolerations is an update
  the API server allows on an existing pod), before it reports the pod, so the report and the pod agree;
- counts each gang's pending members, and when none is left (bound, or deleted) takes the taint off the
  gang's nodes, so what room the gang leaves is anyone's again. Nodes are found by the `gpu-autoscaler/gang`
  label the same user data sets. A sweep after every list and every watch window releases nodes whose gang
  has no pending member any more (one that joined after its gang gave up, or one missed while away).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler.models.labels import GANG_LABEL, label_value
from gpu_autoscaler.models.taints import gang_taint
from gpu_autoscaler_agent.api_errors import CALL_FAILURES, describe_error

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler_agent.health import Metrics

__all__ = ["GangHold"]

log = logging.getLogger(__name__)

_GONE = (404, 409)
"""The pod or node is gone, or changed since it was read: the next event brings it round again."""


class GangHold:
    def __init__(self, api_client: client.ApiClient, metrics: Metrics, *,
                 core_api: client.CoreV1Api | None = None) -> None:
        self._core = core_api or client.CoreV1Api(api_client)
        self._metrics = metrics
        self._pending: dict[str, set[str]] = {}
        """Gang (its label value) → uids of its members seen pending."""
        self._gang_of: dict[str, str] = {}

    # Pods

    def tolerate(self, pod: Mapping[str, Any], gang: str) -> Mapping[str, Any]:
        """The pod, with the toleration for its gang's nodes (patched in if it lacked it)."""
        taint = gang_taint(gang)
        tolerations = list((pod.get("spec") or {}).get("tolerations") or ())
        if any(t.get("key") == taint.key and t.get("value") == taint.value for t in tolerations):
            return pod
        wanted = {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
        metadata = pod.get("metadata") or {}
        # JSON patch: append to the list the pod has (a merge patch would replace it), and only if the pod is
        # still the version read, so a toleration another writer added meanwhile is never lost.
        operations = [{"op": "test", "path": "/metadata/resourceVersion", "value": metadata.get("resourceVersion")}]
        operations.append({"op": "add", "path": "/spec/tolerations/-", "value": wanted} if tolerations
                          else {"op": "add", "path": "/spec/tolerations", "value": [wanted]})
        try:
            response: Any = self._core.patch_namespaced_pod(
                str(metadata.get("name")), metadata.get("namespace") or "default", operations, _preload_content=False)
        except ApiException as error:
            if error.status in (*_GONE, 422):
                log.info("pod %s/%s changed before its gang toleration was added; next time",
                         metadata.get("namespace"), metadata.get("name"))
                return pod
            raise
        self._metrics.inc("gang_tolerations_added_total")
        patched: Mapping[str, Any] = json.loads(response.data)
        return patched

    def track(self, uid: str, gang: str | None) -> None:
        """`gang` when the pod is a pending member, None when it is not (any more): bound, deleted, not a member.
        The last pending member leaving releases the gang's nodes."""
        value = label_value(gang) if gang else None
        before = self._gang_of.get(uid)
        if before == value:
            return
        if before is not None:
            del self._gang_of[uid]
            members = self._pending.get(before, set())
            members.discard(uid)
            if not members:
                self._pending.pop(before, None)
                self.release(before)
        if value is not None:
            self._gang_of[uid] = value
            self._pending.setdefault(value, set()).add(uid)

    def forget_all(self) -> None:
        """Before a full list hands over every pending pod again."""
        self._pending.clear()
        self._gang_of.clear()

    # Nodes

    def release(self, gang_value: str) -> None:
        for node in self._nodes(f"{GANG_LABEL}={gang_value}"):
            self._untaint(node)

    def sweep(self) -> None:
        """Release every held node whose gang has no pending member."""
        for node in self._nodes(GANG_LABEL):
            value = ((node.get("metadata") or {}).get("labels") or {}).get(GANG_LABEL)
            if value not in self._pending:
                self._untaint(node)

    def _nodes(self, selector: str) -> list[dict[str, Any]]:
        """Tainted gang nodes; none when they cannot be listed now (logged: the next sweep lists them again)."""
        try:
            response: Any = self._core.list_node(label_selector=selector, _preload_content=False)
        except CALL_FAILURES as error:
            log.warning("cannot list gang nodes (%s); the next sweep tries again", describe_error(error))
            return []
        nodes: list[dict[str, Any]] = json.loads(response.data).get("items") or []
        return [n for n in nodes if any(t.get("key") == GANG_LABEL for t in (n.get("spec") or {}).get("taints") or ())]

    def _untaint(self, node: Mapping[str, Any]) -> None:
        metadata = node.get("metadata") or {}
        taints = [t for t in (node.get("spec") or {}).get("taints") or () if t.get("key") != GANG_LABEL]
        operations: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": metadata.get("resourceVersion")},
            {"op": "replace", "path": "/spec/taints", "value": taints}]
        try:
            self._core.patch_node(str(metadata.get("name")), operations)
        except CALL_FAILURES as error:
            if isinstance(error, ApiException) and error.status in (*_GONE, 422):
                log.info("node %s changed before its gang taint was removed; the next sweep does it",
                         metadata.get("name"))
            else:
                log.warning("cannot take the gang taint off node %s (%s); the next sweep tries again",
                            metadata.get("name"), describe_error(error))
            return
        self._metrics.inc("gang_nodes_released_total")
        log.info("gang %s is bound: node %s is open to every pod", metadata.get("labels", {}).get(GANG_LABEL),
                 metadata.get("name"))

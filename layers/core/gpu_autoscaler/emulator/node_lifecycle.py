"""What the control plane does to the Node of a stopped instance: it stays, NotReady, tainted — never deleted.

A stopped instance's kubelet posts no status. kube-controller-manager's node lifecycle controller, once
`--node-monitor-grace-period` has passed without one, sets the Node's conditions to Unknown ("Kubelet stopped
posting node status.") and taints it `node.kubernetes.io/unreachable` (NoSchedule, and NoExecute for taint-based
eviction; Kubernetes docs, "Taints and Tolerations", taint based evictions). The cloud controller manager's node
lifecycle controller (k8s.io/cloud-provider controllers/nodelifecycle) then looks at a Node that is not Ready: "If
deleted, it deletes the node resource. If shutdown it applies a shutdown taint"
(`node.cloudprovider.kubernetes.io/shutdown:NoSchedule`); cloud-provider-aws calls an instance gone only when it is
terminated (`InstanceExistsByProviderID`) and shut down when it is stopped (`InstanceShutdownByProviderID`). So
the Node of a stopped instance stays until the instance is terminated (`LocalKubernetes.remove_instance`).

Started again, the kubelet posts its status (the conditions it had before), and both controllers take their taints
off. The taint manager's eviction of pods not tolerating `unreachable:NoExecute` (after their
`tolerationSeconds`, 300 s by default) is not played here.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.kube_objects import NODES, ApiError, format_time, remove_taints

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_store import Store

__all__ = ["NodeLifecycle", "STOPPED_TAINTS"]

STOPPED_TAINTS = (
    ("node.kubernetes.io/unreachable", "NoSchedule"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.cloudprovider.kubernetes.io/shutdown", "NoSchedule"),
)
_UNKNOWN = ("NodeStatusUnknown", "Kubelet stopped posting node status.")


class NodeLifecycle:
    def __init__(self, store: Store, clock: Clock, grace: timedelta) -> None:
        """`grace`: kube-controller-manager's `--node-monitor-grace-period` (small in tests)."""
        self._store = store
        self._clock = clock
        self.grace = grace
        self._lock = threading.Lock()
        self._stopped: dict[str, datetime] = {}
        """Node name → when its kubelet stopped posting status."""
        self._conditions: dict[str, list[dict[str, Any]]] = {}
        """Node name → the conditions its kubelet last posted, posted again when it starts."""

    def stopped(self, node: str) -> None:
        with self._lock:
            self._stopped.setdefault(node, self._clock.now())

    def started(self, node: str) -> bool:
        """The kubelet runs again: its status posted, the taints taken off. False if it was not stopped."""
        with self._lock:
            if self._stopped.pop(node, None) is None:
                return False
            conditions = self._conditions.pop(node, None)
        stamp = format_time(self._clock.now())

        def resume(obj: dict[str, Any]) -> dict[str, Any]:
            if conditions is not None:
                obj.setdefault("status", {})["conditions"] = [
                    {**c, "lastHeartbeatTime": stamp, "lastTransitionTime": stamp} for c in conditions]
            remove_taints(obj, lambda taint: (taint.get("key"), taint.get("effect")) in STOPPED_TAINTS)
            return obj

        self._update(node, resume)
        return True

    def forget(self, node: str) -> None:
        """The Node is deleted (its instance terminated)."""
        with self._lock:
            self._stopped.pop(node, None)
            self._conditions.pop(node, None)

    def reconcile(self) -> None:
        now = self._clock.now()
        with self._lock:
            due = [n for n, at in self._stopped.items() if now - at >= self.grace and n not in self._conditions]
        stamp = format_time(now)
        for node in due:
            def unknown(obj: dict[str, Any], node: str = node) -> dict[str, Any]:
                status = obj.setdefault("status", {})
                with self._lock:
                    self._conditions[node] = [dict(c) for c in status.get("conditions") or ()]
                status["conditions"] = [
                    {**c, "status": "Unknown", "reason": _UNKNOWN[0], "message": _UNKNOWN[1],
                     "lastTransitionTime": stamp} for c in status.get("conditions") or ()]
                spec = obj.setdefault("spec", {})
                present = {(t.get("key"), t.get("effect")) for t in spec.get("taints") or ()}
                spec["taints"] = [*(spec.get("taints") or ()), *(
                    {"key": key, "effect": effect, "timeAdded": stamp}
                    for key, effect in STOPPED_TAINTS if (key, effect) not in present)]
                return obj

            self._update(node, unknown)

    def _update(self, node: str, change: Any) -> None:
        try:
            self._store.update(NODES, "", node, change)
        except ApiError as error:
            if error.code != 404:
                raise

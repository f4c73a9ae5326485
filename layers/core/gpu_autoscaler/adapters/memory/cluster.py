"""A Kubernetes cluster in memory, implementing `ports.ClusterAPI` for unit tests and the simulator.

It keeps the semantics a drain or a consolidation depends on: cordoning sets `unschedulable` and adds
a taint once; an eviction is refused (`blocked`, the HTTP 429 of a PodDisruptionBudget) while a budget
allows no disruption or a blocking hook says so; evicting or deleting a pod that is already gone
reports `gone`. It records every call, so a test asserts what was done, and it can be told to fail.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.drain import LOAD_BALANCER_EXCLUSION
from gpu_autoscaler.errors import NodeNotFound
from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod, EvictionOutcome, VolumeAttachment

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpu_autoscaler.models.taints import Taint

__all__ = ["DisruptionBudget", "EvictionBlocker", "MemoryCluster"]

EvictionBlocker = Callable[[ClusterPod], str | None]
"""Returns why this eviction is refused now (a 429), or None to let it through."""


@dataclass
class DisruptionBudget:
    """A PodDisruptionBudget: pods of `namespace` whose labels include `match_labels`.

    Exactly one of `min_available` / `max_unavailable` is set, as in policy/v1. Healthy means phase
    Running; pods a controller has yet to replace count as unavailable, which is what keeps a
    budget blocking until the test (or the simulated scheduler) brings replicas back.
    """

    name: str
    namespace: str
    match_labels: dict[str, str]
    min_available: int | None = None
    max_unavailable: int | None = None
    expected: int | None = None
    """Replicas the owner wants; defaults to the matching pods seen when the budget is added."""

    def __post_init__(self) -> None:
        if (self.min_available is None) == (self.max_unavailable is None):
            raise ValueError("set exactly one of min_available and max_unavailable")

    def selects(self, pod: ClusterPod) -> bool:
        return pod.namespace == self.namespace and all(
            pod.labels.get(key) == value for key, value in self.match_labels.items()
        )

    def disruptions_allowed(self, pods: Iterable[ClusterPod]) -> int:
        selected = [p for p in pods if self.selects(p)]
        healthy = sum(1 for p in selected if p.phase == "Running")
        expected = self.expected if self.expected is not None else len(selected)
        if self.min_available is not None:
            return max(0, healthy - self.min_available)
        assert self.max_unavailable is not None
        return max(0, healthy - (expected - self.max_unavailable))


@dataclass
class _Calls:
    cordoned: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    """Pod keys (`namespace/name`) evicted, in order."""
    blocked: list[str] = field(default_factory=list)
    deleted_pods: list[str] = field(default_factory=list)
    delete_graces: list[int | None] = field(default_factory=list)
    """The grace period asked for with each pod deletion (None: the pod's own)."""
    deleted_nodes: list[str] = field(default_factory=list)
    tainted: list[str] = field(default_factory=list)
    untainted: list[str] = field(default_factory=list)


class MemoryCluster:
    """Nodes and pods in dictionaries; every `ClusterAPI` call acts on them at once.

    `recreate_evicted=True` makes controller-owned pods (anything with an `owner_kind` other than
    DaemonSet) come back as a new Pending pod after an eviction or deletion, as a ReplicaSet or Job
    would, so a consolidation or a replacement can be seen to pick them up.
    """

    def __init__(self, nodes: Iterable[ClusterNode] = (), pods: Iterable[ClusterPod] = (),
                 *, recreate_evicted: bool = False) -> None:
        self._nodes: dict[str, ClusterNode] = {}
        self._pods: dict[str, ClusterPod] = {}
        self._budgets: dict[str, DisruptionBudget] = {}
        self._attachments: dict[str, VolumeAttachment] = {}
        self._blockers: list[EvictionBlocker] = []
        self._fail_next: dict[str, Exception] = {}
        self._recreate = recreate_evicted
        self._serial = itertools.count(1)
        self.calls = _Calls()
        for node in nodes:
            self.add_node(node)
        for pod in pods:
            self.add_pod(pod)

    # -- setting the scene -------------------------------------------------------------------

    def add_node(self, node: ClusterNode) -> ClusterNode:
        self._nodes[node.name] = node
        return node

    def add_pod(self, pod: ClusterPod) -> ClusterPod:
        if pod.node_name is not None and pod.node_name not in self._nodes:
            raise NodeNotFound(f"pod {pod.key} bound to unknown node {pod.node_name}")
        self._pods[pod.uid] = pod
        return pod

    def update_node(self, node_name: str, **changes: object) -> ClusterNode:
        """Change a node as a kubelet would (`ready=True`, labels, allocatable)."""
        node = self._node(node_name)
        self._nodes[node_name] = node.model_copy(update=changes)
        return self._nodes[node_name]

    def bind(self, pod_uid: str, node_name: str, phase: str = "Running") -> ClusterPod:
        """What the scheduler and kubelet do: put a pod on a node and start it."""
        self._node(node_name)
        pod = self._pods[pod_uid].model_copy(update={"node_name": node_name, "phase": phase})
        self._pods[pod_uid] = pod
        return pod

    def attach(self, attachment: VolumeAttachment) -> VolumeAttachment:
        """A volume attached to a node (what the attach/detach controller records)."""
        self._attachments[attachment.name] = attachment
        return attachment

    def detach(self, name: str) -> None:
        self._attachments.pop(name, None)

    def add_budget(self, budget: DisruptionBudget) -> DisruptionBudget:
        if budget.expected is None:
            budget.expected = sum(1 for p in self._pods.values() if budget.selects(p))
        self._budgets[f"{budget.namespace}/{budget.name}"] = budget
        return budget

    def remove_budget(self, namespace: str, name: str) -> None:
        self._budgets.pop(f"{namespace}/{name}", None)

    def add_blocker(self, blocker: EvictionBlocker) -> None:
        self._blockers.append(blocker)

    def clear_blockers(self) -> None:
        self._blockers.clear()

    def fail_next(self, operation: str, error: Exception) -> None:
        """The next call of `operation` (`cordon`, `evict`, `delete_pod`, `delete_node`, `list_pods`,
        `list_nodes`) raises `error`: how a test sees a dying API server mid-drain."""
        self._fail_next[operation] = error

    # -- reading -----------------------------------------------------------------------------

    def get_node(self, node_name: str) -> ClusterNode | None:
        return self._nodes.get(node_name)

    def pending_pods(self) -> list[ClusterPod]:
        return [p for p in self._pods.values() if p.node_name is None]

    def budgets(self) -> Mapping[str, DisruptionBudget]:
        return dict(self._budgets)

    # -- ClusterAPI --------------------------------------------------------------------------

    def list_nodes(self) -> list[ClusterNode]:
        self._maybe_fail("list_nodes")
        return list(self._nodes.values())

    def list_pods(self, node_name: str | None = None, *, volume_zones: bool = True) -> list[ClusterPod]:
        self._maybe_fail("list_pods")
        if node_name is None:
            return [p for p in self._pods.values() if not p.finished]
        return [p for p in self._pods.values() if p.node_name == node_name]

    def cordon(self, node_name: str, taint: Taint) -> None:
        """Idempotent, like a strategic-merge patch that only adds our taint if it is missing."""
        self._maybe_fail("cordon")
        node = self._node(node_name)
        taints = node.taints if taint in node.taints else (*node.taints, taint)
        label, ours = LOAD_BALANCER_EXCLUSION
        labels = node.labels if label in node.labels else {**node.labels, label: ours}
        self._nodes[node_name] = node.model_copy(update={"unschedulable": True, "taints": taints, "labels": labels})
        self.calls.cordoned.append(node_name)

    def taint(self, node_name: str, taint: Taint) -> None:
        self._maybe_fail("taint")
        node = self._node(node_name)
        if taint not in node.taints:
            self._nodes[node_name] = node.model_copy(update={"taints": (*node.taints, taint)})
        self.calls.tainted.append(node_name)

    def untaint(self, node_name: str, taint: Taint, *, unless_cordoned: bool = False) -> bool:
        self._maybe_fail("untaint")
        node = self._nodes.get(node_name)
        if node is None:
            return True
        if unless_cordoned and node.unschedulable:
            return False
        kept = tuple(t for t in node.taints if not (t.key == taint.key and t.effect == taint.effect))
        label, ours = LOAD_BALANCER_EXCLUSION
        labels = {k: v for k, v in node.labels.items() if (k, v) != (label, ours)}
        self._nodes[node_name] = node.model_copy(update={"taints": kept, "labels": labels})
        self.calls.untainted.append(node_name)
        return True

    def volume_attachments(self, node_name: str) -> list[VolumeAttachment]:
        self._maybe_fail("volume_attachments")
        return [a for a in self._attachments.values() if a.node_name == node_name]

    def evict(self, pod: ClusterPod) -> EvictionOutcome:
        self._maybe_fail("evict")
        current = self._pods.get(pod.uid)
        if current is None:
            return EvictionOutcome(pod=pod.key, evicted=False, gone=True, message="pod not found")
        refusal = self._refusal(current)
        if refusal is not None:
            self.calls.blocked.append(current.key)
            return EvictionOutcome(pod=current.key, evicted=False, blocked=True, message=refusal)
        self._remove(current)
        self.calls.evicted.append(current.key)
        return EvictionOutcome(pod=current.key, evicted=True)

    def delete_pod(self, pod: ClusterPod, grace_period_seconds: int | None = None) -> None:
        """Bypasses disruption budgets, as a DELETE does; a pod already gone is not an error."""
        self._maybe_fail("delete_pod")
        current = self._pods.get(pod.uid)
        if current is None:
            return
        self._remove(current)
        self.calls.deleted_pods.append(current.key)
        self.calls.delete_graces.append(grace_period_seconds)

    def delete_node(self, node_name: str) -> None:
        """Pods left on the node go with it (the pod GC would delete them); a missing node is fine."""
        self._maybe_fail("delete_node")
        if self._nodes.pop(node_name, None) is None:
            return
        for pod in [p for p in self._pods.values() if p.node_name == node_name]:
            self._remove(pod)
        self.calls.deleted_nodes.append(node_name)

    # -- internals ---------------------------------------------------------------------------

    def _node(self, node_name: str) -> ClusterNode:
        node = self._nodes.get(node_name)
        if node is None:
            raise NodeNotFound(f"node {node_name} not found")
        return node

    def _refusal(self, pod: ClusterPod) -> str | None:
        for blocker in self._blockers:
            reason = blocker(pod)
            if reason is not None:
                return reason
        pods = list(self._pods.values())
        for key, budget in self._budgets.items():
            if budget.selects(pod) and pod.phase == "Running" and budget.disruptions_allowed(pods) < 1:
                return f"Cannot evict pod as it would violate the pod's disruption budget {key}"
        return None

    def _remove(self, pod: ClusterPod) -> None:
        del self._pods[pod.uid]
        if self._recreate and pod.owner_kind not in (None, "DaemonSet") and not pod.mirror:
            serial = next(self._serial)
            uid, name = f"{pod.uid}-r{serial}", f"{pod.name}-r{serial}"
            self._pods[uid] = pod.model_copy(update={"uid": uid, "name": name, "node_name": None,
                                                     "phase": "Pending"})

    def _maybe_fail(self, operation: str) -> None:
        error = self._fail_next.pop(operation, None)
        if error is not None:
            raise error

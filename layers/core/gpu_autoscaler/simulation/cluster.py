"""The Kubernetes side of a simulation: nodes, the pods bound to them, and a scheduler that binds.

`SimulatedCluster` implements `ports.ClusterAPI`, so the interruption and drain services cordon, evict and
delete through it exactly as they do through the Kubernetes API. Alongside, it plays kube-scheduler: a
pending pod is bound to a Ready, uncordoned node whose taints it tolerates, whose labels satisfy its node
selector and affinity, and whose free room holds its requests (`domain.packing.fit.fits`, the packer's own
test), preferring the node left fullest (the MostAllocated scoring that GPU clusters configure).

A node's labels are what its kubelet registers (`domain.user_data.node_labels`, the bootstrap's own) plus
what the kubelet and cloud provider set (instance type, architecture, zone, OS); its allocatable is the
packer's (`domain.packing.fit.allocatable`). An evicted or orphaned pod goes back to pending with what is
left of its run — its controller recreates it (same identity here) and it resumes where it stopped, as a
service or a checkpointed job would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.packing.fit import allocatable, fits
from gpu_autoscaler.domain.user_data import node_labels
from gpu_autoscaler.errors import NodeNotFound
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod, EvictionOutcome, VolumeAttachment
from gpu_autoscaler.models.requirements import terms_match
from gpu_autoscaler.models.resources import CPU, GPU, Resources
from gpu_autoscaler.models.taints import tolerates_all

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from datetime import datetime

    from gpu_autoscaler.config import Config, NodePool
    from gpu_autoscaler.models.pods import PendingPod
    from gpu_autoscaler.models.taints import Taint
    from gpu_autoscaler.simulation.cloud import SimulatedInstance
    from gpu_autoscaler.simulation.trace import TracePod

__all__ = ["SimNode", "SimPod", "SimulatedCluster"]


@dataclass(eq=False)
class SimPod:
    """One trace pod during one policy's run."""

    trace: TracePod
    spec: PendingPod
    requests: dict[str, int]
    """Canonical requests with the `pods` slot (`fit.pod_requests`)."""
    state: str = "waiting"
    """waiting (not arrived) → pending ⇄ running → done | deleted."""
    node: SimNode | None = None
    pending_since: float | None = None
    waited: float = 0.0
    """Seconds spent pending, over every time it was."""
    started_at: float | None = None
    ran: float = 0.0
    """Seconds run before the current run."""
    first_started: float | None = None
    token: int = 0
    """Bumped on every bind and unbind, so a stale finish event is recognised."""
    reported_at: float | None = None
    report_every: float = 0.0
    verdict: str | None = None
    """The packer's last reason for not placing it; None once placed or covered."""
    evicted: int = 0
    """Times it was taken off a node before it finished (interruption, consolidation, node gone)."""
    running_on: tuple[str, float] | None = None
    """(pool, physical GPUs in that pool's terms) while it runs: the demand it records."""
    view: ClusterPod | None = None
    """Its `ClusterPod` while bound to one node (built once per binding)."""
    constraint: tuple[object, ...] = ()
    """What decides where it may go (tolerations, selector, affinity): the scheduler's cache key."""

    def __post_init__(self) -> None:
        spec = self.spec
        self.constraint = (spec.tolerations, tuple(sorted(spec.node_selector.items())), spec.required_node_affinity)

    @property
    def uid(self) -> str:
        return self.spec.uid


@dataclass(eq=False)
class SimNode:
    name: str
    instance: SimulatedInstance
    pool: NodePool
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    allocatable: dict[str, int]
    free: dict[str, int]
    created_at: float
    order: int
    pods: dict[str, SimPod] = field(default_factory=dict)
    cordoned: bool = False
    empty_since: float | None = None
    pods_changed_at: float | None = None
    """When a pod was last bound to it or taken off it (None: never yet)."""
    version: int = 0
    """Bumped whenever its pods or its schedulability change: consolidation's inputs are cached on it."""
    _view: ClusterNode | None = None

    @property
    def claim_id(self) -> str | None:
        return self.instance.claim_id

    @property
    def kind(self) -> tuple[str, str, str, str]:
        return (self.pool.name, self.instance.instance_type.name, self.instance.zone, self.instance.capacity_type)


class SimulatedCluster:
    """Nodes and bound pods; `ClusterAPI` for the services, `schedule` for kube-scheduler's part."""

    def __init__(self, config: Config, now: Callable[[], float], moment: Callable[[float], datetime],
                 on_unbind: Callable[[SimPod, str], None], on_empty: Callable[[SimNode], None] | None = None,
                 pending: Callable[[], Iterable[SimPod]] | None = None) -> None:
        """`on_unbind`: a running pod went back to pending (evicted, its node gone); `on_empty`: a node has no pods
        left; `pending`: the pods waiting for a node, which `list_pods()` shows as the API would."""
        self.config = config
        self.now = now
        self.moment = moment
        self.on_unbind = on_unbind
        self.on_empty = on_empty
        self.pending = pending
        self.nodes: dict[str, SimNode] = {}
        self._feasible: dict[tuple[object, ...], bool] = {}
        self._shape_ids: dict[tuple[object, ...], int] = {}
        self._pod_ids: dict[SimPod, tuple[int, int]] = {}
        self._order = 0

    # Nodes joining and leaving (the kubelet's part)

    def join(self, instance: SimulatedInstance, pool: NodePool) -> SimNode:
        t = instance.instance_type
        labels, _ = node_labels(pool, instance.capacity_type, instance_type=t, claim_id=instance.claim_id)  # type: ignore[arg-type]
        labels.update({L.INSTANCE_TYPE: t.name, L.ARCH: t.labels[L.ARCH], L.ZONE: instance.zone, L.OS: "linux"})
        room = allocatable(t, pool, self.config.overhead).as_dict()
        self._order += 1
        node = SimNode(
            name=_node_name(instance.instance_id), instance=instance, pool=pool, labels=labels,
            taints=tuple(pool.taints), allocatable=room, free=dict(room), created_at=self.now(), order=self._order,
            empty_since=self.now(),
        )
        self.nodes[node.name] = node
        if self.on_empty is not None:
            self.on_empty(node)
        return node

    def node_of_instance(self, instance_id: str) -> SimNode | None:
        return self.nodes.get(_node_name(instance_id))

    def remove(self, node: SimNode, why: str) -> None:
        """The node is gone (its instance ended, or its Node object was deleted): its pods go back to pending."""
        if self.nodes.pop(node.name, None) is None:
            return
        for pod in list(node.pods.values()):
            self.unbind(pod, why)

    # Scheduling (kube-scheduler's part)

    def schedule(self, pods: Iterable[SimPod]) -> list[tuple[SimPod, SimNode]]:
        """Bind what fits, in the order given; returns the bindings made."""
        # A taint added after the node joined (consolidation's disrupted taint) keeps every trace pod off it: none
        # tolerates it.
        ready = [n for n in self.nodes.values() if not n.cordoned and len(n.taints) == len(n.pool.taints)]
        if not ready:
            return []
        bound = []
        # Room only shrinks while binding, so a pod like one that fitted nowhere (the same requests, the same
        # constraints) fits nowhere either: a queue of replicas with no room is one search, not one per replica.
        nowhere: set[int] = set()
        for pod in pods:
            constraint, shape = self._ids(pod)
            if shape in nowhere:
                continue
            node = self._best(pod, ready, constraint)
            if node is None:
                nowhere.add(shape)
                continue
            self.bind(pod, node)
            bound.append((pod, node))
        return bound

    def _ids(self, pod: SimPod) -> tuple[int, int]:
        """Small numbers for the pod's constraints and for its shape (constraints and requests), equal for pods
        whose are equal: the scheduler's cache keys, which hash at once where the constraints' models do not."""
        found = self._pod_ids.get(pod)
        if found is None:
            ids = self._shape_ids
            constraint = ids.setdefault(("constraint", pod.constraint), len(ids))
            found = (constraint, ids.setdefault(("shape", constraint, tuple(pod.requests.items())), len(ids)))
            self._pod_ids[pod] = found
        return found

    def _best(self, pod: SimPod, nodes: list[SimNode], constraint: int) -> SimNode | None:
        best: SimNode | None = None
        best_key: tuple[int, int, int] | None = None
        requests = pod.requests
        for node in nodes:
            if not fits(requests, node.free) or not self._allowed(constraint, pod, node):
                continue
            key = (node.free.get(GPU, 0) - requests.get(GPU, 0), node.free.get(CPU, 0) - requests.get(CPU, 0),
                   node.order)
            if best_key is None or key < best_key:
                best, best_key = node, key
        return best

    def _allowed(self, constraint: int, pod: SimPod, node: SimNode) -> bool:
        key = (constraint, node.kind)
        found = self._feasible.get(key)
        if found is None:
            spec = pod.spec
            found = (
                tolerates_all(spec.tolerations, node.pool.taints)
                and all(node.labels.get(k) == v for k, v in spec.node_selector.items())
                and terms_match(spec.required_node_affinity, node.labels)
            )
            self._feasible[key] = found
        return found

    def bind(self, pod: SimPod, node: SimNode) -> None:
        node.pods[pod.uid] = pod
        for name, value in pod.requests.items():
            node.free[name] = node.free.get(name, 0) - value
        node.empty_since = None
        node.pods_changed_at = self.now()
        node.version += 1
        pod.node = node
        pod.view = None

    def unbind(self, pod: SimPod, why: str) -> None:
        if self.release(pod):
            self.on_unbind(pod, why)

    def release(self, pod: SimPod) -> bool:
        """Take a pod off its node (it finished, or was evicted); False if it was on none."""
        node = pod.node
        if node is None:
            return False
        node.pods.pop(pod.uid, None)
        for name, value in pod.requests.items():
            node.free[name] = node.free.get(name, 0) + value
        node.pods_changed_at = self.now()
        node.version += 1
        if not node.pods:
            node.empty_since = self.now()
            if self.on_empty is not None:
                self.on_empty(node)
        pod.node = None
        pod.view = None
        return True

    # ClusterAPI

    def list_nodes(self) -> list[ClusterNode]:
        return [self.view(n) for n in self.nodes.values()]

    def list_pods(self, node_name: str | None = None, *, volume_zones: bool = True) -> list[ClusterPod]:
        if node_name is not None:
            node = self.nodes.get(node_name)
            return [self.pod_view(p) for p in node.pods.values()] if node is not None else []
        bound = [self.pod_view(p) for n in self.nodes.values() for p in n.pods.values()]
        waiting = [self.pod_view(p) for p in self.pending()] if self.pending is not None else []
        return bound + waiting

    def cordon(self, node_name: str, taint: Taint) -> None:
        node = self._node(node_name)
        node.cordoned = True
        if taint not in node.taints:
            node.taints = (*node.taints, taint)
        node._view = None
        node.version += 1

    def taint(self, node_name: str, taint: Taint) -> None:
        node = self._node(node_name)
        if taint not in node.taints:
            node.taints = (*node.taints, taint)
            node._view = None
            node.version += 1

    def untaint(self, node_name: str, taint: Taint, *, unless_cordoned: bool = False) -> bool:
        node = self.nodes.get(node_name)
        if node is not None and unless_cordoned and node.cordoned:
            return False
        if node is not None and taint in node.taints:
            node.taints = tuple(t for t in node.taints if t != taint)
            node._view = None
            node.version += 1
        return True

    def volume_attachments(self, node_name: str) -> list[VolumeAttachment]:
        """Trace pods use no persistent volumes."""
        return []

    def evict(self, pod: ClusterPod) -> EvictionOutcome:
        found = self._bound(pod)
        if found is None:
            return EvictionOutcome(pod=pod.key, evicted=False, gone=True, message="pod not found")
        self.unbind(found, "evicted")
        return EvictionOutcome(pod=pod.key, evicted=True)

    def delete_pod(self, pod: ClusterPod, grace_period_seconds: int | None = None) -> None:
        found = self._bound(pod)
        if found is not None:
            self.unbind(found, "deleted")

    def delete_node(self, node_name: str) -> None:
        node = self.nodes.get(node_name)
        if node is not None:
            self.remove(node, "node deleted")

    # Views

    def view(self, node: SimNode) -> ClusterNode:
        if node._view is None:
            instance = node.instance
            node._view = ClusterNode(
                name=node.name, provider_id=f"aws:///{instance.zone}/{instance.instance_id}", labels=node.labels,
                taints=node.taints, allocatable=Resources(node.allocatable), unschedulable=node.cordoned,
                ready=True, created_at=self.moment(node.created_at), ready_since=self.moment(node.created_at),
            )
        return node._view

    def pod_view(self, pod: SimPod) -> ClusterPod:
        if pod.view is None:
            pod.view = self._pod_view(pod)
        return pod.view

    def _pod_view(self, pod: SimPod) -> ClusterPod:
        spec = pod.spec
        return ClusterPod(
            uid=spec.uid, namespace=spec.namespace, name=spec.name, node_name=pod.node.name if pod.node else None,
            requests=spec.resources, annotations=spec.annotations, owner_kind="Job",
            phase="Running" if pod.node else "Pending",
            node_selector=spec.node_selector, required_node_affinity=spec.required_node_affinity,
            tolerations=spec.tolerations, priority=spec.priority,
            created_at=self.moment(pod.trace.arrival),
            started_at=self.moment(pod.started_at) if pod.node is not None and pod.started_at is not None else None,
        )

    def _node(self, node_name: str) -> SimNode:
        node = self.nodes.get(node_name)
        if node is None:
            raise NodeNotFound(f"node {node_name} not found")
        return node

    def _bound(self, pod: ClusterPod) -> SimPod | None:
        node = self.nodes.get(pod.node_name or "")
        return node.pods.get(pod.uid) if node is not None else None


def _node_name(instance_id: str) -> str:
    """The private DNS name EC2 gives the instance, which its kubelet registers as the node's name."""
    return f"ip-{instance_id[2:]}.ec2.internal"

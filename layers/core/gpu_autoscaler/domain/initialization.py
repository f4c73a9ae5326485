"""When a new node can take pods: Karpenter's node initialization, not merely a Ready Node.

A Node turns Ready when its kubelet runs, seconds before its device plugins have registered their resources:
until then its allocatable shows `nvidia.com/gpu: 0` (or nothing) and a pod asking for a GPU cannot be bound.
A drain that evicts onto a replacement at that moment leaves its pods pending. Karpenter
(kubernetes-sigs/karpenter `pkg/controllers/nodeclaim/lifecycle/initialization.go`) calls a NodeClaim
initialized only when its Node is Ready, its startup taints and the known ephemeral taints are gone, and every
resource the NodeClaim was made for is allocatable with a non-zero quantity. The same test here, over the
claim's recorded requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.models.resources import CPU, EPHEMERAL_STORAGE, MEMORY, PODS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.models.cluster import ClusterNode

__all__ = ["EPHEMERAL_TAINTS", "EPHEMERAL_TAINT_PREFIXES", "not_initialized", "was_initialized"]

EPHEMERAL_TAINTS: frozenset[tuple[str, str]] = frozenset({
    ("node.kubernetes.io/not-ready", "NoSchedule"),
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoSchedule"),
    ("node.cloudprovider.kubernetes.io/uninitialized", "NoSchedule"),
    ("karpenter.sh/unregistered", "NoExecute"),
})
"""(key, effect) of the taints Karpenter's `KnownEphemeralTaints` lists: the node controller and the cloud
controller manager put them on a node that is not ready for pods yet, and take them off once it is."""
EPHEMERAL_TAINT_PREFIXES = ("readiness.k8s.io/",)
"""Taint keys ephemeral whatever their suffix (Karpenter's `KnownEphemeralTaintKeyPrefixes`): the Node Readiness
Controller puts `readiness.k8s.io/<rule>` on a node until its rule holds (a GPU driver loaded, say)."""
_NODE_RESOURCES = frozenset({CPU, MEMORY, EPHEMERAL_STORAGE, PODS})
"""Reported by the kubelet itself from its first status: only the others wait for a device plugin."""


def not_initialized(node: ClusterNode, requested: Mapping[str, int]) -> str | None:
    """Why `node` cannot take the pods it was made for yet, or None once it can. (Pools have no startup taints
    of their own to wait for: the configuration has no such field yet.)"""
    if not node.ready:
        return "node is not Ready"
    for taint in node.taints:
        if (taint.key, taint.effect) in EPHEMERAL_TAINTS or taint.key.startswith(EPHEMERAL_TAINT_PREFIXES):
            return f"taint {taint.key}:{taint.effect} is still on it"
    return _unregistered(node, requested)


def was_initialized(node: ClusterNode, requested: Mapping[str, int]) -> bool:
    """Whether the node has been initialized, Ready or not now. Karpenter latches initialization on the NodeClaim
    and counts such nodes, and only those, towards a pool's disruption budget. The Node stands in for that latch
    here: a NotReady node has been initialized if every resource it was made for is allocatable, since a Node keeps
    the allocatable its kubelet last reported and device plugins register only with a running kubelet. A NotReady
    node of a claim that asked for no such resource counts as initialized: counted as disrupting as well, it can
    only tighten a budget."""
    if node.ready:
        return not_initialized(node, requested) is None
    return _unregistered(node, requested) is None


def _unregistered(node: ClusterNode, requested: Mapping[str, int]) -> str | None:
    allocatable = node.allocatable
    for name, quantity in sorted(requested.items()):
        if quantity > 0 and name not in _NODE_RESOURCES and allocatable[name] <= 0:
            return f"{name} is not allocatable yet (its device plugin has not registered it)"
    return None

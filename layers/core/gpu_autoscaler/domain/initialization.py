"""When a new node can take pods: Karpenter's node initialization, not merely a Ready Node.

A Node turns Ready when its kubelet runs, seconds before its device plugins have registered their resources:
until then its allocatable shows `nvidia.com/gpu: 0` (or nothing) and a pod asking for a GPU cannot be bound.
A drain that evicts onto a replacement at that moment leaves its pods pending. Karpenter
(kubernetes-sigs/karpenter `pkg/controllers/nodeclaim/lifecycle/initialization.go`) calls a NodeClaim
initialized only when its Node is Ready, its startup taints and the known ephemeral taints are gone, and every
resource the NodeClaim was made for is allocatable with a non-zero quantity. The same test here, over the
claim's recorded requests.

Initialization is latched on the claim as Karpenter latches it on the NodeClaim: the reconcile step records, on
the first tick that sees the claim's node initialized, when that was (`INITIALIZED_ATTRIBUTE`; `initialized_at`).
A registered claim's node takes pods from then, not from its registration — a Node object exists long before a GPU
node can take a GPU pod (the cloud controller manager's initialization, the kubelet's Ready, then the GPU
Operator's chain) —, so the packer's `schedulingGrace` counts from it. A node not initialized within
`timeouts.registrationTtl` of its registration is given up as one that never registered (`initialization_overdue`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.boot_times import BOOT_ATTRIBUTE
from gpu_autoscaler.models.claims import ClaimState, instant_attribute, launched_at, registered_at
from gpu_autoscaler.models.resources import CPU, EPHEMERAL_STORAGE, MEMORY, PODS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.cluster import ClusterNode

__all__ = [
    "EPHEMERAL_TAINTS",
    "EPHEMERAL_TAINT_PREFIXES",
    "INITIALIZED_ATTRIBUTE",
    "initialization_overdue",
    "initialized_at",
    "not_initialized",
    "was_initialized",
]

INITIALIZED_ATTRIBUTE = "initializedAt"
"""NodeClaim attribute: when the reconcile step first saw the claim's node initialized (ISO 8601), recorded once."""

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
_UNINITIALIZED = "node.cloudprovider.kubernetes.io/uninitialized"
"""The cloud controller manager's taint, on a node from its registration until it initializes it, never again."""
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


def was_initialized(node: ClusterNode, claim: NodeClaim, requested: Mapping[str, int]) -> bool:
    """Whether the claim's node has been initialized, Ready or not now: Karpenter latches initialization on the
    NodeClaim and counts such nodes, and only those, towards a pool's disruption budget (`helpers.go` skips a node
    not `Initialized()`). The latch here is the claim's `initializedAt`; a node Ready and initialized now, before the
    reconcile step wrote it, has been. A NotReady node of a claim that has none was initialized only if it shows what
    an initialized node shows (a claim from before the latch was recorded): no `uninitialized` taint, every resource
    it was made for allocatable, or, made for none, some device a plugin registered — a Node keeps the allocatable
    its kubelet last reported, and device plugins register only with a running kubelet. A node still booting (a
    claim held warm records no requests) shows none of that."""
    if initialized_at(claim) is not None:
        return True
    if node.ready:
        return not_initialized(node, requested) is None
    if any(taint.key == _UNINITIALIZED for taint in node.taints):
        return False
    if any(quantity > 0 for quantity in requested.values()):
        return _unregistered(node, requested) is None
    return any(count > 0 and name not in _NODE_RESOURCES for name, count in node.allocatable.items())


def _unregistered(node: ClusterNode, requested: Mapping[str, int]) -> str | None:
    allocatable = node.allocatable
    for name, quantity in sorted(requested.items()):
        if quantity > 0 and name not in _NODE_RESOURCES and allocatable[name] <= 0:
            return f"{name} is not allocatable yet (its device plugin has not registered it)"
    return None


def initialized_at(claim: NodeClaim) -> datetime | None:
    """When the claim's node was first seen initialized, or None while it has not been. A claim registered before
    the time was recorded has it from its boot time (`bootSeconds`: launch → Ready with GPUs allocatable)."""
    recorded = instant_attribute(claim, INITIALIZED_ATTRIBUTE)
    if recorded is not None:
        return recorded
    boot = claim.attributes.get(BOOT_ATTRIBUTE)
    if boot:
        try:
            return launched_at(claim) + timedelta(seconds=float(boot))
        except ValueError:
            pass
    return None


def initialization_overdue(claim: NodeClaim, now: datetime, allowance: timedelta) -> bool:
    """Whether a Registered claim whose node has not been initialized is past its allowance: given up.

    `timeouts.registrationTtl` again, counted from the Node's registration: it is Karpenter's allowance from launch
    to registration (`liveness.go`), and Karpenter gives a registered node that never initializes none (it waits for
    node repair or expiry). Counted from the launch, a slow GPU node (a p5's boot, then the GPU Operator's chain)
    would be terminated before its GPUs came, and bought again, over and over."""
    return (claim.state is ClaimState.REGISTERED and initialized_at(claim) is None
            and now - registered_at(claim) >= allowance)

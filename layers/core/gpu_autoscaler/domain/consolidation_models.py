"""Consolidation's input and output: the nodes as the pass sees them, and the decisions it returns.

The consolidate service builds the picture (`node_pods`, `empty_since`, `pods_changed_at`) from the cluster and
the state store; the simulator builds the same from its own; `consolidation.consolidate` turns it into a
`ConsolidationResult`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from gpu_autoscaler.domain.interruption import replacement_pods
from gpu_autoscaler.domain.prewarm import warm_until
from gpu_autoscaler.models.resources import PODS, Resources
from gpu_autoscaler.models.taints import Toleration

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping, Sequence
    from datetime import datetime, timedelta

    from gpu_autoscaler.config import DisruptionReason, NodePool
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
    from gpu_autoscaler.models.pods import PendingPod, PodAntiAffinity

__all__ = [
    "EMPTY_SINCE_ATTRIBUTE",
    "PODS_CHANGED_AT_ATTRIBUTE",
    "POD_SET_ATTRIBUTE",
    "REPLACES_ATTRIBUTE",
    "Action",
    "ConsolidationNode",
    "ConsolidationResult",
    "Decision",
    "NodePod",
    "Rejection",
    "empty_since",
    "empty_wait",
    "node_pods",
    "pod_set",
    "pods_changed_at",
    "protected_daemons",
    "warm_held",
    "warm_until",
]

REPLACES_ATTRIBUTE = "replaces"
"""NodeClaim attribute of a replacement: the claim ids of the nodes it replaces, comma-separated."""
EMPTY_SINCE_ATTRIBUTE = "emptySince"
"""NodeClaim attribute: ISO instant since which its node has had no pods to move."""
PODS_CHANGED_AT_ATTRIBUTE = "podsChangedAt"
"""NodeClaim attribute: ISO instant of its node's last pod event as the consolidate function saw it (Karpenter's
`status.lastPodEventTime`): a pod bound there, or gone (finished, terminating, deleted)."""
POD_SET_ATTRIBUTE = "podSet"
"""NodeClaim attribute: `pod_set` of its node's pods when `podsChangedAt` was last checked; a different one on
the next tick is a pod event."""

Action = Literal["delete", "replace"]


@dataclass(frozen=True)
class NodePod:
    """A pod that would have to move if its node were drained."""

    pod: PendingPod
    """Its requests and placement constraints, in the packer's terms."""
    evictable: bool = True
    """Its PodDisruptionBudgets allow an eviction now."""
    protected: bool = False
    """`karpenter.sh/do-not-disrupt` is active on it now (`"true"`, or a duration not yet run out)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Its labels: what other pods' anti-affinity terms select."""
    repels: tuple[PodAntiAffinity, ...] = ()
    """Its required pod anti-affinity terms on the node (`ClusterPod.pod_anti_affinity`)."""


@dataclass(frozen=True)
class ConsolidationNode:
    """A Node, its NodeClaim (None when it is not ours) and the pods that would move."""

    node: ClusterNode
    claim: NodeClaim | None
    pods: tuple[NodePod, ...] = ()
    empty_since: datetime | None = None
    """Since when it has had no pods to move (None: not known to be empty for any time yet)."""
    incoming: int = 0
    """Pods assigned to its claim that are on their way to it: still pending, or still on a draining node whose
    replacement it is."""
    pods_changed_at: datetime | None = None
    """Its last pod event, a pod bound to it or gone from it (None: none known; its creation counts instead)."""
    protected_daemons: tuple[str, ...] = ()
    """Keys of its DaemonSet and mirror pods on which `karpenter.sh/do-not-disrupt` is active (`protected_daemons`):
    they move nowhere, so they are not in `pods`, yet they keep the node."""

    @property
    def name(self) -> str:
        return self.node.name

    @cached_property
    def footprints(self) -> tuple[Resources, ...]:
        """Each pod's requests and pod slot (`fit.pod_requests`), kept: every pass weighs the same node object
        until its pods change."""
        return tuple(entry.pod.footprint for entry in self.pods)

    @cached_property
    def footprint(self) -> Resources:
        """Its pods' footprints together: what they take on it, and what one node replacing it must hold."""
        totals: dict[str, int] = {}  # summed in one dict rather than a vector per pod
        for entry in self.pods:
            for name, value in entry.pod.resources.items():
                totals[name] = totals.get(name, 0) + value
        return Resources(totals) + {PODS: len(self.pods)} if self.pods else Resources()


@dataclass(frozen=True)
class Decision:
    """Drain these nodes; their pods go to other nodes' free room and to the replacements, launched first."""

    reason: DisruptionReason
    action: Action
    pool: str
    nodes: tuple[str, ...]
    claims: tuple[str, ...]
    price_before: float
    """USD/h of the nodes drained."""
    price_after: float = 0.0
    """USD/h the replacements are expected to cost (each its cheapest candidate); 0 without any."""
    replacements: tuple[NodeClaim, ...] = ()
    """New nodes, launched and Ready before the drain starts."""
    destinations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Node name → uids of the pods the plan puts on its free room."""
    detail: str = ""

    @property
    def saving(self) -> float:
        """USD/h saved once done (negative for a drift replacement that costs more)."""
        return self.price_before - self.price_after

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "reason": self.reason, "action": self.action, "pool": self.pool, "nodes": list(self.nodes),
            "claims": list(self.claims), "pricePerHourBefore": round(self.price_before, 6),
            "pricePerHourAfter": round(self.price_after, 6), "savingPerHour": round(self.saving, 6),
            "detail": self.detail,
        }
        if self.replacements:
            out["replacements"] = [
                {"claim": c.id, "capacityType": c.capacity_type, "instanceTypes": list(c.instance_types[:5]),
                 "candidates": len(c.instance_types), "zones": list(c.zones), "pods": len(c.pods),
                 "pricePerHour": round(c.price_per_hour, 6)}
                for c in self.replacements
            ]
        return out


@dataclass(frozen=True)
class Rejection:
    """A proposal that no longer holds: its marks come off, and its taints."""

    nodes: tuple[str, ...]
    claims: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class ConsolidationResult:
    decisions: tuple[Decision, ...] = ()
    """New proposals: to be tainted and marked, and validated by a later tick."""
    validated: tuple[Decision, ...] = ()
    """Proposals that still hold (with the replacements planned now): to be carried out."""
    invalidated: tuple[Rejection, ...] = ()
    skipped: Mapping[str, str] = field(default_factory=dict)
    """Node name → why it was left alone (only for our nodes that were looked at)."""
    budgets: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)
    """Pool → reason → nodes it still allowed at the start of the pass (None: unbounded)."""

    @property
    def saving(self) -> float:
        return sum(d.saving for d in self.decisions)

    def summary(self) -> dict[str, Any]:
        reasons: dict[str, int] = {}
        for why in self.skipped.values():
            key = why.split(":", 1)[0]
            reasons[key] = reasons.get(key, 0) + 1
        return {
            "decisions": [d.to_json() for d in self.decisions],
            "savingPerHour": round(self.saving, 6),
            "skipped": dict(sorted(reasons.items())),
            "budgets": {pool: dict(v) for pool, v in self.budgets.items()},
        }


# Building the input


def node_pods(node: ClusterNode, pods: Iterable[ClusterPod], blocked: Collection[str] = (),
              now: datetime | None = None) -> tuple[NodePod, ...]:
    """The pods that would move if `node` were drained (as an interruption's replacement sees them: DaemonSet,
    mirror and finished pods stay out).

    A pod running on a node tolerates that node's hard taints, so those tolerations are added even where
    the pod's spec was not read in full. `blocked`: uids whose eviction a PodDisruptionBudget forbids now;
    `now`: when do-not-disrupt durations are weighed (without it, any duration protects).
    """
    tolerate = tuple(
        Toleration(key=t.key, operator="Equal", value=t.value, effect=t.effect)
        for t in node.taints if t.effect != "PreferNoSchedule"
    )
    out = []
    on_node = [p for p in pods if p.node_name == node.name]
    protected = {p.uid for p in on_node if _blocks(p, now)}
    by_uid = {p.uid: p for p in on_node}
    for pod in replacement_pods(on_node):
        missing = tuple(t for t in tolerate if t not in pod.tolerations)
        moved = pod.model_copy(update={"tolerations": (*pod.tolerations, *missing)}) if missing else pod
        source = by_uid[pod.uid]
        out.append(NodePod(moved, evictable=pod.uid not in blocked, protected=pod.uid in protected,
                           labels=source.labels, repels=source.pod_anti_affinity))
    return tuple(out)


def protected_daemons(node: ClusterNode, pods: Iterable[ClusterPod], now: datetime | None = None) -> tuple[str, ...]:
    """The keys of the node's DaemonSet and mirror pods that `karpenter.sh/do-not-disrupt` protects now. They need
    no room elsewhere (`node_pods` leaves them out), but Karpenter lets them keep their node all the same: "we will
    allow Mirror Pods and DaemonSets to block disruption using this annotation" (`StateNode.ValidatePodsDisruptable`,
    kubernetes-sigs/karpenter pkg/controllers/state/statenode.go) — a node agent whose work must not be cut short."""
    return tuple(sorted(p.key for p in pods if p.node_name == node.name and (p.owner_kind == "DaemonSet" or p.mirror)
                        and _blocks(p, now)))


def _blocks(pod: ClusterPod, now: datetime | None) -> bool:
    """Whether do-not-disrupt on the pod keeps its node: active on a pod that is neither finished nor terminating
    (Karpenter's `IsDisruptable`: a pod on its way out protects nothing)."""
    return not pod.finished and not pod.terminating and pod.do_not_disrupt_active(now)


def empty_since(previous: datetime | None, pods: Sequence[NodePod], now: datetime) -> datetime | None:
    """Carry a node's empty-since mark forward: kept while it stays empty, set when it becomes so."""
    if pods:
        return None
    return previous if previous is not None and previous <= now else now


def _counted(pod: ClusterPod) -> bool:
    """A pod whose arrival or departure is a pod event, as Karpenter's podevents controller filters them
    (pkg/controllers/nodeclaim/podevents/controller.go): not a DaemonSet's, and neither terminal nor terminating
    (going so is the event)."""
    return pod.owner_kind != "DaemonSet" and not pod.finished and not pod.terminating


def pod_set(pods: Iterable[ClusterPod]) -> str:
    """A short fingerprint of a node's counted pods (their uids): stored on the claim, so the next tick can tell
    whether any came or went in between without storing every uid."""
    uids = sorted(p.uid for p in pods if _counted(p))
    return hashlib.sha256("\n".join(uids).encode()).hexdigest()[:16]


def pods_changed_at(previous: datetime | None, previous_set: str | None, current_set: str,
                    pods: Sequence[ClusterPod], now: datetime) -> datetime | None:
    """Carry a node's last pod event forward (`pods`: those on the node now, `current_set` their `pod_set`).

    The same pod set as last tick: the mark stands. Another one: a pod came or went since the last tick, seen
    now (Karpenter stamps the event when its watch sees it; a tick's lag at most here, which only waits longer).
    No set recorded yet (the node's first tick, or claims older than the mark): the latest `startTime` of its
    pods, the one event known for sure, else None — its creation counts, as Karpenter counts its initialization.
    """
    if previous_set is not None:
        if current_set == previous_set and (previous is None or previous <= now):
            return previous
        return now
    starts = [p.started_at for p in pods if _counted(p) and p.started_at is not None and p.started_at <= now]
    return max(starts, default=None)


def empty_wait(pool: NodePool) -> timedelta:
    """How long a node of the pool must have been empty before it is removed."""
    return max(pool.disruption.consolidate_after, pool.lead_time * pool.disruption.empty_keep_lead_times)


def warm_held(claim: NodeClaim, now: datetime) -> bool:
    """Warm capacity stays while its holder holds it: until prewarm releases it or its `warmUntil` passes (a
    window's opening's end; for the forecast, a few ticks after the last prewarm tick that kept it, so a hold ends
    even if prewarm stops running). A hold with no end that can be read is not one: every tick that keeps a claim
    writes its end."""
    until = warm_until(claim)
    return until is not None and now < until

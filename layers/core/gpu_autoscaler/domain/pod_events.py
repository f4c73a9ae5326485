"""What a pending GPU pod is told about its capacity: Kubernetes Events, as `kubectl describe pod` shows them.

The packer knows, for every pod the agent reports, what it decided: a new claim (instance types, capacity type,
zones, price), room on a claim already in flight, a claim that has launched or registered, or why the pod cannot
be placed (the solver's reason, verbatim). Pods stay reported while pending, so each report tells the pod where
its capacity is, as Karpenter's `Nominated` and `FailedScheduling` events do on its pods. These are plain values;
`adapters/kubernetes/events.py` posts them, deduplicated and rate-limited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from gpu_autoscaler.models.claims import ClaimState

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from datetime import datetime

    from gpu_autoscaler.domain.packing.results import Plan
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.cluster import ClusterPod, EvictionOutcome
    from gpu_autoscaler.models.pods import PendingPod

__all__ = ["EventRecorder", "PodEvent", "Recorded", "deletion_events", "disruption_events", "events_for_plan",
           "failed_draining_events"]

PLANNED = "GpuCapacityPlanned"
LAUNCHED = "GpuCapacityLaunched"
REGISTERED = "GpuNodeRegistered"
UNSCHEDULABLE = "GpuCapacityUnavailable"
DISRUPTING = "GpuNodeDisrupting"
DELETED = "GpuPodDeleted"
FAILED_DRAINING = "FailedDraining"
"""Karpenter's reason for the Warning on a Node whose drain a budget holds up (kubernetes-sigs/karpenter
pkg/events, `FailedDraining`): tools that watch Karpenter's Events match it."""
NODE_EVENTS_NAMESPACE = "default"
"""Where an Event on a Node (no namespace of its own) is kept, as client-go's recorder keeps one on a cluster-scoped
object (`tools/record`: `metav1.NamespaceDefault`)."""


@dataclass(frozen=True)
class PodEvent:
    uid: str
    namespace: str
    name: str
    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"
    kind: Literal["Pod", "Node"] = "Pod"
    """The object it is about. A Node's Event has `namespace` `NODE_EVENTS_NAMESPACE` and the node's name as `uid`,
    as the kubelet's have: `kubectl describe node` looks for Events under the node's uid and under its name."""


@dataclass(frozen=True)
class Recorded:
    """What one `EventRecorder.record` did."""

    written: int = 0
    refused: int = 0
    """Events not posted because the API server refuses the functions' access to Events (401, 403): a grant
    missing, not an outage, so the functions count it (`PodEventsRefused`) for someone to see."""


class EventRecorder(Protocol):
    """Posts events on pods; best effort (an event that cannot be posted is logged, never raised)."""

    def record(self, events: Sequence[PodEvent], *, time_left: Callable[[], float] | None = None) -> Recorded:
        """Post what is new or due; given `time_left` (seconds of the invocation), no more than fits in it."""
        ...


def _types(claim: NodeClaim) -> str:
    if claim.instance_type:
        return claim.instance_type
    shown = ", ".join(claim.instance_types[:3])
    return shown + (f" (+{len(claim.instance_types) - 3} more)" if len(claim.instance_types) > 3 else "")


def _about(claim: NodeClaim) -> PodEventText:
    price = claim.launched_price_per_hour if claim.launched_price_per_hour is not None else claim.price_per_hour
    where = claim.zone or ", ".join(claim.zones)
    if claim.state is ClaimState.REGISTERED and claim.node_name:
        return REGISTERED, f"node {claim.node_name} of claim {claim.id} ({_types(claim)} {claim.capacity_type} in " \
            f"{where}) registered; the scheduler binds the pod there"
    if claim.state in (ClaimState.LAUNCHED, ClaimState.REGISTERED) and claim.instance_id:
        return LAUNCHED, f"claim {claim.id} launched {claim.instance_id} ({_types(claim)} {claim.capacity_type} in " \
            f"{where}, {price:.4f} USD/h); waiting for its node to register"
    return PLANNED, f"planned onto claim {claim.id} in pool {claim.pool}: {_types(claim)} {claim.capacity_type} " \
        f"in {where}, {price:.4f} USD/h"


PodEventText = tuple[str, str]


def events_for_plan(pods: Sequence[PendingPod], plan: Plan, claims: Mapping[str, NodeClaim]) -> list[PodEvent]:
    """One event per reported pod: where its capacity is (a claim planned now, in flight or registered), or why
    there is none. `claims` holds every claim the plan names, new or live, by id."""
    owner: dict[str, str] = dict(plan.covered)
    for claim_id, uids in plan.existing.items():
        owner.update(dict.fromkeys(uids, claim_id))
    for claim in plan.claims:
        owner.update(dict.fromkeys(claim.pods, claim.id))
    reasons = {u.pod: u.reason for u in plan.unschedulable}
    events = []
    for pod in pods:
        if pod.uid in reasons:
            events.append(PodEvent(pod.uid, pod.namespace, pod.name, UNSCHEDULABLE, reasons[pod.uid], "Warning"))
            continue
        found = claims.get(owner.get(pod.uid, ""))
        if found is not None:
            reason, message = _about(found)
            events.append(PodEvent(pod.uid, pod.namespace, pod.name, reason, message))
    return events


def disruption_events(pods: Sequence[ClusterPod], node: str, claim: NodeClaim, reason: str) -> list[PodEvent]:
    """Evicted pods hear why their node goes, in the words of the drain request (Spot warning, consolidation with
    its saving, drift, a scheduled retirement)."""
    what = f"{claim.instance_type or _types(claim)} {claim.capacity_type}"
    return [PodEvent(p.uid, p.namespace, p.name, DISRUPTING, f"evicted: node {node} ({what}, claim {claim.id}) is "
                     f"being drained: {reason}") for p in pods]


def deletion_events(pods: Sequence[ClusterPod], node: str, claim: NodeClaim, reason: str, grace: int | None,
                    node_time: datetime | None) -> list[PodEvent]:
    """Pods deleted because their node's termination time comes hear it, and that their PodDisruptionBudget and
    `karpenter.sh/do-not-disrupt` were bypassed, as Karpenter's `Disrupted` event tells them
    (kubernetes-sigs/karpenter pkg/controllers/node/termination/terminator/events/events.go)."""
    what = f"{claim.instance_type or _types(claim)} {claim.capacity_type}"
    when = f" at {node_time.isoformat()}" if node_time is not None else ""
    granted = f"{grace} s" if grace is not None else "its own"
    return [PodEvent(p.uid, p.namespace, p.name, DELETED,
                     f"deleted with {granted} grace period (of its {p.termination_grace_period_seconds} s): node "
                     f"{node} ({what}, claim {claim.id}) goes{when}: {reason}; this bypasses the pod's "
                     "PodDisruptionBudget and karpenter.sh/do-not-disrupt", "Warning") for p in pods]


def failed_draining_events(node: str, refused: Sequence[EvictionOutcome]) -> list[PodEvent]:
    """A Warning on the node for each pod whose eviction was refused, with the API server's reason, as Karpenter's
    `NodeFailedToDrain` says "Failed to drain node, Pod ns/name: evicting pod violates a PDB"
    (pkg/controllers/node/termination/terminator/eviction.go). The same refusal names the same Event, so a drain
    held up pass after pass raises its count."""
    return [PodEvent(node, NODE_EVENTS_NAMESPACE, node, FAILED_DRAINING,
                     f"failed to drain node: eviction of pod {r.pod} refused: {r.message}", "Warning", kind="Node")
            for r in refused]

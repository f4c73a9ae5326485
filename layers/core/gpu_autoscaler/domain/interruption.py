"""What AWS says about our capacity, and what to do about it.

Parsing turns the six EventBridge event kinds into one `Notice`; `decide` turns a notice about an
instance we own into one `Response`. Both are pure, so the same logic serves the Lambda, the
emulator and the simulator.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from gpu_autoscaler.domain.drain import movable
from gpu_autoscaler.models.pods import PendingPod
from gpu_autoscaler.models.resources import CPU

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpu_autoscaler.config import NodePool
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.cluster import ClusterPod

__all__ = ["NoticeKind", "Notice", "Response", "UnknownEvent", "decide", "parse_notice", "replacement_pods"]

SPOT_WARNING = timedelta(minutes=2)
DRAIN_MARGIN = timedelta(seconds=30)
"""Drains aim to finish this long before AWS acts, so a last eviction is not cut off mid-flight."""
EVICTION_WINDOW = timedelta(minutes=5)
"""Replace-then-drain waits for the replacement no later than this before the deadline: time left to evict."""
DEFAULT_DRAIN_TIMEOUT = timedelta(minutes=30)
STOPPED_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
CAPACITY_BLOCK_TERMINATION = timedelta(minutes=30)
"""EC2 terminates a Capacity Block's instances from 30 minutes before the block ends (EC2 User Guide, "Capacity
Blocks for ML"), 10 minutes after its expiration warning."""
RESERVATION_WARNINGS = frozenset({"EC2 Capacity Reservation Instance Interruption Warning",
                                  "EC2 Interruptible Capacity Reservation Instance Interruption Warning"})
CAPACITY_BLOCK_WARNINGS = frozenset({"Capacity Block Reservation Expiration Warning",
                                     "Capacity Block Expiration Warning"})


class UnknownEvent(ValueError):
    """An event this function does not handle; the message is acknowledged, never retried."""


class NoticeKind(StrEnum):
    SPOT_INTERRUPTION = "spot-interruption"
    REBALANCE = "rebalance"
    STATE_CHANGE = "state-change"
    RESERVATION_INTERRUPTION = "reservation-interruption"
    SCHEDULED_CHANGE = "scheduled-change"
    CAPACITY_BLOCK_EXPIRY = "capacity-block-expiry"


class Notice(BaseModel):
    model_config = ConfigDict(frozen=True)

    event_id: str
    kind: NoticeKind
    instance_ids: tuple[str, ...]
    time: datetime
    deadline: datetime | None = None
    """When AWS acts: termination for a warning, the start of a scheduled change."""
    state: str | None = None
    reservation_id: str | None = None
    """A Capacity Block's expiration names the reservation; its instances are found from it (claims, EC2)."""

    @property
    def dedup_keys(self) -> list[str]:
        """The same instance and kind act once, whatever event id AWS gave a repeated notice."""
        return [f"{self.kind}#{instance}" for instance in self.instance_ids]


def parse_notice(event: dict[str, Any]) -> Notice:
    """Raise `UnknownEvent` for shapes we do not act on, `ValueError` for broken ones."""
    detail_type = event.get("detail-type")
    detail = event.get("detail") or {}
    try:
        time = _iso(event["time"])
        event_id = str(event["id"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not an EventBridge event: missing {exc}") from None
    common = {"event_id": event_id, "time": time}
    if detail_type == "EC2 Spot Instance Interruption Warning":
        action_time = detail.get("instance-action-time")
        deadline = _iso(action_time) if action_time else time + SPOT_WARNING
        return Notice(kind=NoticeKind.SPOT_INTERRUPTION, instance_ids=(_instance(detail),), deadline=deadline, **common)
    if detail_type == "EC2 Instance Rebalance Recommendation":
        return Notice(kind=NoticeKind.REBALANCE, instance_ids=(_instance(detail),), **common)
    if detail_type == "EC2 Instance State-change Notification":
        state = detail.get("state")
        if state not in STOPPED_STATES:
            raise UnknownEvent(f"instance state '{state}' needs no action")
        return Notice(kind=NoticeKind.STATE_CHANGE, instance_ids=(_instance(detail),), state=state, **common)
    if detail_type in CAPACITY_BLOCK_WARNINGS:
        reservation = detail.get("capacity-reservation-id")
        if not isinstance(reservation, str) or not reservation.startswith("cr-"):
            raise ValueError(f"capacity block event names no capacity-reservation-id: {detail!r}")
        end = detail.get("end-date")
        deadline = _iso(end) - CAPACITY_BLOCK_TERMINATION if end else time + timedelta(minutes=10)
        return Notice(kind=NoticeKind.CAPACITY_BLOCK_EXPIRY, instance_ids=(), reservation_id=reservation,
                      deadline=deadline, **common)
    if detail_type in RESERVATION_WARNINGS:
        when = detail.get("instance-termination-time")
        deadline = _iso(when) if when else time + SPOT_WARNING
        return Notice(kind=NoticeKind.RESERVATION_INTERRUPTION, instance_ids=(_instance(detail),), deadline=deadline,
                      **common)
    if detail_type == "AWS Health Event":
        if detail.get("service") != "EC2" or detail.get("eventTypeCategory") != "scheduledChange":
            raise UnknownEvent("AWS Health event is not an EC2 scheduled change")
        instances = tuple(
            e["entityValue"] for e in detail.get("affectedEntities", [])
            if str(e.get("entityValue", "")).startswith("i-")
        ) or tuple(r for r in event.get("resources", []) if str(r).startswith("i-"))
        if not instances:
            raise UnknownEvent("AWS Health scheduled change names no instance")
        start = detail.get("startTime")
        return Notice(kind=NoticeKind.SCHEDULED_CHANGE, instance_ids=instances,
                      deadline=_health_time(start) if start else None, **common)
    raise UnknownEvent(f"detail-type '{detail_type}' is not handled")


class Response(BaseModel):
    """What to do for one instance we own."""

    model_config = ConfigDict(frozen=True)

    instance_id: str
    claim_id: str
    cordon_now: bool = False
    replace: bool = False
    """Launch capacity for the node's pods now, through the packer's path."""
    mark_unavailable: bool = False
    """Spot or the reservation took the capacity back: do not pick this offering again for a while."""
    drain: bool = False
    involuntary: bool = False
    drain_deadline: datetime | None = None
    wait_for_replacement: bool = False
    """Drain only once the replacement is Ready (or at `wait_until`)."""
    wait_until: datetime | None = None
    """The latest moment the drain waits for the replacement; the evictions then have until `drain_deadline`."""
    terminate_after: datetime | None = None
    """A Spot warning's `instance-action-time`: the instance is not terminated before AWS reclaims it."""
    termination_grace_period: timedelta | None = None
    """A voluntary drain's (rebalance) terminationGracePeriod, the pool's."""
    close: bool = False
    """The instance is gone or going: end the claim, release its pods, delete the Node."""
    reason: str = ""


def decide(notice: Notice, instance_id: str, claim: NodeClaim, pool: NodePool | None, now: datetime,
           *, drain_timeout: timedelta = DEFAULT_DRAIN_TIMEOUT) -> Response:
    """`drain_timeout` bounds a rebalance drain once it may start (`Timeouts.interruption_drain`)."""
    base = {"instance_id": instance_id, "claim_id": claim.id}
    if notice.kind is NoticeKind.STATE_CHANGE:
        return Response(close=True, reason=f"instance {notice.state}", **base)
    if notice.kind is NoticeKind.SPOT_INTERRUPTION:
        action = notice.deadline or now + SPOT_WARNING
        deadline = max(action - DRAIN_MARGIN, now)
        return Response(cordon_now=True, replace=True, mark_unavailable=True, drain=True, involuntary=True,
                        drain_deadline=deadline, wait_until=now, terminate_after=action,
                        reason="spot interruption warning", **base)
    if notice.kind is NoticeKind.REBALANCE:
        if pool is not None and pool.disruption.rebalance == "ignore":
            return Response(reason="rebalance recommendation ignored by pool setting", **base)
        after = pool.disruption.rebalance_drain_after if pool else timedelta(minutes=10)
        return Response(replace=True, drain=True, wait_for_replacement=True, wait_until=now + after,
                        drain_deadline=now + after + drain_timeout, reason="rebalance recommendation",
                        termination_grace_period=pool.termination_grace_period if pool else None, **base)
    # A reservation's end and a scheduled change (retirement, reboot, maintenance) take the instance at their
    # time whatever runs on it: involuntary, so what remains is deleted in time for its grace period. Cordoned at
    # once, as Karpenter (`CordonAndDrain`) and aws-node-termination-handler act on both: no new pod should land on
    # a node that is going while its replacement boots.
    # A scheduled change already under way (an update of it, a notice redriven from the dead-letter queue) names an
    # instance that still runs, at a time already past: its pods get `EVICTION_WINDOW`, as Karpenter's graceful
    # drain would give them time, not a deletion at once. A reservation's end is EC2's hard time, past or not.
    deadline = max((notice.deadline - DRAIN_MARGIN) if notice.deadline else now + timedelta(minutes=10), now)
    reservation = notice.kind in (NoticeKind.RESERVATION_INTERRUPTION, NoticeKind.CAPACITY_BLOCK_EXPIRY)
    if not reservation and notice.deadline is not None and notice.deadline <= now:
        deadline = now + EVICTION_WINDOW
    return Response(replace=True, drain=True, involuntary=True, wait_for_replacement=True,
                    cordon_now=True, mark_unavailable=reservation, drain_deadline=deadline,
                    wait_until=max(deadline - EVICTION_WINDOW, now), reason=str(notice.kind).replace("-", " "),
                    **base)


def replacement_pods(pods: Iterable[ClusterPod]) -> list[PendingPod]:
    """The pods of a node about to go, as pending pods the solver plans a replacement for.

    DaemonSet, mirror and finished pods need no room elsewhere. Requests go back to quantity strings in the
    canonical units the cluster adapter read them in (millicores for cpu, plain units for the rest). The zones of
    their volumes go along: the recreated pod keeps its claims, so it can run only where they attach. So do its
    anti-affinity terms on the node that count the pod itself (`PendingPod.pod_anti_affinity`): the packer gives
    such pods a new node each.
    """
    return [
        PendingPod(
            uid=pod.uid, namespace=pod.namespace, name=pod.name, created_at=pod.created_at,
            requests={name: f"{value}m" if name == CPU else str(value) for name, value in pod.requests.items()},
            node_selector=pod.node_selector, required_node_affinity=pod.required_node_affinity,
            preferred_node_affinity=pod.preferred_node_affinity, tolerations=pod.tolerations, priority=pod.priority,
            annotations=pod.annotations, volume_zones=pod.volume_zones,
            pod_anti_affinity=tuple(t for t in pod.pod_anti_affinity if t.counts(pod.namespace, pod.namespace,
                                                                                 pod.labels)),
        )
        for pod in pods
        if movable(pod)
    ]


def _instance(detail: dict[str, Any]) -> str:
    instance = detail.get("instance-id")
    if not isinstance(instance, str) or not instance.startswith("i-"):
        raise ValueError(f"event detail has no instance-id: {detail!r}")
    return instance


def _iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _health_time(text: str) -> datetime:
    """AWS Health writes RFC 1123 dates (`Sat, 05 Jun 2016 15:10:09 GMT`); accept ISO too."""
    try:
        return parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return _iso(text)

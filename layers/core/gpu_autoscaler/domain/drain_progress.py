"""What the claim of a draining node says of its drain: what was asked, and when a drain last worked on it.

A drain lives only in its SQS messages (`services.drain` re-enqueues itself). A message dead-lettered after
`wiring.MAX_RECEIVE_COUNT` deliveries, or an interruption invocation that marked the claim Draining and failed
before sending its drain on every delivery, leaves the claim Draining with nothing working on it: the node
cordoned and paid for, a slot of its pool's disruption budget taken, for good (garbage collection closes a
Draining claim only once its instance is gone). Karpenter's termination is level-triggered instead: a Node with a
deletionTimestamp is reconciled, requeued with backoff, until its finalizer comes off
(kubernetes-sigs/karpenter pkg/controllers/node/termination/controller.go, `Reconcile` → `finalize`).

Here the claim carries the drain: the transition to Draining records the request (`DRAIN_REQUEST_ATTRIBUTE`) and
the instant (`DRAIN_SEEN_ATTRIBUTE`), and each drain pass stamps both again once `HEARTBEAT` has passed since the
last stamp (one write per pass at most; none for the passes a blocked drain makes within a minute). The consolidate
tick's reconcile step (`services.reconcile`) sends the recorded request again when no stamp is newer than its bound
(`stalled_after`), or ends the claim through the fleet once the node's termination time has passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import ValidationError

from gpu_autoscaler.domain.drain import MAX_DELAY
from gpu_autoscaler.models.claims import ClaimState, instant_attribute
from gpu_autoscaler.models.messages import DrainRequest

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.models.claims import NodeClaim

__all__ = [
    "DRAIN_REQUEST_ATTRIBUTE",
    "DRAIN_SEEN_ATTRIBUTE",
    "HEARTBEAT",
    "DrainProgress",
    "drain_progress",
    "progress_attributes",
    "stamp_due",
    "stalled_after",
]

DRAIN_REQUEST_ATTRIBUTE = "drainRequest"
"""NodeClaim attribute of a Draining claim: the `DrainRequest` last working on it (JSON, by alias), as it stood at
the last stamp (its `cordonedAt` once known), so a drain sent again carries what the lost one was asked."""
DRAIN_SEEN_ATTRIBUTE = "drainSeenAt"
"""NodeClaim attribute of a Draining claim: when a drain last worked on it (or was sent again), ISO 8601."""
HEARTBEAT = timedelta(minutes=1)
"""A drain pass stamps the claim only if the last stamp is at least this old: a drain blocked by a
PodDisruptionBudget looks every 5–60 s, and a write per look would cost more than the signal is worth."""


@dataclass(frozen=True)
class DrainProgress:
    seen_at: datetime
    """The last stamp; for a claim never stamped (made Draining before drains stamped), its Draining transition."""
    request: DrainRequest
    """What the drain was asked. For a claim with none recorded (or none readable): a voluntary drain of its node
    with its Draining transition's reason and nothing to wait for, which forces nothing."""


def stalled_after(visibility_timeout: timedelta) -> timedelta:
    """How long a Draining claim may go unstamped before its drain counts as lost: the longest a live drain goes
    between two stamps. That is a continuation's delay (at most `MAX_DELAY`, SQS's 15-minute DelaySeconds), then
    a delivery that fails or whose invocation dies, handed out again only after the queue's `visibility_timeout`
    (6 × the drain function's timeout: 30 minutes), plus the `HEARTBEAT` a pass may skip its stamp within: 46
    minutes in the stack. A drain still alive past it is only sent twice, which is harmless (every step of a drain
    is safe to repeat)."""
    return MAX_DELAY + visibility_timeout + HEARTBEAT


def drain_progress(claim: NodeClaim) -> DrainProgress | None:
    """The drain of a Draining claim, as recorded on it; None for a claim in another state."""
    if claim.state is not ClaimState.DRAINING:
        return None
    entered = next((t for t in reversed(claim.history) if t.state is ClaimState.DRAINING), None)
    began = entered.at if entered is not None else claim.updated_at or claim.created_at
    request = None
    raw = claim.attributes.get(DRAIN_REQUEST_ATTRIBUTE)
    if raw:
        try:
            request = DrainRequest.model_validate_json(raw)
        except ValidationError:
            request = None
    if request is None:
        request = DrainRequest(cluster=claim.cluster, node_name=claim.node_name, instance_id=claim.instance_id,
                               claim_id=claim.id, reason=(entered.reason if entered is not None else "") or claim.reason
                               or "draining", deadline=began)
    return DrainProgress(instant_attribute(claim, DRAIN_SEEN_ATTRIBUTE) or began, request)


def stamp_due(claim: NodeClaim, now: datetime) -> bool:
    """Whether a drain pass on this claim stamps it now: Draining, and unstamped or stamped `HEARTBEAT` ago."""
    if claim.state is not ClaimState.DRAINING:
        return False
    seen = instant_attribute(claim, DRAIN_SEEN_ATTRIBUTE)
    return seen is None or now - seen >= HEARTBEAT


def progress_attributes(attributes: Mapping[str, str], request: DrainRequest, now: datetime) -> dict[str, str]:
    """`attributes` with the drain stamped: `request` working on it as of `now`."""
    return {**attributes, DRAIN_REQUEST_ATTRIBUTE: request.model_dump_json(by_alias=True, exclude_none=True),
            DRAIN_SEEN_ATTRIBUTE: now.isoformat()}

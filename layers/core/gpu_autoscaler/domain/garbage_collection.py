"""Garbage collection: what EC2 has and the claims do not agree on, decided from the two lists alone.

As Karpenter's `instance.garbagecollection` controller does (list the cloud first, then the claims): an owned
instance that no live claim accounts for, older than the grace period, is a leak (a launch recorded nowhere, a
termination that did not take, a claim closed while EC2 still had the instance pending) and is terminated. The
other way round, a claim whose instance EC2 no longer shows (or shows shutting down) for longer than the grace
period has lost its capacity without a state-change event reaching us, and is closed. The grace covers both
EC2's eventual consistency (a just-launched instance may be missing from DescribeInstances for a while) and the
seconds between CreateFleet and the claim write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_autoscaler.models.claims import ClaimState

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime, timedelta

    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.fleet import OwnedInstance

__all__ = ["Collection", "collect", "launched_at"]

_HAS_INSTANCE = frozenset({ClaimState.LAUNCHED, ClaimState.REGISTERED, ClaimState.DRAINING})


@dataclass
class Collection:
    leaked: list[OwnedInstance] = field(default_factory=list)
    """Owned instances no live claim accounts for: terminate them."""
    gone: list[NodeClaim] = field(default_factory=list)
    """Live claims whose instance EC2 no longer has: close them."""


def launched_at(claim: NodeClaim) -> datetime:
    """When the claim's instance was launched (its last Launched transition), else when it was created."""
    for step in reversed(claim.history):
        if step.state is ClaimState.LAUNCHED:
            return step.at
    return claim.created_at


def collect(instances: Sequence[OwnedInstance], claims: Sequence[NodeClaim], now: datetime,
            grace: timedelta) -> Collection:
    """`instances`: listed before `claims` were read, so a claim written in between is seen, never missed."""
    live = [c for c in claims if c.state is not ClaimState.TERMINATED]
    by_instance = {c.instance_id: c for c in live if c.instance_id}
    pending = {c.id for c in live if c.state is ClaimState.PENDING}
    out = Collection()
    for instance in instances:
        if instance.gone or instance.instance_id in by_instance:
            continue
        if instance.claim_id in pending:
            continue  # launched for a claim whose launch is being recorded: the fleet keeps it or ends it
        if instance.launched_at is None or now - instance.launched_at < grace:
            continue
        out.leaked.append(instance)
    present = {i.instance_id for i in instances if not i.gone}
    for claim in live:
        if claim.state in _HAS_INSTANCE and claim.instance_id and claim.instance_id not in present:
            if now - launched_at(claim) >= grace:
                out.gone.append(claim)
    return out

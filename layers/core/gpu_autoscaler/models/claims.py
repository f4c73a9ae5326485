"""NodeClaims: the capacity we decided to have, and where each one is in its life."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from gpu_autoscaler.config import CapacityType

__all__ = [
    "ALLOWED_TRANSITIONS",
    "CLAIMED_STATES",
    "IN_FLIGHT_STATES",
    "ClaimState",
    "NodeClaim",
    "StateTransition",
    "instant_attribute",
    "launched_at",
    "registered_at",
]


class ClaimState(StrEnum):
    PENDING = "Pending"
    LAUNCHED = "Launched"
    REGISTERED = "Registered"
    DRAINING = "Draining"
    TERMINATED = "Terminated"


CLAIMED_STATES = (ClaimState.PENDING, ClaimState.LAUNCHED, ClaimState.REGISTERED, ClaimState.DRAINING)
"""Every state but Terminated: claims that cost money or are about to, and count against pool limits and quotas.
What a function reads when it reads the claims in play (the state table keeps ended ones apart)."""
IN_FLIGHT_STATES = frozenset({ClaimState.PENDING, ClaimState.LAUNCHED})
"""Claims whose node has not joined yet: their free room is only known to us, not to kube-scheduler."""

ALLOWED_TRANSITIONS: dict[ClaimState, frozenset[ClaimState]] = {
    ClaimState.PENDING: frozenset({ClaimState.LAUNCHED, ClaimState.TERMINATED}),
    ClaimState.LAUNCHED: frozenset({ClaimState.REGISTERED, ClaimState.DRAINING, ClaimState.TERMINATED}),
    ClaimState.REGISTERED: frozenset({ClaimState.DRAINING, ClaimState.TERMINATED}),
    ClaimState.DRAINING: frozenset({ClaimState.TERMINATED}),
    ClaimState.TERMINATED: frozenset(),
}


class StateTransition(BaseModel):
    model_config = ConfigDict(frozen=True)

    state: ClaimState
    at: datetime
    reason: str = ""


class NodeClaim(BaseModel):
    """One node we asked for. Candidates are ranked, cheapest first; every one fits all its pods."""

    model_config = ConfigDict(frozen=True)

    cluster: str
    id: str
    pool: str
    capacity_type: CapacityType
    zones: tuple[str, ...]
    instance_types: tuple[str, ...]
    """Ranked candidates (≤ 60), cheapest first."""
    price_per_hour: float
    """Price of the first candidate in its cheapest zone: what the plan expects to pay."""
    pods: tuple[str, ...] = ()
    """Pod uids the claim was made for."""
    gang: str | None = None
    state: ClaimState = ClaimState.PENDING
    created_at: datetime
    updated_at: datetime | None = None
    history: tuple[StateTransition, ...] = ()
    instance_id: str | None = None
    instance_type: str | None = None
    zone: str | None = None
    launched_price_per_hour: float | None = None
    reservation_id: str | None = None
    node_name: str | None = None
    reason: str = ""
    """Why the claim exists (pending pods, replacement for i-…, warm for a window) or why it ended."""
    warm: str | None = None
    """Set for warm capacity: `window:<name>` or `forecast`; consolidation leaves it alone while held."""
    attributes: dict[str, str] = Field(default_factory=dict)
    version: int = Field(default=0, ge=0)
    """Bumped by every stored write. Each conditional write (`StateStore.transition`, `update_claim`) succeeds only
    on the version it was read at, so two functions updating one claim cannot overwrite each other's change; the
    loser gets `StaleClaim`, reads again and decides again (or gives up), as its caller documents."""

    @property
    def live(self) -> bool:
        return self.state not in (ClaimState.TERMINATED, ClaimState.DRAINING)


def _last_entered(claim: NodeClaim, state: ClaimState) -> datetime | None:
    return next((step.at for step in reversed(claim.history) if step.state is state), None)


def launched_at(claim: NodeClaim) -> datetime:
    """When the claim's instance was launched (its last Launched transition), else when it was created."""
    return _last_entered(claim, ClaimState.LAUNCHED) or claim.created_at


def registered_at(claim: NodeClaim) -> datetime:
    """When the claim's Node registered (its last Registered transition), else when it was launched."""
    return _last_entered(claim, ClaimState.REGISTERED) or launched_at(claim)


def instant_attribute(claim: NodeClaim, key: str) -> datetime | None:
    """The instant a claim attribute records (ISO 8601), or None where it records none or one that cannot be read:
    each reader then falls back as it documents."""
    raw = claim.attributes.get(key)
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw)
    except ValueError:
        return None

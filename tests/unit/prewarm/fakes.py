"""In-memory stand-ins for the prewarm service's ports: a StateStore and a launch queue that record calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.errors import ClaimExists, StaleClaim
from gpu_autoscaler.models.claims import ALLOWED_TRANSITIONS, StateTransition

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime, timedelta

    from gpu_autoscaler.models.boot import BootSample
    from gpu_autoscaler.models.claims import ClaimState, NodeClaim
    from gpu_autoscaler.models.messages import LaunchRequest


class MemoryStore:
    """The StateStore operations prewarm uses, with the protocol's conditional semantics."""

    def __init__(self) -> None:
        self.claims: dict[str, NodeClaim] = {}
        self.demand: dict[str, dict[datetime, float]] = {}
        self.unavailable: set[tuple[str, str, str]] = set()
        self.boots: list[BootSample] = []

    def create_claim(self, claim: NodeClaim) -> None:
        if claim.id in self.claims:
            raise ClaimExists(claim.id)
        self.claims[claim.id] = claim

    def get_claim(self, claim_id: str) -> NodeClaim | None:
        return self.claims.get(claim_id)

    def list_claims(self, states: Iterable[ClaimState] | None = None) -> list[NodeClaim]:
        wanted = set(states) if states is not None else None
        return [c for c in self.claims.values() if wanted is None or c.state in wanted]

    def _current(self, claim: NodeClaim) -> NodeClaim:
        stored = self.claims.get(claim.id)
        if stored is None or stored.state is not claim.state:
            raise StaleClaim(claim.id)
        return stored

    def transition(self, claim: NodeClaim, to: ClaimState, reason: str = "", **changes: object) -> NodeClaim:
        stored = self._current(claim)
        if to not in ALLOWED_TRANSITIONS[stored.state]:
            raise StaleClaim(f"{claim.id}: {stored.state} → {to} is not allowed")
        moved = stored.model_copy(update={
            **changes, "state": to, "history": (*stored.history, StateTransition(state=to, at=stored.created_at,
                                                                                   reason=reason)),
        })
        self.claims[claim.id] = moved
        return moved

    def boot_times(self, pool: str, since: datetime) -> list[BootSample]:
        return [b for b in self.boots if b.pool == pool and b.launched_at >= since]

    def update_claim(self, claim: NodeClaim, **changes: object) -> NodeClaim:
        stored = self._current(claim)
        updated = stored.model_copy(update=changes)
        self.claims[claim.id] = updated
        return updated

    def unavailable_offerings(self) -> set[tuple[str, str, str]]:
        return set(self.unavailable)

    def record_demand(self, pool: str, bucket: datetime, gpus: float, ttl: timedelta) -> None:
        self.demand.setdefault(pool, {})[bucket] = gpus

    def demand_history(self, pool: str, since: datetime) -> list[tuple[datetime, float]]:
        return sorted((b, g) for b, g in self.demand.get(pool, {}).items() if b >= since)


class RecordingQueue:
    def __init__(self) -> None:
        self.sent: list[LaunchRequest] = []

    def send(self, request: LaunchRequest) -> None:
        self.sent.append(request)


    def send_many(self, requests: Sequence[LaunchRequest]) -> None:
        self.sent.extend(requests)

    @property
    def claim_ids(self) -> list[str]:
        return [i for r in self.sent for i in r.claim_ids]

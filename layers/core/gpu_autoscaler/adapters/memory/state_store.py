"""`StateStore` in one process: the simulator's store, and the tests' stand-in for the DynamoDB one.

It keeps the DynamoDB store's semantics exactly — conditional lifecycle writes, TTLs read against the
injected clock, a pod covered by at most one live claim — so a service tested against it behaves the
same in a Lambda.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.errors import ClaimExists, StaleClaim
from gpu_autoscaler.models.claims import ALLOWED_TRANSITIONS, ClaimState, NodeClaim, StateTransition

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime, timedelta

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.models.boot import BootSample

__all__ = ["MemoryStateStore", "apply_transition", "apply_update", "check_version"]


def apply_transition(stored: NodeClaim, expected: ClaimState, to: ClaimState, now: datetime, reason: str,
                     changes: dict[str, object]) -> NodeClaim:
    """The one definition of a lifecycle step, shared by both stores: checked against the stored state and
    the allowed transitions, recorded in the claim's history, the version bumped."""
    if stored.state is not expected:
        raise StaleClaim(f"claim {stored.id} is {stored.state}, not {expected}")
    if to not in ALLOWED_TRANSITIONS[stored.state]:
        raise StaleClaim(f"claim {stored.id}: {stored.state} → {to} is not allowed")
    return stored.model_copy(update={
        **changes,
        "state": to,
        "updated_at": now,
        "reason": reason or stored.reason,
        "history": (*stored.history, StateTransition(state=to, at=now, reason=reason)),
        "version": stored.version + 1,
    })


def check_version(stored: NodeClaim, claim: NodeClaim) -> None:
    """The write is based on `claim`; it stands only if nothing was written since `claim` was read."""
    if stored.version != claim.version:
        raise StaleClaim(f"claim {claim.id} is at version {stored.version}, the copy written from is at "
                         f"{claim.version}: it changed since it was read")


def apply_update(stored: NodeClaim, claim: NodeClaim, now: datetime, changes: dict[str, object]) -> NodeClaim:
    """The one definition of a field update (not of the state), shared by both stores."""
    if stored.state is not claim.state:
        raise StaleClaim(f"claim {claim.id} is {stored.state}, not {claim.state}")
    check_version(stored, claim)
    return stored.model_copy(update={**changes, "updated_at": now, "version": stored.version + 1})


class MemoryStateStore:
    """Dicts behind the `StateStore` protocol."""

    def __init__(self, cluster: str, clock: Clock) -> None:
        self.cluster = cluster
        self.clock = clock
        self._claims: dict[str, NodeClaim] = {}
        self._by_instance: dict[str, str] = {}
        self._pods: dict[str, tuple[str, datetime]] = {}
        self._unavailable: dict[tuple[str, str, str], tuple[datetime, str]] = {}
        self._demand: dict[str, dict[datetime, float]] = {}
        self._boots: dict[str, dict[str, tuple[BootSample, datetime]]] = {}
        """Pool → `<launch time>#<claim id>` → (sample, expiry)."""

    # NodeClaims

    def create_claim(self, claim: NodeClaim) -> None:
        if claim.id in self._claims:
            raise ClaimExists(claim.id)
        self._store(claim)

    def create_claims(self, claims: Sequence[NodeClaim]) -> set[str]:
        existing = set()
        for claim in claims:
            try:
                self.create_claim(claim)
            except ClaimExists:
                existing.add(claim.id)
        return existing

    def get_claim(self, claim_id: str) -> NodeClaim | None:
        return self._claims.get(claim_id)

    def get_claims(self, claim_ids: Iterable[str]) -> dict[str, NodeClaim]:
        return {cid: self._claims[cid] for cid in claim_ids if cid in self._claims}

    def claim_for_instance(self, instance_id: str) -> NodeClaim | None:
        claim_id = self._by_instance.get(instance_id)
        return self._claims.get(claim_id) if claim_id else None

    def list_claims(self, states: Iterable[ClaimState] | None = None) -> list[NodeClaim]:
        wanted = set(states) if states is not None else None
        return [c for c in self._claims.values() if wanted is None or c.state in wanted]

    def transition(self, claim: NodeClaim, to: ClaimState, reason: str = "", **changes: object) -> NodeClaim:
        stored = self._current(claim)
        moved = apply_transition(stored, claim.state, to, self.clock.now(), reason, changes)
        check_version(stored, claim)
        self._store(moved)
        return moved

    def update_claim(self, claim: NodeClaim, **changes: object) -> NodeClaim:
        updated = apply_update(self._current(claim), claim, self.clock.now(), changes)
        self._store(updated)
        return updated

    def update_claims(self, updates: Sequence[tuple[NodeClaim, Mapping[str, object]]]) -> dict[str, NodeClaim]:
        written: dict[str, NodeClaim] = {}
        for claim, changes in updates:
            try:
                written[claim.id] = self.update_claim(claim, **changes)
            except StaleClaim:
                continue
        return written

    def _current(self, claim: NodeClaim) -> NodeClaim:
        stored = self._claims.get(claim.id)
        if stored is None:
            raise StaleClaim(f"claim {claim.id} is not stored")
        return stored

    def _store(self, claim: NodeClaim) -> None:
        self._claims[claim.id] = claim
        if claim.instance_id:
            self._by_instance[claim.instance_id] = claim.id

    # Pod assignments

    def assign_pods(self, claim_id: str, pod_uids: Sequence[str], ttl: timedelta) -> list[str]:
        expires = self.clock.now() + ttl
        newly = []
        for uid in pod_uids:
            owner = self._live_owner(uid)
            if owner is None or owner == claim_id:
                self._pods[uid] = (claim_id, expires)
            if owner is None:
                newly.append(uid)
        return newly

    def assign_many(self, wanted: Mapping[str, Sequence[str]], ttl: timedelta) -> dict[str, list[str]]:
        newly = {claim_id: self.assign_pods(claim_id, uids, ttl) for claim_id, uids in wanted.items()}
        return {claim_id: uids for claim_id, uids in newly.items() if uids}

    def assignments(self, pod_uids: Sequence[str]) -> dict[str, str]:
        return {uid: owner for uid in pod_uids if (owner := self._live_owner(uid)) is not None}

    def release_pods(self, pod_uids: Sequence[str]) -> None:
        for uid in pod_uids:
            self._pods.pop(uid, None)

    def _live_owner(self, uid: str) -> str | None:
        found = self._pods.get(uid)
        if found is None or found[1] <= self.clock.now():
            return None
        claim = self._claims.get(found[0])
        return found[0] if claim is not None and claim.live else None

    # Unavailable offerings

    def mark_unavailable(self, offering: tuple[str, str, str], ttl: timedelta, reason: str) -> None:
        self._unavailable[offering] = (self.clock.now() + ttl, reason)

    def unavailable_offerings(self) -> set[tuple[str, str, str]]:
        now = self.clock.now()
        return {key for key, (until, _) in self._unavailable.items() if until > now}

    # Demand history

    def record_demand(self, pool: str, bucket: datetime, gpus: float, ttl: timedelta) -> None:
        """The bucket keeps its peak: the packer and the reconcile step both report into the same bucket."""
        buckets = self._demand.setdefault(pool, {})
        buckets[bucket] = max(buckets.get(bucket, 0.0), gpus)

    def demand_history(self, pool: str, since: datetime) -> list[tuple[datetime, float]]:
        return sorted((b, g) for b, g in self._demand.get(pool, {}).items() if b >= since)

    # Boot times

    def record_boot_time(self, sample: BootSample, ttl: timedelta) -> None:
        key = f"{sample.launched_at.isoformat()}#{sample.claim_id}"
        self._boots.setdefault(sample.pool, {}).setdefault(key, (sample, self.clock.now() + ttl))

    def boot_times(self, pool: str, since: datetime) -> list[BootSample]:
        """Expired samples are dropped as they are read (TTL deletion), so a weeks-long simulation stays small."""
        now = self.clock.now()
        kept = self._boots.get(pool, {})
        for key in [k for k, (_, until) in kept.items() if until <= now]:
            del kept[key]
        found = [sample for sample, _ in kept.values() if sample.launched_at >= since]
        return sorted(found, key=lambda s: (s.launched_at, s.claim_id))

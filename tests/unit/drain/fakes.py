"""A fleet that terminates by ending the claim in the store, recording each call: the drain's only way out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.models.claims import ClaimState

if TYPE_CHECKING:
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.ports import StateStore


class RecordingFleet:
    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.terminated: list[tuple[str, str]] = []

    def terminate(self, claim: NodeClaim, reason: str) -> NodeClaim:
        current = self.store.get_claim(claim.id) or claim
        self.terminated.append((claim.id, reason))
        if current.state is ClaimState.TERMINATED:
            return current
        return self.store.transition(current, ClaimState.TERMINATED, reason)

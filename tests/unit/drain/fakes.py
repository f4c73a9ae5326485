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
        self.shutting_down: set[str] = set()
        """Instances EC2 still shows shutting down after their termination (the rest are gone at once)."""

    def terminate(self, claim: NodeClaim, reason: str) -> NodeClaim:
        current = self.store.get_claim(claim.id) or claim
        self.terminated.append((claim.id, reason))
        if current.state is ClaimState.TERMINATED:
            return current
        return self.store.transition(current, ClaimState.TERMINATED, reason)

    def instance_gone(self, claim: NodeClaim) -> bool:
        return claim.instance_id not in self.shutting_down

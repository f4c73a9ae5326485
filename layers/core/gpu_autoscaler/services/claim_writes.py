"""How a function retries a claim write another function got in first with (`StaleClaim`).

Every conditional write of a claim (`StateStore.transition`, `update_claim`) stands only on the version it was
read at. When it loses, the caller follows one of two policies, each chosen where it is called:

- **Retry** (`write_fresh`): the change still makes sense on whatever the other writer did, so read again, check
  the claim is still in a state the change applies to, recompute the change from the fresh copy and write again,
  up to `WRITE_ATTEMPTS` times. Used where losing would lose work or capacity: the fleet recording a launch
  attempt, an instance launched, a claim that cannot launch; the packer adding pods to claims in flight
  (`write_fresh_many`: a document's claims in a few transactions, only the refused ones read again); the fleet
  ending a claim (`FleetService.terminate`); a notice or drain moving a claim to Draining.
- **Give up** (catch `StaleClaim`, log, move on): the change was decided from a picture that is now outdated, and
  the next tick decides again from a fresh one. Used by consolidation (its disruption marks and `emptySince`),
  reconcile (Registered: next minute), prewarm (warm holds: next tick), a planner withdrawing its claims past a
  pool's limits (`withdraw_beyond_limits`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gpu_autoscaler.errors import StaleClaim
from gpu_autoscaler.models.claims import CLAIMED_STATES, ClaimState

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from gpu_autoscaler.domain.packing.solver import Solver
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.ports import StateStore

__all__ = ["WRITE_ATTEMPTS", "withdraw_beyond_limits", "write_fresh", "write_fresh_many"]

logger = logging.getLogger(__name__)

WRITE_ATTEMPTS = 3
"""Writers of one claim are few (packer, fleet, reconcile, a notice, a drain): three reads settle any race."""


def write_fresh(store: StateStore, claim: NodeClaim, write: Callable[[NodeClaim], NodeClaim],
                still: Callable[[NodeClaim], bool]) -> NodeClaim:
    """`write(copy)` from `claim`, then, after each conflict, from a fresh copy for which `still(copy)` holds.

    Raises `StaleClaim` when the claim is gone, no longer `still` what the write applies to, or keeps changing.
    """
    current = claim
    for _ in range(WRITE_ATTEMPTS):
        try:
            return write(current)
        except StaleClaim:
            fresh = store.get_claim(claim.id)
            if fresh is None or not still(fresh):
                raise
            current = fresh
    raise StaleClaim(f"claim {claim.id} kept changing under {WRITE_ATTEMPTS} writes")


def write_fresh_many(store: StateStore, claim_ids: Iterable[str],
                     change: Callable[[NodeClaim], Mapping[str, object] | None],
                     still: Callable[[NodeClaim, NodeClaim], bool]) -> tuple[dict[str, NodeClaim], set[str]]:
    """`write_fresh` for many claims in one pass per attempt: read them (`get_claims`), write `change(copy)` of
    each (`update_claims`: each put on its own state and version, a few transactions in all), and read again
    only those another writer got in first with, for as long as `still(first read, fresh copy)` holds, up to
    `WRITE_ATTEMPTS` times. `change` returns None where there is nothing to write.

    Returns (claim id → the claim as written, the ids given up: gone, no longer `still`, or kept changing)."""
    ids = list(dict.fromkeys(claim_ids))
    first = store.get_claims(ids)
    gone = {cid for cid in ids if cid not in first}
    written: dict[str, NodeClaim] = {}
    current = dict(first)
    for _ in range(WRITE_ATTEMPTS):
        updates = [(claim, changes) for claim in current.values() if (changes := change(claim)) is not None]
        done = store.update_claims(updates) if updates else {}
        written.update(done)
        refused = [claim.id for claim, _ in updates if claim.id not in done]
        if not refused:
            return written, gone
        fresh = store.get_claims(refused)
        gone |= {cid for cid in refused if cid not in fresh or not still(first[cid], fresh[cid])}
        current = {cid: claim for cid, claim in fresh.items() if cid not in gone}
        if not current:
            return written, gone
    return written, gone | set(current)


def withdraw_beyond_limits(store: StateStore, solver: Solver, stored: Sequence[NodeClaim], *,
                           together: bool = False) -> list[NodeClaim]:
    """The claims a planner has just stored, less those that other planners' claims, stored meanwhile, leave no room
    for under their pool's `limits` (`Solver.beyond_limits`; `together`: all of them or none, as a consolidation's
    replacements): these are ended before they are ever launched and the pods assigned to them released, to be
    planned on their next report. Only a bounded pool's claims cost the extra read; a claim past Pending (found
    again on a redelivery) is not withdrawn, but counted as another planner's. A claim another writer changed first
    is left as it is (give up: it is no longer only ours)."""
    pending = [c for c in stored if c.state is ClaimState.PENDING]
    if not any(solver.bounded_pool(c.pool) for c in pending):
        return list(stored)
    ended: set[str] = set()
    for claim in solver.beyond_limits(store.list_claims(CLAIMED_STATES), pending, together=together):
        try:
            store.transition(claim, ClaimState.TERMINATED, "withdrawn before launch: claims another planner stored "
                             f"meanwhile leave pool {claim.pool} no room for it within its limits")
        except StaleClaim:
            logger.info("claim %s changed before it could be withdrawn; left as it is", claim.id)
            continue
        ended.add(claim.id)
    if not ended:
        return list(stored)
    pods = [uid for c in stored if c.id in ended for uid in c.pods]
    released = [uid for uid, owner in (store.assignments(pods) if pods else {}).items() if owner in ended]
    logger.info("%d claim(s) withdrawn before launch: other planners' claims took the room pool limits left "
                "meanwhile; %d pod(s) planned on their next report", len(ended), len(released))
    if released:
        store.release_pods(released)
    return [c for c in stored if c.id not in ended]

"""The mark a consolidation decision leaves on the NodeClaims it disrupts, from the decision to the drain.

A decision goes through two phases, as in Karpenter (kubernetes-sigs/karpenter `pkg/controllers/disruption/`:
`validation.go`, `commandValidationDelay = 15s`; the `karpenter.sh/disrupted:NoSchedule` taint of
`orchestration`):

1. **Proposed**: the tick that decides taints the nodes (`domain.drain.DRAIN_TAINT`, so no new pod lands on
   them) and marks their claims with the decision — reason, action, the claims decided together, the number and
   price of the replacements it planned — and `validateAfter` (`VALIDATION_DELAY` later). Nothing else is
   done, and no Lambda waits: the next tick (the consolidate schedule fires every minute) validates.
2. **Validated**: at the first tick at or after `validateAfter`, the same nodes are looked at again — still
   candidates, their pods still fitting elsewhere with no more replacements and no dearer ones than decided.
   If so, the replacements are launched, the mark rewritten (`until` = the drain's deadline, with the
   replacement claim ids) and the drains requested; if not, the mark is removed and the taint taken off.

Until its `until` passes, a marked node is being disrupted: no second decision, not a destination for moving
pods, counted against its pool's budgets. A proposal that no tick validated lapses after `PROPOSAL_TTL`, and
the consolidate tick then takes its taint off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.models.claims import ClaimState

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpu_autoscaler.models.claims import NodeClaim

__all__ = [
    "DISRUPTION_ATTRIBUTE",
    "PROPOSAL_TTL",
    "VALIDATION_DELAY",
    "Proposal",
    "Acting",
    "acting",
    "awaiting_validation",
    "disrupting",
    "drain_sent",
    "disruption_mark",
    "disruption_until",
    "proposal",
    "proposal_mark",
    "unmarked",
]

DISRUPTION_ATTRIBUTE = "disruption"
"""NodeClaim attribute of a node consolidation decided to disrupt: JSON `{"reason", "until", "replacements"}`
(plus, while proposed, `validateAfter`, `action`, `claims`, `replacementCount`, `priceAfter`)."""
VALIDATION_DELAY = timedelta(seconds=15)
"""Karpenter's `commandValidationDelay`: a decision is acted on only if it still holds this long after (the
default of `timeouts.consolidationValidation`)."""
PROPOSAL_TTL = timedelta(minutes=5)
"""A proposal not validated by then (the consolidate function failing) lapses."""


@dataclass(frozen=True)
class Proposal:
    """A decision taken but not yet validated: what the validation compares the new look with."""

    reason: str
    action: str
    claims: tuple[str, ...]
    validate_after: datetime
    until: datetime
    replacements: int = 0
    price_after: float = 0.0


def disruption_mark(reason: str, until: datetime, replacements: Sequence[str]) -> str:
    """The mark of a validated decision: its drain gives up at `until`."""
    return json.dumps({"reason": reason, "until": until.isoformat(), "replacements": list(replacements)},
                      separators=(",", ":"))


def drain_sent(mark: str) -> str:
    """A validated mark once its drain is on the queue: a tick that finds a validated mark without this died
    between marking and sending, and sends the drain again (a drain request is safe to repeat)."""
    data = json.loads(mark)
    return json.dumps({**data, "drainSent": True}, separators=(",", ":"))


def proposal_mark(reason: str, action: str, claims: Sequence[str], now: datetime, replacements: int,
                  price_after: float, delay: timedelta = VALIDATION_DELAY) -> str:
    """The mark of a proposal, to be validated `delay` later (`timeouts.consolidationValidation`)."""
    return json.dumps({"reason": reason, "until": (now + PROPOSAL_TTL).isoformat(), "replacements": [],
                       "validateAfter": (now + delay).isoformat(), "action": action,
                       "claims": list(claims), "replacementCount": replacements,
                       "priceAfter": round(price_after, 6)}, separators=(",", ":"))


def _mark(claim: NodeClaim) -> dict[str, Any] | None:
    raw = claim.attributes.get(DISRUPTION_ATTRIBUTE)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def disruption_until(claim: NodeClaim) -> datetime | None:
    """When the disruption marked on this claim lapses (its drain gives up, its proposal expires); None if none."""
    mark = _mark(claim)
    try:
        return datetime.fromisoformat(mark["until"]) if mark is not None else None
    except (ValueError, KeyError, TypeError):
        return None


def proposal(claim: NodeClaim) -> Proposal | None:
    """The proposal marked on this claim, if it is one (validated marks have no `validateAfter`)."""
    mark = _mark(claim)
    if mark is None or "validateAfter" not in mark:
        return None
    try:
        return Proposal(reason=str(mark["reason"]), action=str(mark["action"]),
                        claims=tuple(str(c) for c in mark["claims"]),
                        validate_after=datetime.fromisoformat(mark["validateAfter"]),
                        until=datetime.fromisoformat(mark["until"]),
                        replacements=int(mark.get("replacementCount", 0)),
                        price_after=float(mark.get("priceAfter", 0.0)))
    except (ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Acting:
    """A validated decision's mark: its drain gives up at `until`; `drain_sent` once the drain was queued."""

    reason: str
    until: datetime
    replacements: tuple[str, ...]
    drain_sent: bool


def acting(claim: NodeClaim) -> Acting | None:
    """The validated mark on this claim, if it carries one (not a proposal)."""
    mark = _mark(claim)
    if mark is None or "validateAfter" in mark:
        return None
    try:
        return Acting(reason=str(mark["reason"]), until=datetime.fromisoformat(mark["until"]),
                      replacements=tuple(str(r) for r in mark.get("replacements", ())),
                      drain_sent=bool(mark.get("drainSent", False)))
    except (ValueError, KeyError, TypeError):
        return None


def unmarked(attributes: dict[str, str]) -> dict[str, str]:
    """A claim's attributes without its disruption mark: the decision is over (not validated, or its drain
    abandoned), and the node is a candidate again at the next tick, as Karpenter's are once un-tainted."""
    return {k: v for k, v in attributes.items() if k != DISRUPTION_ATTRIBUTE}


def disrupting(claim: NodeClaim, now: datetime) -> bool:
    """Being disrupted: Draining, or marked by a decision (proposed or validated) that has not lapsed."""
    until = disruption_until(claim)
    return claim.state is ClaimState.DRAINING or (until is not None and now < until)


def awaiting_validation(claim: NodeClaim, now: datetime) -> bool:
    """Proposed and not lapsed: a tick must look at it again."""
    found = proposal(claim)
    return found is not None and now < found.until

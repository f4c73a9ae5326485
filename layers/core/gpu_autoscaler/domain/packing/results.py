"""What a packing pass decides: new NodeClaims, pods placed on claims already in flight, and the rest.

Like Karpenter's `Results{NewNodeClaims, ExistingNodes, PodErrors}`: plain data, no action taken. The
packer service stores the claims and assignments and sends the launch requests; `plan` prints them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.models.resources import Resources

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.models.claims import NodeClaim

__all__ = [
    "HELD_ATTRIBUTE",
    "REQUESTS_ATTRIBUTE",
    "SOURCE_ATTRIBUTE",
    "Plan",
    "Unschedulable",
    "claim_held",
    "claim_requests",
    "requests_attribute",
]

REQUESTS_ATTRIBUTE = "requests"
"""NodeClaim attribute: JSON object of the summed requests of the claim's pods (canonical integer units),
so a later pass knows how much room the claim has left before its node exists."""
SOURCE_ATTRIBUTE = "source"
"""NodeClaim attribute: the message (SQS message id) whose processing created the claim."""
HELD_ATTRIBUTE = "heldRequests"
"""NodeClaim attribute: the requests of pods a drain took off a claim in flight as it evicted them (JSON, as
`requests`): room kept for their successors against the replacements of other doomed nodes, which would
otherwise take it before the successors are reported (`services.packer.free_room`)."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def requests_attribute(requests: Mapping[str, int]) -> str:
    return json.dumps({k: int(v) for k, v in sorted(requests.items()) if v}, separators=(",", ":"))


def claim_requests(claim: NodeClaim) -> Resources:
    """The summed requests recorded on a claim; empty for claims made without pods (warm capacity)."""
    return _resources(claim.attributes.get(REQUESTS_ATTRIBUTE))


def claim_held(claim: NodeClaim) -> Resources:
    """The room held on a claim for the successors of pods evicted from a doomed node (`HELD_ATTRIBUTE`)."""
    return _resources(claim.attributes.get(HELD_ATTRIBUTE))


_PARSED_LIMIT = 65536
"""Attribute strings whose `Resources` `_resources` keeps; past it, cleared."""
_PARSED: dict[str, Resources] = {}


def _resources(raw: str | None) -> Resources:
    """The JSON of an attribute as `Resources`, kept per string (immutable both): every consolidation pass reads
    every claim's requests again, and parsing them was a tenth of the pass."""
    if not raw:
        return Resources()
    found = _PARSED.get(raw)
    if found is None:
        if len(_PARSED) >= _PARSED_LIMIT:
            _PARSED.clear()
        found = _PARSED[raw] = Resources({str(k): int(v) for k, v in json.loads(raw).items()})
    return found


@dataclass(frozen=True)
class Unschedulable:
    """A pod no node can be planned for now, and why, in words a person acts on."""

    pod: str
    """Pod uid."""
    name: str
    """`namespace/name`."""
    reason: str


@dataclass(frozen=True)
class Plan:
    claims: tuple[NodeClaim, ...] = ()
    """New NodeClaims, to be stored and launched; each candidate type of each fits all its pods."""
    existing: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    """Live claim id → pod uids placed on its free room in this pass."""
    unschedulable: tuple[Unschedulable, ...] = ()
    covered: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    """Pod uid → id of the live claim that already covers it (nothing is provisioned for these)."""

    @property
    def total_price_per_hour(self) -> float:
        return sum(claim.price_per_hour for claim in self.claims)

    def gangs(self) -> dict[str, list[NodeClaim]]:
        """Gang → its new claims, which must be launched all together or not at all."""
        out: dict[str, list[NodeClaim]] = {}
        for claim in self.claims:
            if claim.gang:
                out.setdefault(claim.gang, []).append(claim)
        return out

    def to_json(self) -> dict[str, Any]:
        """The `plan` command's JSON contract (DESIGN.md): exactly these keys."""
        return {
            "claims": [
                {
                    "id": claim.id,
                    "pool": claim.pool,
                    "capacityType": claim.capacity_type,
                    "zones": list(claim.zones),
                    "instanceTypes": list(claim.instance_types),
                    "pricePerHour": round(claim.price_per_hour, 6),
                    "pods": list(claim.pods),
                }
                for claim in self.claims
            ],
            "unschedulable": [{"pod": u.pod, "reason": u.reason} for u in self.unschedulable],
            "totalPricePerHour": round(self.total_price_per_hour, 6),
        }

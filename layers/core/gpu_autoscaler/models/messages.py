"""Messages between our own functions, carried by SQS, and the payloads our schedules send.

These are contracts like the pending-pods document: add optional fields, rename nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DrainRequest", "LaunchRequest", "ScheduleTick"]


class _Message(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class LaunchRequest(_Message):
    """packer / interruption / prewarm → fleet (launch queue): launch these stored NodeClaims.

    The claims themselves live in the table; the message only names them, so a redelivered
    message acts on the claim's current state and never launches twice.
    """

    cluster: str
    claim_ids: list[str] = Field(alias="claimIds", min_length=1)
    gang: str | None = None
    """Set when the claims are one gang: one all-or-nothing request."""


class DrainRequest(_Message):
    """interruption / consolidate / reconcile → drain (drain queue); re-enqueued with a delay to continue."""

    cluster: str
    node_name: str = Field(alias="nodeName")
    instance_id: str | None = Field(default=None, alias="instanceId")
    claim_id: str | None = Field(default=None, alias="claimId")
    reason: str
    involuntary: bool = False
    """Spot interruption, scheduled change: evict do-not-disrupt pods too, delete what remains at the deadline."""
    force: bool = False
    deadline: datetime
    replacement_claim_id: str | None = Field(default=None, alias="replacementClaimId")
    """Drain only once this claim's node is Ready (or the deadline comes)."""
    attempt: int = 0
    replacement_claim_ids: list[str] = Field(default_factory=list, alias="replacementClaimIds")
    """Further replacements when the node's pods needed more than one (with `replacement_claim_id`, all of them)."""
    wait_until: datetime | None = Field(default=None, alias="waitUntil")
    """Wait for the replacements no later than this (default: the deadline); at or before now: do not wait.
    A Spot warning sets it to now (two minutes leave no time to wait), a rebalance to `rebalanceDrainAfter`."""
    backoff: int = Field(default=0, ge=0)
    """Consecutive passes refused (PodDisruptionBudget 429, do-not-disrupt pods held): the retry exponent."""
    started_at: datetime | None = Field(default=None, alias="startedAt")
    """When the first attempt ran: carried along so the drain's whole duration can be measured."""

    @property
    def replacements(self) -> list[str]:
        ids = [self.replacement_claim_id] if self.replacement_claim_id else []
        return ids + [i for i in self.replacement_claim_ids if i not in ids]


class ScheduleTick(_Message):
    """EventBridge Scheduler → prewarm / consolidate: one firing of a rate schedule or a scaling window."""

    trigger: Literal["rate", "window"] = "rate"
    window: str | None = None
    scheduled_time: datetime | None = Field(default=None, alias="scheduledTime")

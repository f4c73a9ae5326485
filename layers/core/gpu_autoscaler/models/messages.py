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


class ScheduleTick(_Message):
    """EventBridge Scheduler → prewarm / consolidate: one firing of a rate schedule or a scaling window."""

    trigger: Literal["rate", "window"] = "rate"
    window: str | None = None
    scheduled_time: datetime | None = Field(default=None, alias="scheduledTime")

"""Messages between our own functions, carried by SQS, and the payloads our schedules send.

These are contracts like the pending-pods document: add optional fields, rename nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpu_autoscaler.models.durations import Duration

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
    """interruption / consolidate / reconcile → drain (drain queue); re-enqueued with a delay to continue.

    Who may delete pods, bypassing PodDisruptionBudgets and `karpenter.sh/do-not-disrupt`: an involuntary drain
    (or a forced one) at `deadline`, when AWS takes the instance; a voluntary one (consolidation, rebalance,
    drift) only at `cordonedAt + terminationGracePeriod`, and never without one — it waits for the budgets, as
    Karpenter does. Every field after `deadline` is optional, so older messages still parse.
    """

    cluster: str
    node_name: str | None = Field(default=None, alias="nodeName")
    """The Node's name when the sender saw the Node; None when it was not listed yet. The drain finds its Node by
    the claim's instance (providerID) either way: on EKS a node is named by its private DNS name unless nodeadm's
    opt-in `InstanceIdNodeName` is set, so no name can be guessed from the instance."""
    instance_id: str | None = Field(default=None, alias="instanceId")
    claim_id: str | None = Field(default=None, alias="claimId")
    reason: str
    involuntary: bool = False
    """AWS takes the instance at `deadline` (Spot warning, reservation or capacity block end, scheduled change):
    what remains then is deleted; each pod is deleted early enough to get its own grace period before it."""
    force: bool = False
    """An operator's drain with an involuntary drain's deadline."""
    deadline: datetime
    """Involuntary: when the node goes. Voluntary: how long an unstarted drain may wait for its replacements."""
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
    termination_grace_period: Duration | None = Field(default=None, alias="terminationGracePeriod")
    """A voluntary drain's Karpenter `terminationGracePeriod` (the node pool's): how long after the node was
    cordoned its pods may still block it; past it they are deleted. None: wait for them however long it takes."""
    cordoned_at: datetime | None = Field(default=None, alias="cordonedAt")
    """When this drain cordoned the node (or first found it cordoned): the start of `terminationGracePeriod`."""
    eventual: bool = False
    """Karpenter's Eventual disruption class (drift): with a `terminationGracePeriod`, pods that block eviction
    (do-not-disrupt, PodDisruptionBudgets) do not refuse the drain before it starts, as they refuse a graceful one
    (consolidation): it cordons, holds them and deletes them in time for their grace before the period ends. The
    Node's own do-not-disrupt annotation still refuses it."""
    terminate_after: datetime | None = Field(default=None, alias="terminateAfter")
    """Never terminate the instance before this (a Spot warning's `instance-action-time`): AWS reclaims it then,
    and until then pods still finishing their grace period, or tolerating the drain, keep running."""

    @property
    def node(self) -> str:
        """The node as logs and outcomes name it: its name if known, else its instance, else its claim."""
        return self.node_name or self.instance_id or self.claim_id or "?"

    @property
    def replacements(self) -> list[str]:
        ids = [self.replacement_claim_id] if self.replacement_claim_id else []
        return ids + [i for i in self.replacement_claim_ids if i not in ids]


class ScheduleTick(_Message):
    """EventBridge Scheduler → prewarm / consolidate: one firing of a rate schedule or a scaling window."""

    trigger: Literal["rate", "window"] = "rate"
    window: str | None = None
    scheduled_time: datetime | None = Field(default=None, alias="scheduledTime")

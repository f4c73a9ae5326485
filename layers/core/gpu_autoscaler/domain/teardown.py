"""What the stack's deletion must end, and when it may go on: decided from EC2's list of the cluster's instances
and CloudFormation's word on the stack.

The instances are launched by the functions, outside CloudFormation, and run on what the stack holds: the
instance profile (IAM DeleteInstanceProfile: "Deleting a role or instance profile that is associated with a
running instance will break any applications running on the instance"), the launch templates, and an EFA pool's
cluster placement groups ("Before you can delete a placement group, it must contain no instances", EC2 User
Guide, delete-placement-group). So they are ended first and waited for until EC2 shows them `terminated`, as
Karpenter's EC2NodeClass finalizer waits for every NodeClaim before it deletes instance profiles and launch
templates (karpenter-provider-aws `pkg/controllers/nodeclass/controller.go`).

CloudFormation sends a custom resource Delete not only when the stack is deleted but also when an update removes
or replaces it, and when an update that added it rolls back ("When the template developer deletes the stack or
removes the custom resource from the stack", custom resource Delete request reference; a changed physical id is
a replacement). Only a stack that is going away ends the cluster's nodes: one being deleted, or a first deploy
rolling back (whatever it launched would be left with no profile).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpu_autoscaler.models.fleet import OwnedInstance

__all__ = ["LIVE_STATES", "STACK_GOING_AWAY", "left", "stack_going_away", "to_terminate"]

LIVE_STATES = frozenset({"pending", "running", "stopping", "stopped"})
"""EC2's instance states that TerminateInstances still has to end (EC2 User Guide, "Instance state changes");
`shutting-down` is ending already, `terminated` has ended."""

STACK_GOING_AWAY = frozenset({"DELETE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS"})
"""The stack statuses in which its resources are deleted for good: `cdk destroy` (DeleteStack), and the rollback
of a stack whose creation failed. UPDATE_ROLLBACK_IN_PROGRESS and UPDATE_COMPLETE_CLEANUP_IN_PROGRESS delete
resources of a stack that stays."""


def stack_going_away(status: str) -> bool:
    return status in STACK_GOING_AWAY


def to_terminate(instances: Sequence[OwnedInstance]) -> list[str]:
    """The instances TerminateInstances has to be asked to end."""
    return [i.instance_id for i in instances if i.state in LIVE_STATES]


def left(instances: Sequence[OwnedInstance]) -> list[str]:
    """The instances the deletion still waits for: every one EC2 does not show `terminated` yet."""
    return [i.instance_id for i in instances if i.state != "terminated"]

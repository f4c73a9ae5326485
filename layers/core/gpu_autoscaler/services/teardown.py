"""The stack's deletion hook: a CloudFormation custom resource (CDK's Provider framework: `on_event`, then
`is_complete` every query interval) that, when the stack is deleted, terminates every instance the functions
launched for this cluster and holds the deletion until EC2 shows none left (`domain.teardown` says why and when).

The instances are found as the garbage collector finds them (DescribeInstances by the exact tag
`gpu-autoscaler/cluster = <cluster>`, every page) and ended through the fleet's one termination path
(`adapters.aws.fleet.Ec2Compute.terminate`); this function's role may terminate only instances carrying that tag.
Each poll ends what it finds still live, so a launch that lands after the first pass (one in flight when its
function was deleted) is ended too. An instance EC2 refuses to terminate (termination protection) fails the
deletion with its id: nothing else will end it, and the stack could not delete what it runs on. A throttled
TerminateInstances is tried again at the next poll. Create and Update change nothing and keep one physical id,
since a new one would make CloudFormation replace the resource and send the old one a Delete.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.teardown import left, stack_going_away, to_terminate
from gpu_autoscaler.errors import GpuAutoscalerError, RequestThrottled
from gpu_autoscaler.models.labels import TAG_CLUSTER

if TYPE_CHECKING:
    from gpu_autoscaler.ports import Compute, OwnedInstances, StackStatus

__all__ = ["TeardownHook", "TeardownRefused", "aws_teardown_hook"]

logger = logging.getLogger(__name__)


class TeardownRefused(GpuAutoscalerError):
    """EC2 would not terminate an instance the stack's functions launched: the deletion stops, naming it."""


class TeardownHook:
    def __init__(self, cluster_name: str, *, inventory: OwnedInstances, compute: Compute,
                 stacks: StackStatus) -> None:
        self.cluster = cluster_name
        self.inventory = inventory
        self.compute = compute
        self.stacks = stacks

    @property
    def physical_id(self) -> str:
        return f"{self.cluster}-gpu-autoscaler-teardown"

    def on_event(self, event: dict[str, Any]) -> dict[str, Any]:
        if event["RequestType"] == "Delete":
            self._sweep(event["StackId"])
            return {"PhysicalResourceId": event["PhysicalResourceId"]}
        return {"PhysicalResourceId": event.get("PhysicalResourceId") or self.physical_id}

    def is_complete(self, event: dict[str, Any]) -> dict[str, Any]:
        if event["RequestType"] != "Delete":
            return {"IsComplete": True}
        return {"IsComplete": not self._sweep(event["StackId"])}

    def _sweep(self, stack_id: str) -> list[str]:
        """Terminate what is live; the ids the deletion still waits for."""
        status = self.stacks.status(stack_id)
        if not stack_going_away(status):
            logger.info("stack %s is %s, not going away: the cluster's instances stay", stack_id, status)
            return []
        instances = self.inventory.owned_instances()
        live = to_terminate(instances)
        if live:
            try:
                done = self.compute.terminate(live)
            except RequestThrottled as error:
                logger.warning("%s; tried again at the next poll", error)
                return left(instances)
            refused = [i for i in live if i not in done]
            if refused:
                raise TeardownRefused(
                    f"EC2 did not terminate {', '.join(refused)} (termination protection, or not tagged "
                    f"{TAG_CLUSTER}={self.cluster}?): the stack cannot delete the instance profile, launch "
                    "templates and placement groups they run on; terminate them, then delete the stack again")
            logger.warning("terminating %d instances of cluster %s before the stack's deletion goes on: %s",
                           len(done), self.cluster, ", ".join(done))
        waiting = left(instances)
        if waiting:
            logger.info("waiting for %d instances to terminate: %s", len(waiting), ", ".join(waiting))
        return waiting


def aws_teardown_hook(event: dict[str, Any]) -> TeardownHook:
    """For a custom resource event: the cluster is the resource's `ClusterName` property, the region the stack's
    (its id is an ARN, `arn:aws:cloudformation:<region>:<account>:stack/<name>/<uuid>`)."""
    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.adapters.aws.fleet import Ec2Compute
    from gpu_autoscaler.adapters.aws.stack_status import CloudFormationStackStatus

    cluster_name = event["ResourceProperties"]["ClusterName"]
    clients = AwsClients(event["StackId"].split(":")[3])
    ec2 = Ec2Compute(clients.client("ec2"), cluster_name)
    return TeardownHook(cluster_name, inventory=ec2, compute=ec2,
                        stacks=CloudFormationStackStatus(clients.client("cloudformation")))

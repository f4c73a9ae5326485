"""What the in-cluster agent may do in this account: send to the pending-pods queue, and nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import aws_iam as iam
from constructs import Construct

if TYPE_CHECKING:
    from aws_cdk import aws_sqs as sqs

__all__ = ["AgentAccess"]


class AgentAccess(Construct):
    """A managed policy to attach to the agent's IRSA / Pod Identity role, which the cluster owner creates."""

    def __init__(self, scope: Construct, construct_id: str, *, queue: sqs.IQueue, cluster_name: str) -> None:
        super().__init__(scope, construct_id)
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description=f"gpu-autoscaler agent of cluster {cluster_name}: send pending-pods documents",
            statements=[
                iam.PolicyStatement(
                    sid="SendPendingPods",
                    actions=["sqs:SendMessage", "sqs:GetQueueUrl"],
                    resources=[queue.queue_arn],
                )
            ],
        )

"""What the in-cluster agent may do in this account: send to the pending-pods queue, and nothing else.

The stack makes its identity too, for EKS Pod Identity: a role EKS Pod Identity assumes (trust
`pods.eks.amazonaws.com` for `sts:AssumeRole` and `sts:TagSession`: EKS User Guide, service-accounts.adoc,
"Create IAM role with trust policy required by EKS Pod Identity"), held by the session tags it passes to the
agent's service account of this cluster (pod-id-abac-tags: `eks-cluster-arn`, `kubernetes-namespace`,
`kubernetes-service-account`), and, unless `kubernetes.eksAccess` is off, the association of that service account
with the role (`AWS::EKS::PodIdentityAssociation`). The cluster needs the `eks-pod-identity-agent` add-on, as
Karpenter's getting-started installs it beside its own association (website/content/en/preview/getting-started/
getting-started-with-karpenter/scripts/step02-create-cluster.sh). With IRSA instead, the user attaches the
policy to a role of their own, trusted through the cluster's OIDC provider.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Stack
from aws_cdk import aws_eks as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from gpu_autoscaler.naming import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT

if TYPE_CHECKING:
    from aws_cdk import aws_sqs as sqs

__all__ = ["AgentAccess"]

POD_IDENTITY = "pods.eks.amazonaws.com"


class AgentAccess(Construct):
    """The agent's policy, its Pod Identity role carrying it, and (`associate`) the role's association with the
    agent's service account."""

    def __init__(self, scope: Construct, construct_id: str, *, queue: sqs.IQueue, cluster_name: str,
                 associate: bool) -> None:
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
        cluster_arn = Stack.of(self).format_arn(service="eks", resource="cluster", resource_name=cluster_name)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal(POD_IDENTITY).with_session_tags().with_conditions({
                "StringEquals": {
                    "aws:RequestTag/eks-cluster-arn": cluster_arn,
                    "aws:RequestTag/kubernetes-namespace": AGENT_NAMESPACE,
                    "aws:RequestTag/kubernetes-service-account": AGENT_SERVICE_ACCOUNT,
                }
            }),
            description=f"gpu-autoscaler agent of cluster {cluster_name} (EKS Pod Identity, "
            f"{AGENT_NAMESPACE}/{AGENT_SERVICE_ACCOUNT})",
            managed_policies=[self.policy],
        )
        self.association = eks.CfnPodIdentityAssociation(
            self,
            "PodIdentityAssociation",
            cluster_name=cluster_name,
            namespace=AGENT_NAMESPACE,
            service_account=AGENT_SERVICE_ACCOUNT,
            role_arn=self.role.role_arn,
        ) if associate else None

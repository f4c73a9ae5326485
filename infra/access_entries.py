"""The functions' way into the cluster: an EKS access entry for each function role that calls the Kubernetes API.

Each entry is of type STANDARD, in the Kubernetes group `FUNCTIONS_KUBERNETES_GROUP`, with no access policy: an
entry with groups is authorized by Kubernetes RBAC alone, here the ClusterRole of `agent/deploy/functions-rbac.yaml`
bound to that group (EKS User Guide, grant-k8s-access.adoc, "Grant IAM users access to Kubernetes with EKS access
entries"). No access policy fits: Edit, Admin and View grant nothing on nodes, PersistentVolumes or
VolumeAttachments, ClusterAdmin everything (access-policy-reference.adoc).

The stack makes them because only it can keep them right: EKS stores an entry with its role's unique id, so an
entry made by hand stops working when the role is deleted and made again, even under the same ARN (same page),
and the roles have generated names that change when the stack is deployed anew. Made here, an entry is replaced
with its role and deleted with the stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import aws_eks as eks
from constructs import Construct

from gpu_autoscaler.naming import FUNCTIONS_KUBERNETES_GROUP

if TYPE_CHECKING:
    from collections.abc import Mapping

    from aws_cdk import aws_iam as iam

__all__ = ["FunctionAccessEntries"]


class FunctionAccessEntries(Construct):
    """`roles`: function name → its role, for the functions that call the Kubernetes API."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_name: str,
                 roles: Mapping[str, iam.IRole]) -> None:
        super().__init__(scope, construct_id)
        self.entries = {
            name: eks.CfnAccessEntry(
                self,
                name.title(),
                cluster_name=cluster_name,
                principal_arn=role.role_arn,
                type="STANDARD",
                kubernetes_groups=[FUNCTIONS_KUBERNETES_GROUP],
            )
            for name, role in roles.items()
        }

"""The stack grants the functions their way into the cluster, so a first deploy needs no manual step.

An EKS access entry of type STANDARD with Kubernetes groups and no access policy is authorized by RBAC alone
(EKS User Guide, grant-k8s-access.adoc, "Grant IAM users access to Kubernetes with EKS access entries"); the
group is the one `agent/deploy/functions-rbac.yaml` binds. An entry is tied to its role's unique id, not its
ARN (same page: a principal deleted and made again "won't work" with the old entry), so it is made with the role.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.naming import FUNCTIONS, FUNCTIONS_KUBERNETES_GROUP
from tests.infrastructure.conftest import KUBERNETES_CLIENTS, infrastructure_config_data, synthesize

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized


@pytest.fixture(scope="module")
def without_eks_access(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """A cluster still on the aws-auth ConfigMap (authentication mode CONFIG_MAP), or a self-managed one."""
    data = infrastructure_config_data()
    data["kubernetes"]["eksAccess"] = False
    return synthesize(data, tmp_path_factory.mktemp("cdk.out.no-eks-access"))


def _entries_by_function(synthesized: Synthesized) -> dict[str, dict[str, Any]]:
    roles = {synthesized.logical_id(synthesized.stack.functions.roles[name]): name for name in FUNCTIONS}
    out: dict[str, dict[str, Any]] = {}
    for entry in synthesized.of_type("AWS::EKS::AccessEntry").values():
        principal = entry["Properties"]["PrincipalArn"]
        assert principal == {"Fn::GetAtt": [principal["Fn::GetAtt"][0], "Arn"]}, principal
        out[roles[principal["Fn::GetAtt"][0]]] = entry["Properties"]
    return out


def test_each_function_that_calls_kubernetes_gets_an_access_entry_in_the_functions_group(
        synthesized: Synthesized) -> None:
    entries = _entries_by_function(synthesized)
    assert sorted(entries) == sorted(KUBERNETES_CLIENTS)
    assert len(synthesized.of_type("AWS::EKS::AccessEntry")) == len(KUBERNETES_CLIENTS)
    for properties in entries.values():
        assert properties["ClusterName"] == synthesized.config.cluster_name
        assert properties["Type"] == "STANDARD"
        assert properties["KubernetesGroups"] == [FUNCTIONS_KUBERNETES_GROUP]
        assert "AccessPolicies" not in properties  # Edit, Admin and View grant nothing on nodes; RBAC does
        assert "Username" not in properties  # EKS's own: the assumed role's STS ARN with its session name


def test_a_cluster_without_access_entries_gets_none_and_the_roles_to_map(without_eks_access: Synthesized) -> None:
    """`kubernetes.eksAccess: false`: CloudFormation would fail creating an entry on a CONFIG_MAP cluster, so
    the stack makes none, and still outputs each role for the user's aws-auth mapping."""
    assert without_eks_access.of_type("AWS::EKS::AccessEntry") == {}
    assert [n for n in FUNCTIONS if f"{n.title()}RoleArn" in without_eks_access.outputs] == KUBERNETES_CLIENTS

"""The stack grants the functions their way into the cluster, so a first deploy needs no manual step.

An EKS access entry of type STANDARD with Kubernetes groups and no access policy is authorized by RBAC alone
(EKS User Guide, grant-k8s-access.adoc, "Grant IAM users access to Kubernetes with EKS access entries"); the
group is the one `agent/deploy/functions-rbac.yaml` binds. An entry is tied to its role's unique id, not its
ARN (same page: a principal deleted and made again "won't work" with the old entry), so it is made with the role.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from gpu_autoscaler.naming import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, FUNCTIONS, FUNCTIONS_KUBERNETES_GROUP
from tests.conftest import ROOT
from tests.infrastructure.conftest import KUBERNETES_CLIENTS, infrastructure_config_data, synthesize
from tests.infrastructure.test_permissions import ACCOUNT, flat

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized

DEPLOY = ROOT / "agent" / "deploy"


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


def _agent_roles(synthesized: Synthesized) -> dict[str, dict[str, Any]]:
    """The roles EKS Pod Identity may assume: trusted by pods.eks.amazonaws.com."""
    return {key: role["Properties"] for key, role in synthesized.of_type("AWS::IAM::Role").items()
            if any((s.get("Principal") or {}).get("Service") == "pods.eks.amazonaws.com"
                   for s in role["Properties"]["AssumeRolePolicyDocument"]["Statement"])}


def test_the_agent_has_a_role_that_eks_pod_identity_assumes_for_its_service_account_only(
        synthesized: Synthesized) -> None:
    """EKS User Guide, pod-id-role (service-accounts.adoc, "Create IAM role with trust policy required by EKS Pod
    Identity"): trust pods.eks.amazonaws.com for sts:AssumeRole and sts:TagSession (it passes session tags), and
    hold the role to one service account with the tags it passes (eks-cluster-arn, kubernetes-namespace,
    kubernetes-service-account: pod-id-abac-tags)."""
    [(logical_id, role)] = _agent_roles(synthesized).items()
    [statement] = role["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Effect"] == "Allow" and sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    conditions = statement["Condition"]["StringEquals"]
    assert conditions["aws:RequestTag/kubernetes-namespace"] == AGENT_NAMESPACE
    assert conditions["aws:RequestTag/kubernetes-service-account"] == AGENT_SERVICE_ACCOUNT
    assert flat(conditions["aws:RequestTag/eks-cluster-arn"]) == \
        f"arn:aws:eks:us-east-1:{ACCOUNT}:cluster/{synthesized.config.cluster_name}"
    policy = synthesized.logical_id(synthesized.stack.agent.policy)
    assert role["ManagedPolicyArns"] == [{"Ref": policy}] and "Policies" not in role
    assert synthesized.outputs["AgentRoleArn"]["Value"] == {"Fn::GetAtt": [logical_id, "Arn"]}


def test_the_agent_s_service_account_is_associated_with_its_role(synthesized: Synthesized) -> None:
    [association] = synthesized.of_type("AWS::EKS::PodIdentityAssociation").values()
    [role] = _agent_roles(synthesized)
    properties = {k: v for k, v in association["Properties"].items() if k != "Tags"}
    assert properties == {"ClusterName": synthesized.config.cluster_name, "Namespace": AGENT_NAMESPACE,
                          "ServiceAccount": AGENT_SERVICE_ACCOUNT, "RoleArn": {"Fn::GetAtt": [role, "Arn"]}}


def test_the_association_names_the_service_account_both_installs_make() -> None:
    """kustomize (agent/deploy) makes the service account in its namespace; the chart makes it in the release's
    namespace, which the README's `helm install` sets."""
    account = yaml.safe_load((DEPLOY / "serviceaccount.yaml").read_text())
    namespace = yaml.safe_load((DEPLOY / "namespace.yaml").read_text())
    assert (account["metadata"]["namespace"], account["metadata"]["name"]) == (AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT)
    assert namespace["metadata"]["name"] == AGENT_NAMESPACE
    values = yaml.safe_load((DEPLOY / "chart" / "values.yaml").read_text())
    assert values["serviceAccount"]["name"] == AGENT_SERVICE_ACCOUNT
    readme = (ROOT / "README.md").read_text()
    install = readme[readme.index("helm install gpu-autoscaler-agent"):]
    assert install.split("\n")[0].split("--namespace ")[1].split()[0] == AGENT_NAMESPACE


def test_every_stack_output_the_agent_s_manifests_name_exists(synthesized: Synthesized) -> None:
    """agent/deploy/serviceaccount.yaml tells the user to pass `<AgentRoleArn output of the stack>`."""
    files = [*(p for p in DEPLOY.rglob("*") if p.is_file()), ROOT / "agent" / "README.md"]
    named = {name for path in files for name in re.findall(r"\b((?:[A-Z][a-z]+)+(?:Arn|Url))\b", path.read_text())}
    assert "AgentRoleArn" in named
    assert named <= set(synthesized.outputs), f"named, not output: {named - set(synthesized.outputs)}"


def test_without_eks_access_the_agent_s_role_is_output_to_associate_by_hand(without_eks_access: Synthesized) -> None:
    assert without_eks_access.of_type("AWS::EKS::PodIdentityAssociation") == {}
    assert "AgentRoleArn" in without_eks_access.outputs

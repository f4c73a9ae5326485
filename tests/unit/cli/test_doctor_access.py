"""`gpu-autoscaler doctor` on what decides whether the functions and the nodes get into the cluster.

EKS User Guide (awsdocs/amazon-eks-user-guide, latest/ug/manage-access/k8s-access/grant-k8s-access.adoc, "Create
access entries"): an access entry of type STANDARD without `--kubernetes-groups` and without an access policy has
only the permissions of Kubernetes' API discovery roles; access-policy-reference.adoc: Edit, Admin and View grant
nothing on nodes, PersistentVolumes or VolumeAttachments.

The EKS and CloudFormation clients are real botocore clients behind a `Stubber`, so each request and answer is
checked against the services' own API models.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
import yaml
from botocore.stub import Stubber

from gpu_autoscaler.cli.doctor_access import (
    FUNCTIONS_RBAC,
    check_access_entries,
    check_cluster_access,
    check_function_access,
    check_node_identity,
)
from gpu_autoscaler.cli.doctor_checks import CHECKS
from gpu_autoscaler.cli.doctor_context import DoctorContext
from gpu_autoscaler.config import parse_config
from gpu_autoscaler.naming import FUNCTIONS_KUBERNETES_GROUP
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[3]
CONFIG = parse_config(example_config_data())
PACKER = "arn:aws:iam::123456789012:role/GpuAutoscaler-ml-prod-PackerRole-1A2B3C"
DRAIN = "arn:aws:iam::123456789012:role/GpuAutoscaler-ml-prod-DrainRole-4D5E6F"
POLICY = "arn:aws:eks::aws:cluster-access-policy/"
CLUSTER_SCOPE = {"type": "cluster"}


class _Account:
    """Stubbed clients: CloudFormation answers the deployed stack's role outputs; EKS its access entries."""

    def __init__(self, *outputs: tuple[str, str]) -> None:
        self.clients = {name: boto3.client(name, region_name="us-east-1") for name in ("cloudformation", "eks")}
        self.stubs = {name: Stubber(client) for name, client in self.clients.items()}
        self.stubs["cloudformation"].add_response("describe_stacks", {"Stacks": [{
            "StackName": "GpuAutoscaler-ml-prod", "CreationTime": "2026-11-29T00:00:00Z",
            "StackStatus": "CREATE_COMPLETE",
            "Outputs": [{"OutputKey": "DrainRoleArn", "OutputValue": DRAIN},
                        {"OutputKey": "PackerRoleArn", "OutputValue": PACKER},
                        {"OutputKey": "TableName", "OutputValue": "t"},
                        *({"OutputKey": key, "OutputValue": value} for key, value in outputs)]}]},
            {"StackName": "GpuAutoscaler-ml-prod"})

    def client(self, service: str) -> Any:
        return self.clients[service]

    def listed(self, *arns: str) -> _Account:
        self.stubs["eks"].add_response("list_access_entries", {"accessEntries": list(arns)},
                                       {"clusterName": CONFIG.cluster_name})
        return self

    def entry(self, arn: str, *, groups: tuple[str, ...] = (), policies: tuple[tuple[str, dict[str, Any]], ...] = (),
              entry_type: str = "STANDARD") -> _Account:
        eks = self.stubs["eks"]
        eks.add_response("describe_access_entry", {"accessEntry": {
            "clusterName": CONFIG.cluster_name, "principalArn": arn, "kubernetesGroups": list(groups),
            "type": entry_type, "username": "arn:aws:sts::123456789012:assumed-role/x/{{SessionName}}"}},
            {"clusterName": CONFIG.cluster_name, "principalArn": arn})
        if entry_type == "STANDARD":
            eks.add_response("list_associated_access_policies", {
                "clusterName": CONFIG.cluster_name, "principalArn": arn,
                "associatedAccessPolicies": [{"policyArn": POLICY + name, "accessScope": scope}
                                             for name, scope in policies]},
                {"clusterName": CONFIG.cluster_name, "principalArn": arn})
        return self

    def refused(self, operation: str, **params: str) -> _Account:
        self.stubs["eks"].add_client_error(operation, "AccessDeniedException", "not authorized", 403,
                                           expected_params=params)
        return self


@pytest.fixture
def account() -> Iterator[_Account]:
    account = _Account()
    for stub in account.stubs.values():
        stub.activate()
    yield account
    for stub in account.stubs.values():
        stub.assert_no_pending_responses()


def _checks(account: _Account, *, eks_access: bool = True) -> dict[str, Any]:
    config = CONFIG.model_copy(update={"kubernetes": CONFIG.kubernetes.model_copy(update={"eks_access": eks_access})})
    return {c.name: c for c in check_function_access(DoctorContext(config, account, None))}  # type: ignore[arg-type]


def test_the_rbac_file_doctor_names_binds_the_functions_group() -> None:
    documents = list(yaml.safe_load_all((ROOT / FUNCTIONS_RBAC).read_text()))
    [binding] = [d for d in documents if d and d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "Group", "name": FUNCTIONS_KUBERNETES_GROUP,
                                    "apiGroup": "rbac.authorization.k8s.io"}]


def test_the_agents_role_output_is_no_function_role() -> None:
    """The stack outputs `AgentRoleArn` too (its EKS Pod Identity role, which needs no access entry): only the
    outputs of functions are checked for one."""
    account = _Account(("AgentRoleArn", "arn:aws:iam::123456789012:role/GpuAutoscaler-ml-prod-AgentRole-7G8H9I"))
    for stub in account.stubs.values():
        stub.activate()
    account.listed(DRAIN, PACKER).entry(DRAIN, groups=(FUNCTIONS_KUBERNETES_GROUP,)).entry(
        PACKER, groups=(FUNCTIONS_KUBERNETES_GROUP,))
    [check] = _checks(account).values()
    assert (check.name, check.status, check.detail) == ("EKS access entries (functions)", "pass", "Drain, Packer")


def test_an_access_entry_with_neither_group_nor_policy_fails_it_allows_api_discovery_only(account: _Account) -> None:
    account.listed(DRAIN, PACKER).entry(DRAIN, groups=(FUNCTIONS_KUBERNETES_GROUP,)).entry(PACKER)
    [packer] = _checks(account).values()
    assert packer.name == "EKS access entry Packer" and packer.status == "fail"
    assert PACKER in packer.detail and "API discovery" in packer.detail
    assert (f"aws eks update-access-entry --cluster-name ml-prod --principal-arn {PACKER} "
            f"--kubernetes-groups {FUNCTIONS_KUBERNETES_GROUP}") in packer.fix
    assert f"kubectl apply -f {FUNCTIONS_RBAC}" in packer.fix


def test_a_missing_entry_the_stack_makes_fails_with_cdk_deploy(account: _Account) -> None:
    """kubernetes.eksAccess on: the stack makes each entry with its role; one made by hand would stop the next
    deploy (CloudFormation cannot create an entry that exists)."""
    account.listed(DRAIN).entry(DRAIN, groups=(FUNCTIONS_KUBERNETES_GROUP,))
    [packer] = _checks(account).values()
    assert packer.name == "EKS access entry Packer" and packer.status == "fail"
    assert "cdk deploy" in packer.fix and "kubernetes.eksAccess" in packer.fix
    assert f"kubectl apply -f {FUNCTIONS_RBAC}" in packer.fix


def test_a_missing_entry_made_by_hand_fails_with_the_command_that_creates_one_in_the_group(account: _Account) -> None:
    account.listed(DRAIN)
    account.stubs["eks"].add_response("describe_cluster", _cluster("API"), {"name": CONFIG.cluster_name})
    account.entry(DRAIN, groups=(FUNCTIONS_KUBERNETES_GROUP,))
    [packer] = _checks(account, eks_access=False).values()
    assert packer.name == "EKS access entry Packer" and packer.status == "fail"
    assert (f"aws eks create-access-entry --cluster-name ml-prod --principal-arn {PACKER} --type STANDARD "
            f"--kubernetes-groups {FUNCTIONS_KUBERNETES_GROUP}") in packer.fix
    assert f"kubectl apply -f {FUNCTIONS_RBAC}" in packer.fix


@pytest.mark.parametrize(("mode", "status"), [("API_AND_CONFIG_MAP", "warn"), ("API", "fail")])
def test_without_the_stacks_entries_a_missing_one_fails_only_where_aws_auth_is_not_read(
        account: _Account, mode: str, status: str) -> None:
    """kubernetes.eksAccess false: the user maps the roles in aws-auth, which doctor cannot read; only an API-only
    cluster reads no aws-auth (grant-k8s-access.adoc, "Set Cluster Authentication Mode")."""
    account.listed(DRAIN)
    account.stubs["eks"].add_response("describe_cluster", _cluster(mode), {"name": CONFIG.cluster_name})
    account.entry(DRAIN, groups=(FUNCTIONS_KUBERNETES_GROUP,))
    [packer] = _checks(account, eks_access=False).values()
    assert packer.name == "EKS access entry Packer" and packer.status == status, packer
    assert mode in packer.detail
    if status == "warn":
        assert "aws-auth" in packer.detail and FUNCTIONS_KUBERNETES_GROUP in packer.fix


@pytest.mark.parametrize("policies", [("AmazonEKSEditPolicy",), ("AmazonEKSAdminPolicy", "AmazonEKSViewPolicy")])
def test_edit_admin_or_view_policies_alone_warn_they_grant_nothing_on_nodes(account: _Account,
                                                                            policies: tuple[str, ...]) -> None:
    account.listed(DRAIN, PACKER).entry(DRAIN, groups=(FUNCTIONS_KUBERNETES_GROUP,)).entry(
        PACKER, policies=tuple((p, CLUSTER_SCOPE) for p in policies))
    [packer] = _checks(account).values()
    assert packer.status == "warn"
    assert all(p in packer.detail for p in policies) and "nothing on nodes" in packer.detail
    assert f"--kubernetes-groups {FUNCTIONS_KUBERNETES_GROUP}" in packer.fix and FUNCTIONS_RBAC in packer.fix


def test_another_group_warns_that_its_rbac_cannot_be_seen_and_keeps_it_in_the_fix(account: _Account) -> None:
    account.listed(DRAIN, PACKER).entry(DRAIN, groups=(FUNCTIONS_KUBERNETES_GROUP,)).entry(PACKER, groups=("ops",))
    [packer] = _checks(account).values()
    assert packer.status == "warn" and "ops" in packer.detail
    # UpdateAccessEntry replaces the groups: the fix keeps the entry's own
    assert f"--kubernetes-groups ops {FUNCTIONS_KUBERNETES_GROUP}" in packer.fix


def test_the_group_or_cluster_wide_cluster_admin_passes(account: _Account) -> None:
    account.listed(DRAIN, PACKER).entry(DRAIN, groups=(FUNCTIONS_KUBERNETES_GROUP, "ops")).entry(
        PACKER, policies=(("AmazonEKSClusterAdminPolicy", CLUSTER_SCOPE),))
    [ok] = _checks(account).values()
    assert ok.name == "EKS access entries (functions)" and ok.status == "pass" and ok.detail == "Drain, Packer"


def test_cluster_admin_scoped_to_namespaces_warns_nodes_are_cluster_scoped(account: _Account) -> None:
    account.listed(DRAIN, PACKER).entry(DRAIN, groups=(FUNCTIONS_KUBERNETES_GROUP,)).entry(
        PACKER, policies=(("AmazonEKSClusterAdminPolicy", {"type": "namespace", "namespaces": ["team-a"]}),))
    [packer] = _checks(account).values()
    assert packer.status == "warn" and "team-a" in packer.detail


def test_an_entry_of_another_type_fails_its_type_cannot_change(account: _Account) -> None:
    account.listed(DRAIN, PACKER).entry(DRAIN, groups=(FUNCTIONS_KUBERNETES_GROUP,)).entry(
        PACKER, entry_type="EC2_LINUX")
    [packer] = _checks(account).values()
    assert packer.status == "fail" and "EC2_LINUX" in packer.detail
    assert "delete-access-entry" in packer.fix and "--type STANDARD" in packer.fix


def test_an_entry_that_cannot_be_described_warns_naming_the_permissions(account: _Account) -> None:
    account.listed(DRAIN, PACKER).refused("describe_access_entry", clusterName="ml-prod", principalArn=DRAIN).entry(
        PACKER, groups=(FUNCTIONS_KUBERNETES_GROUP,))
    [drain] = _checks(account).values()
    assert drain.name == "EKS access entry Drain" and drain.status == "warn"
    assert "AccessDeniedException" in drain.detail
    assert "eks:DescribeAccessEntry" in drain.fix and "eks:ListAssociatedAccessPolicies" in drain.fix


# ---- the node role -------------------------------------------------------------------------------------------

NODE_ROLE = CONFIG.node_role
NODE_ROLE_NAME = NODE_ROLE.rsplit("/", 1)[1]
MANAGED = "arn:aws:iam::aws:policy/"


def _cluster(mode: str | None = "API", *, public: bool = True, cidrs: tuple[str, ...] = ("0.0.0.0/0",)
             ) -> dict[str, Any]:
    """DescribeCluster's answer, in the shape of the EKS API reference (`Cluster`)."""
    cluster: dict[str, Any] = {
        "name": CONFIG.cluster_name, "arn": "arn:aws:eks:us-east-1:123456789012:cluster/ml-prod",
        "endpoint": "https://EXAMPLE.gr7.us-east-1.eks.amazonaws.com", "status": "ACTIVE",
        "resourcesVpcConfig": {"subnetIds": ["subnet-0aaa"], "endpointPublicAccess": public,
                               "endpointPrivateAccess": not public, "publicAccessCidrs": list(cidrs)}}
    if mode is not None:
        cluster["accessConfig"] = {"authenticationMode": mode}
    return {"cluster": cluster}


class _Cluster:
    """Stubbed EKS and IAM of an account holding the cluster and the node role."""

    def __init__(self, *outputs: tuple[str, str]) -> None:
        self.clients = {name: boto3.client(name, region_name="us-east-1") for name in ("eks", "iam")}
        self.stubs = {name: Stubber(client) for name, client in self.clients.items()}

    def client(self, service: str) -> Any:
        return self.clients[service]

    def described(self, mode: str | None = "API", **vpc: Any) -> _Cluster:
        self.stubs["eks"].add_response("describe_cluster", _cluster(mode, **vpc), {"name": CONFIG.cluster_name})
        return self

    def node_entry(self, entry_type: str | None) -> _Cluster:
        """The cluster's access entries: the node role's of that type, or none (None)."""
        eks = self.stubs["eks"]
        eks.add_response("list_access_entries", {"accessEntries": [PACKER] + ([NODE_ROLE] if entry_type else [])},
                         {"clusterName": CONFIG.cluster_name})
        if entry_type:
            eks.add_response("describe_access_entry", {"accessEntry": {
                "clusterName": CONFIG.cluster_name, "principalArn": NODE_ROLE, "type": entry_type,
                "kubernetesGroups": [] if entry_type == "STANDARD" else ["system:nodes"]}},
                {"clusterName": CONFIG.cluster_name, "principalArn": NODE_ROLE})
        return self

    def role(self, *attached: str, inline: tuple[str, ...] = ()) -> _Cluster:
        iam = self.stubs["iam"]
        iam.add_response("get_role", {"Role": {
            "Path": "/", "RoleName": NODE_ROLE_NAME, "RoleId": "AROAEXAMPLEEXAMPLE01", "Arn": NODE_ROLE,
            "CreateDate": "2026-11-01T00:00:00Z", "AssumeRolePolicyDocument": (
                '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},'
                '"Action":"sts:AssumeRole"}]}')}}, {"RoleName": NODE_ROLE_NAME})
        iam.add_response("list_attached_role_policies", {"AttachedPolicies": [
            {"PolicyName": name, "PolicyArn": MANAGED + name} for name in attached]}, {"RoleName": NODE_ROLE_NAME})
        if len(attached) < 3:
            iam.add_response("list_role_policies", {"PolicyNames": list(inline)}, {"RoleName": NODE_ROLE_NAME})
        return self


@pytest.fixture
def cluster() -> Iterator[_Cluster]:
    cluster = _Cluster()
    for stub in cluster.stubs.values():
        stub.activate()
    yield cluster
    for stub in cluster.stubs.values():
        stub.assert_no_pending_responses()


def _node_entry(cluster: _Cluster) -> Any:
    [check] = check_access_entries(DoctorContext(CONFIG, cluster, None))  # type: ignore[arg-type]
    assert check.name == "EKS access entry (node role)"
    return check


def test_a_node_role_entry_of_type_standard_fails_nodes_would_never_register(cluster: _Cluster) -> None:
    """grant-k8s-access.adoc: self-managed Linux and Bottlerocket nodes take an EC2_LINUX entry, which makes them
    system:node:{{EC2PrivateDNSName}} in system:nodes; a STANDARD one cannot, and a type cannot change."""
    check = _node_entry(cluster.described("API").node_entry("STANDARD"))
    assert check.status == "fail" and "STANDARD" in check.detail and "register" in check.detail
    assert f"aws eks delete-access-entry --cluster-name ml-prod --principal-arn {NODE_ROLE}" in check.fix
    assert f"aws eks create-access-entry --cluster-name ml-prod --principal-arn {NODE_ROLE} --type EC2_LINUX" \
        in check.fix


def test_a_node_role_entry_of_type_ec2_linux_passes(cluster: _Cluster) -> None:
    check = _node_entry(cluster.described("API_AND_CONFIG_MAP").node_entry("EC2_LINUX"))
    assert check.status == "pass" and "EC2_LINUX" in check.detail


def test_no_node_role_entry_fails_on_an_api_only_cluster(cluster: _Cluster) -> None:
    check = _node_entry(cluster.described("API").node_entry(None))
    assert check.status == "fail" and "--type EC2_LINUX" in check.fix


def test_no_node_role_entry_on_an_api_and_config_map_cluster_is_no_failure_aws_auth_may_map_it(
        cluster: _Cluster) -> None:
    check = _node_entry(cluster.described("API_AND_CONFIG_MAP").node_entry(None))
    assert check.status == "warn" and "aws-auth" in check.detail and "API_AND_CONFIG_MAP" in check.detail
    assert "--type EC2_LINUX" in check.fix


def test_a_config_map_only_cluster_is_read_through_aws_auth_alone(cluster: _Cluster) -> None:
    check = _node_entry(cluster.described("CONFIG_MAP"))  # no ListAccessEntries: the cluster has no such API
    assert check.status == "warn" and "CONFIG_MAP" in check.detail
    assert "system:bootstrappers" in check.fix and "system:nodes" in check.fix and NODE_ROLE in check.fix


def _node_policies(cluster: _Cluster) -> Any:
    checks = {c.name: c for c in check_node_identity(DoctorContext(CONFIG, cluster, None))}  # type: ignore[arg-type]
    assert checks["node role"].status == "pass"
    return checks["node role policies"]


def test_a_node_role_without_the_worker_node_registry_and_cni_policies_warns_with_the_commands(
        cluster: _Cluster) -> None:
    """create-node-role.adoc: AmazonEKSWorkerNodePolicy and an ECR pull policy "before you can launch nodes and
    register them", and AmazonEKS_CNI_Policy unless aws-node has its own role; a warning, since an inline policy
    may grant the same."""
    check = _node_policies(cluster.role(inline=("nodes",)))
    assert check.status == "warn"
    for name in ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryPullOnly", "AmazonEKS_CNI_Policy"):
        assert name in check.detail
        assert f"--policy-arn {MANAGED}{name}" in check.fix
    assert "IRSA" in check.detail and "Pod Identity" in check.detail
    assert "inline" in check.detail and "nodes" in check.detail


def test_a_node_role_with_only_the_cni_policy_missing_warns_unless_aws_node_has_its_own_role(
        cluster: _Cluster) -> None:
    check = _node_policies(cluster.role("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly"))
    assert check.status == "warn" and "AmazonEKS_CNI_Policy" in check.detail and "aws-node" in check.detail
    assert "AmazonEKSWorkerNodePolicy" not in check.fix and "Registry" not in check.fix


def test_a_node_role_with_the_policies_karpenter_attaches_passes(cluster: _Cluster) -> None:
    check = _node_policies(cluster.role("AmazonEKS_CNI_Policy", "AmazonEKSWorkerNodePolicy",
                                        "AmazonEC2ContainerRegistryPullOnly"))
    assert check.status == "pass"


# ---- the API endpoint and the authentication mode ------------------------------------------------------------

def _cluster_access(cluster: _Cluster, *, eks_access: bool = True) -> dict[str, Any]:
    config = CONFIG.model_copy(update={"kubernetes": CONFIG.kubernetes.model_copy(update={"eks_access": eks_access})})
    return {c.name: c for c in check_cluster_access(DoctorContext(config, cluster, None))}  # type: ignore[arg-type]


def test_a_private_only_endpoint_fails_the_functions_run_outside_any_vpc(cluster: _Cluster) -> None:
    """cluster-endpoint.adoc: with public access off, "All traffic to your cluster API server must come from within
    your cluster's VPC or a connected network"; the functions are in no VPC."""
    check = _cluster_access(cluster.described("API", public=False, cidrs=()))["cluster endpoint"]
    assert check.status == "fail" and "private" in check.detail and "VPC" in check.detail
    assert "aws eks update-cluster-config --name ml-prod --resources-vpc-config endpointPublicAccess=true" in check.fix


def test_public_access_limited_to_some_cidrs_warns_lambdas_addresses_are_not_among_them(cluster: _Cluster) -> None:
    check = _cluster_access(cluster.described("API", cidrs=("203.0.113.0/24",)))["cluster endpoint"]
    assert check.status == "warn" and "203.0.113.0/24" in check.detail and "Lambda" in check.detail
    assert "publicAccessCidrs=0.0.0.0/0" in check.fix


def test_a_public_endpoint_open_to_all_passes(cluster: _Cluster) -> None:
    checks = _cluster_access(cluster.described("API_AND_CONFIG_MAP"))
    assert checks["cluster endpoint"].status == "pass" and "0.0.0.0/0" in checks["cluster endpoint"].detail
    assert checks["cluster authentication mode"].status == "pass"


def test_a_config_map_only_cluster_fails_when_the_stack_is_to_create_access_entries(cluster: _Cluster) -> None:
    """grant-k8s-access.adoc: access entries need API or API_AND_CONFIG_MAP, and the mode changes with
    update-cluster-config (and cannot go back)."""
    check = _cluster_access(cluster.described("CONFIG_MAP"))["cluster authentication mode"]
    assert check.status == "fail" and "CONFIG_MAP" in check.detail and "kubernetes.eksAccess" in check.detail
    assert ("aws eks update-cluster-config --name ml-prod --access-config authenticationMode=API_AND_CONFIG_MAP"
            in check.fix)
    assert "eksAccess" in check.fix and "aws-auth" in check.fix


def test_a_config_map_only_cluster_passes_when_the_roles_are_mapped_in_aws_auth(cluster: _Cluster) -> None:
    check = _cluster_access(cluster.described("CONFIG_MAP"), eks_access=False)["cluster authentication mode"]
    assert check.status == "pass" and "aws-auth" in check.detail


def test_an_api_only_cluster_without_the_stacks_access_entries_warns_it_reads_no_aws_auth(cluster: _Cluster) -> None:
    check = _cluster_access(cluster.described("API"), eks_access=False)["cluster authentication mode"]
    assert check.status == "warn" and "aws-auth" in check.detail and "create-access-entry" in check.fix


def test_a_cluster_that_cannot_be_described_warns_naming_the_permission(cluster: _Cluster) -> None:
    cluster.stubs["eks"].add_client_error("describe_cluster", "AccessDeniedException", "not authorized", 403)
    [check] = _cluster_access(cluster).values()
    assert check.status == "warn" and "AccessDeniedException" in check.detail and "eks:DescribeCluster" in check.fix


def test_run_checks_reports_the_endpoint() -> None:
    assert check_cluster_access in CHECKS


def test_a_cluster_that_does_not_exist_fails_naming_the_configuration(cluster: _Cluster) -> None:
    cluster.stubs["eks"].add_client_error("describe_cluster", "ResourceNotFoundException",
                                          "No cluster found for name: ml-prod.", 404)
    [check] = _cluster_access(cluster).values()
    assert check.status == "fail" and "ml-prod" in check.detail and "us-east-1" in check.detail
    assert "clusterName" in check.fix and "region" in check.fix

"""`gpu-autoscaler doctor` on a cluster whose API endpoint is private only, with and without `network.functions`.

EKS User Guide (cluster-endpoint.adoc): with public access off, "All traffic to your cluster API server must come
from within your cluster's VPC or a connected network"; the endpoint's network interfaces carry the cluster security
group (DescribeCluster `resourcesVpcConfig.clusterSecurityGroupId`) and any additional ones (`securityGroupIds`),
which must admit the functions on 443 (sec-group-reqs.adoc). The clients are real botocore clients behind a
`Stubber`, so each request and answer is checked against the services' API models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.stub import Stubber

from gpu_autoscaler.cli.doctor_access import check_cluster_access
from gpu_autoscaler.cli.doctor_context import DoctorContext
from gpu_autoscaler.config import parse_config
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

CLUSTER_VPC = "vpc-0123456789abcdef0"
CLUSTER_SG = "sg-0c1a2b3c4d5e6f708"
FUNCTIONS_SG = "sg-0f1e2d3c4b5a69788"
PLACED = {"vpcId": CLUSTER_VPC, "subnets": ["subnet-0aaa"], "securityGroups": [FUNCTIONS_SG]}


def _config(placed: dict[str, Any] | None) -> Any:
    data = example_config_data()
    if placed is not None:
        data["network"]["functions"] = placed
    return parse_config(data)


class _Account:
    def __init__(self) -> None:
        self.clients = {name: boto3.client(name, region_name="us-east-1") for name in ("eks", "ec2")}
        self.stubs = {name: Stubber(client) for name, client in self.clients.items()}

    def client(self, service: str) -> Any:
        return self.clients[service]

    def described(self, *, public: bool, private: bool = True) -> _Account:
        self.stubs["eks"].add_response("describe_cluster", {"cluster": {
            "name": "ml-prod", "endpoint": "https://EXAMPLE.gr7.us-east-1.eks.amazonaws.com", "status": "ACTIVE",
            "accessConfig": {"authenticationMode": "API"},
            "resourcesVpcConfig": {"vpcId": CLUSTER_VPC, "subnetIds": ["subnet-0aaa"], "securityGroupIds": [],
                                   "clusterSecurityGroupId": CLUSTER_SG, "endpointPublicAccess": public,
                                   "endpointPrivateAccess": private,
                                   "publicAccessCidrs": ["0.0.0.0/0"] if public else []}}},
            {"name": "ml-prod"})
        return self

    def cluster_group_admits(self, *permissions: dict[str, Any]) -> _Account:
        self.stubs["ec2"].add_response("describe_security_groups", {"SecurityGroups": [{
            "GroupId": CLUSTER_SG, "GroupName": "eks-cluster-sg-ml-prod", "VpcId": CLUSTER_VPC,
            "IpPermissions": list(permissions)}]}, {"GroupIds": [CLUSTER_SG]})
        return self


def _from(group: str, protocol: str = "tcp", ports: tuple[int, int] | None = (443, 443)) -> dict[str, Any]:
    rule: dict[str, Any] = {"IpProtocol": protocol, "UserIdGroupPairs": [{"GroupId": group}]}
    if ports is not None:
        rule["FromPort"], rule["ToPort"] = ports
    return rule


@pytest.fixture
def account() -> Iterator[_Account]:
    account = _Account()
    for stub in account.stubs.values():
        stub.activate()
    yield account
    for stub in account.stubs.values():
        stub.assert_no_pending_responses()


def _checks(account: _Account, placed: dict[str, Any] | None) -> dict[str, Any]:
    return {c.name: c for c in check_cluster_access(DoctorContext(_config(placed), account, None))}  # type: ignore[arg-type]


def test_a_private_only_endpoint_fails_while_the_functions_run_outside_any_vpc(account: _Account) -> None:
    checks = _checks(account.described(public=False), None)
    endpoint = checks["cluster endpoint"]
    assert endpoint.status == "fail" and "private" in endpoint.detail
    assert "network.functions" in endpoint.fix
    assert "functions to endpoint" not in checks


def test_a_private_only_endpoint_passes_with_the_functions_in_the_cluster_s_vpc(account: _Account) -> None:
    checks = _checks(account.described(public=False).cluster_group_admits(_from(FUNCTIONS_SG)), PLACED)
    assert checks["cluster endpoint"].status == "pass" and CLUSTER_VPC in checks["cluster endpoint"].detail
    admitted = checks["functions to endpoint"]
    assert admitted.status == "pass" and CLUSTER_SG in admitted.detail and FUNCTIONS_SG in admitted.detail


def test_the_cluster_group_s_own_all_traffic_rule_admits_functions_placed_in_it(account: _Account) -> None:
    """EKS creates the cluster security group admitting all traffic from itself (sec-group-reqs.adoc)."""
    placed = {**PLACED, "securityGroups": [CLUSTER_SG]}
    checks = _checks(account.described(public=False).cluster_group_admits(_from(CLUSTER_SG, "-1", None)), placed)
    assert checks["functions to endpoint"].status == "pass"


def test_a_cluster_group_that_does_not_admit_the_functions_on_443_warns_with_the_rule_to_add(
        account: _Account) -> None:
    checks = _checks(account.described(public=False).cluster_group_admits(
        _from(FUNCTIONS_SG, ports=(10250, 10250)), _from("sg-0aaaaaaaaaaaaaaaa")), PLACED)
    admitted = checks["functions to endpoint"]
    assert admitted.status == "warn" and "443" in admitted.detail
    assert (f"aws ec2 authorize-security-group-ingress --group-id {CLUSTER_SG} --protocol tcp --port 443 "
            f"--source-group {FUNCTIONS_SG}") in admitted.fix


def test_functions_placed_in_another_vpc_warn(account: _Account) -> None:
    checks = _checks(account.described(public=False).cluster_group_admits(_from(FUNCTIONS_SG)),
                     {**PLACED, "vpcId": "vpc-0ffffffffffffffff"})
    endpoint = checks["cluster endpoint"]
    assert endpoint.status == "warn" and CLUSTER_VPC in endpoint.detail and "vpc-0ffffffffffffffff" in endpoint.detail


def test_functions_in_the_vpc_of_a_cluster_without_private_access_warn(account: _Account) -> None:
    checks = _checks(account.described(public=True, private=False).cluster_group_admits(_from(FUNCTIONS_SG)), PLACED)
    endpoint = checks["cluster endpoint"]
    assert endpoint.status == "warn" and "NAT" in endpoint.detail and "endpointPrivateAccess=true" in endpoint.fix


def test_security_groups_that_cannot_be_read_warn_naming_the_permission(account: _Account) -> None:
    account.described(public=False).stubs["ec2"].add_client_error("describe_security_groups", "UnauthorizedOperation",
                                                                  "no", 403)
    admitted = _checks(account, PLACED)["functions to endpoint"]
    assert admitted.status == "warn" and "ec2:DescribeSecurityGroups" in admitted.fix

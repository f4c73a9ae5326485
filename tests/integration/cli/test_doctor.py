"""`gpu-autoscaler doctor` on the emulator's account: right as provisioned, and broken on purpose (issue 18 part 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.cli.doctor_checks import (
    check_amis,
    check_efa_security_groups,
    check_offerings,
    check_quotas,
    check_reservations,
    check_spot_role,
    check_subnets,
)
from gpu_autoscaler.cli.doctor_context import DoctorContext
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import Config, load_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.models.requirements import Requirement
from gpu_autoscaler.naming import FUNCTIONS_KUBERNETES_GROUP

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


RESERVATION = {"id": "cr-0123456789abcdef0", "instanceType": "p5.48xlarge", "availabilityZone": "us-east-1a",
               "instanceCount": 2}
"""The example's reservation, with what the emulator needs to hold it in its account (the example names only its
id: an account without it fails the doctor's reservation check, as it should)."""


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = json.loads((ROOT / "cdk.json").read_text())["context"]["gpu-autoscaler"]
    data["nodePools"][0]["capacityReservations"] = [RESERVATION]
    path = tmp_path_factory.mktemp("doctor") / "config.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def aws(config_file: Path) -> Iterator[EmbeddedAws]:
    with EmbeddedAws(load_config(config_file)) as embedded:
        yield embedded


def _context(aws: EmbeddedAws, config: Config | None = None) -> DoctorContext:
    config = config or aws.config
    catalog = Ec2CatalogSource.from_config(aws.clients, config, use_pricing_api=False).catalog()
    return DoctorContext(config, aws.clients, catalog, subnet_ids=aws.subnet_ids,
                         security_group_ids=aws.security_group_ids)


def _statuses(checks: list[Any]) -> set[str]:
    return {c.status for c in checks}


def test_the_emulators_account_passes_and_warns_only_where_it_cannot_answer(aws: EmbeddedAws, config_file: Path
                                                                           ) -> None:
    result = runner.invoke(app, ["doctor", "--endpoint-url", aws.endpoint_url, "--config", str(config_file),
                                 "-o", "json"])
    assert result.exit_code == 0, result.output
    checks = {c["check"]: c for c in json.loads(result.stdout)}
    assert {c["status"] for c in checks.values()} <= {"pass", "warn"}
    for name in ("configuration", "spot service-linked role", "AMI x86_64", "node role", "node role policies",
                 "instance profile", "cluster endpoint", "cluster authentication mode", "EFA security group",
                 "subnet us-east-1a", "offerings gpu-burst"):
        assert checks[name]["status"] == "pass", checks[name]
    assert all(c["fix"] for c in checks.values() if c["status"] == "warn")


def test_a_missing_spot_role_fails_with_the_command_that_creates_it(aws: EmbeddedAws) -> None:
    iam = aws.clients.client("iam")
    role = iam.get_role(RoleName="AWSServiceRoleForEC2Spot")["Role"]
    iam.delete_role(RoleName="AWSServiceRoleForEC2Spot")
    try:
        [check] = check_spot_role(_context(aws))
    finally:
        iam.create_role(RoleName=role["RoleName"], Path=role["Path"],
                        AssumeRolePolicyDocument=json.dumps(role["AssumeRolePolicyDocument"]))
    assert check.status == "fail" and "create-service-linked-role" in check.fix


def test_quotas_below_a_pools_limit_fail_with_the_increase_to_ask_for(aws: EmbeddedAws) -> None:
    low = aws.config.model_copy(update={"vcpu_quotas": {"p/on-demand": 96}})
    checks = {c.name: c for c in check_quotas(_context(aws, low))}
    reserved = checks["vCPU quota gpu-reserved p/on-demand"]
    assert reserved.status == "fail" and "--quota-code L-417A185B --desired-value 768" in reserved.fix
    high = aws.config.model_copy(update={"vcpu_quotas": {"p/on-demand": 10_000}})
    assert {c.name: c for c in check_quotas(_context(aws, high))}["vCPU quota gpu-reserved p/on-demand"].status == \
        "pass"


def test_an_unknown_or_wrong_architecture_ami_fails(aws: EmbeddedAws) -> None:
    bad_image = aws.config.ami.model_copy(update={"x86_64": "ami-00000000000000bad"})
    missing = aws.config.model_copy(update={"ami": bad_image})
    assert "fail" in _statuses(check_amis(_context(aws, missing)))
    swapped = aws.config.model_copy(update={"ami": aws.config.ami.model_copy(update={"arm64": aws.config.ami.x86_64})})
    arm = {c.name: c for c in check_amis(_context(aws, swapped))}["AMI arm64"]
    assert arm.status == "fail" and "is x86_64" in arm.detail


def test_a_subnet_in_the_wrong_zone_fails(aws: EmbeddedAws) -> None:
    subnets = dict(aws.config.network.subnets)
    subnets["us-east-1a"], subnets["us-east-1b"] = subnets["us-east-1b"], subnets["us-east-1a"]
    crossed = aws.config.model_copy(update={"network": aws.config.network.model_copy(update={"subnets": subnets})})
    checks = {c.name: c for c in check_subnets(_context(aws, crossed))}
    assert checks["subnet us-east-1a"].status == "fail" and "is in us-east-1b" in checks["subnet us-east-1a"].detail


def test_a_pools_zone_capacity_type_and_own_label_requirements_are_read_as_the_packer_reads_them(
        aws: EmbeddedAws) -> None:
    """Karpenter's requirements may name the zone, the capacity type, the OS and the pool's own labels: a node has
    them, an instance type alone does not. Read on the type's labels, every type failed them and doctor said no GPU
    type met the pool's requirements; and a zone the pool's requirements leave out is not one it lacks."""
    burst = next(p for p in aws.config.node_pools if p.name == "gpu-burst")
    extra = [Requirement(key="topology.kubernetes.io/zone", operator="In", values=("us-east-1a",)),
             Requirement(key="karpenter.sh/capacity-type", operator="In", values=("spot",)),
             Requirement(key="kubernetes.io/os", operator="In", values=("linux",)),
             Requirement(key="karpenter.sh/nodepool", operator="In", values=("gpu-burst",)),
             Requirement(key="team", operator="In", values=("ml",))]
    pool = burst.model_copy(update={"requirements": [*burst.requirements, *extra], "labels": {"team": "ml"}})
    pools = [pool if p.name == "gpu-burst" else p for p in aws.config.node_pools]
    context = _context(aws, aws.config.model_copy(update={"node_pools": pools}))
    checks = {c.name: c for c in check_offerings(context)}
    check = checks["offerings gpu-burst"]
    assert check.status == "pass", check
    assert check.detail.endswith("offered in us-east-1a")
    assert {t.name for t in context.candidates(pool)} == {t.name for t in _context(aws).candidates(burst)}


def test_an_efa_pool_without_a_self_referencing_group_warns(aws: EmbeddedAws) -> None:
    ec2 = aws.clients.client("ec2")
    group = next(iter(aws.security_group_ids.values()))
    rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}]
    ec2.revoke_security_group_ingress(GroupId=group, IpPermissions=rule)
    try:
        [check] = check_efa_security_groups(_context(aws))
    finally:
        ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=rule)
    assert check.status == "warn" and "gpu-reserved" in check.detail and "--source-group" in check.fix


def test_an_invalid_configuration_is_the_first_failed_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    data = json.loads((ROOT / "cdk.json").read_text())["context"]["gpu-autoscaler"]
    data["nodePools"][0]["capacityTypes"] = ["sometimes"]
    path.write_text(json.dumps(data))
    result = runner.invoke(app, ["doctor", "--config", str(path)])
    assert result.exit_code == 2 and result.stderr.startswith("FAIL  configuration: ")
    assert "nodePools[0].capacityTypes[0]" in result.stderr


class _Paginator:
    def __init__(self, key: str, items: list[Any]) -> None:
        self.key, self.items = key, items

    def paginate(self, **_: Any) -> list[dict[str, Any]]:
        return [{self.key: self.items}]


class _DeployedAccount:
    """CloudFormation with the stack's role outputs and EKS with the given access entries, each in the functions'
    group (moto has no EKS access entries API)."""

    def __init__(self, entries: list[str]) -> None:
        self.entries = entries

    def client(self, service: str) -> Any:
        test = self

        class Client:
            def describe_stacks(self, StackName: str) -> dict[str, Any]:  # noqa: N803 - boto3's argument name
                assert StackName == "GpuAutoscaler-ml-prod"
                return {"Stacks": [{"Outputs": [
                    {"OutputKey": "DrainRoleArn", "OutputValue": "arn:aws:iam::123456789012:role/drain"},
                    {"OutputKey": "PackerRoleArn", "OutputValue": "arn:aws:iam::123456789012:role/packer"},
                    {"OutputKey": "TableName", "OutputValue": "t"}]}]}

            def describe_access_entry(self, clusterName: str, principalArn: str) -> dict[str, Any]:  # noqa: N803
                assert principalArn in test.entries
                return {"accessEntry": {"principalArn": principalArn, "type": "STANDARD",
                                        "kubernetesGroups": [FUNCTIONS_KUBERNETES_GROUP]}}

            def get_paginator(self, name: str) -> _Paginator:
                if name == "list_associated_access_policies":
                    return _Paginator("associatedAccessPolicies", [])
                return _Paginator("accessEntries", test.entries)

        return Client()


def test_after_a_deploy_each_kubernetes_function_needs_its_access_entry(aws: EmbeddedAws) -> None:
    from gpu_autoscaler.cli.doctor_access import check_function_access

    def checks(entries: list[str]) -> list[Any]:
        return check_function_access(DoctorContext(aws.config, _DeployedAccount(entries), None))  # type: ignore[arg-type]

    [missing] = checks(["arn:aws:iam::123456789012:role/drain"])
    assert missing.name == "EKS access entry Packer" and missing.status == "fail"
    assert "role/packer" in missing.detail and "cdk deploy" in missing.fix  # kubernetes.eksAccess: the stack makes it
    [ok] = checks(["arn:aws:iam::123456789012:role/drain", "arn:aws:iam::123456789012:role/packer"])
    assert ok.status == "pass" and ok.detail == "Drain, Packer"
    [before] = check_function_access(_context(aws))
    assert before.status == "pass" and "not deployed yet" in before.detail


def test_a_reservation_the_account_does_not_hold_fails(aws: EmbeddedAws) -> None:
    pools = [aws.config.node_pools[0].model_copy(update={"capacity_reservations": [
        aws.config.node_pools[0].capacity_reservations[0].model_copy(update={"id": "cr-0fffffffffffffff0"})]}),
        *aws.config.node_pools[1:]]
    [check] = [c for c in check_reservations(_context(aws, aws.config.model_copy(update={"node_pools": pools})))
               if c.status != "pass"]
    assert check.status == "fail" and check.name == "reservation cr-0fffffffffffffff0"
    assert "NotFound" in check.detail and "capacityReservations" in check.fix

"""`network.functions`: packer, interruption, drain and consolidate (the Kubernetes API's clients) run in the
cluster's VPC, so a cluster whose API endpoint is private only can be used; the others stay outside any VPC.

Lambda Developer Guide, configuration-vpc.html ("Required IAM permissions"): the execution role needs
ec2:CreateNetworkInterface, ec2:DescribeNetworkInterfaces, ec2:DescribeSubnets, ec2:DeleteNetworkInterface,
ec2:AssignPrivateIpAddresses and ec2:UnassignPrivateIpAddresses; Lambda creates the function's network interfaces
with it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from cfnlint.api import lint

from gpu_autoscaler.naming import FUNCTIONS
from tests.infrastructure.conftest import KUBERNETES_CLIENTS, infrastructure_config_data, synthesize
from tests.infrastructure.test_compliance import (
    test_cdk_nag_has_no_unsuppressed_findings,
    test_cdk_nag_ran_and_every_suppression_has_a_reason,
    test_checkov_finds_nothing_unsuppressed_and_every_skip_has_a_reason,
    test_no_other_synth_errors_or_warnings,
)
from tests.infrastructure.test_permissions import allowed, statements_of

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized

PLACED = {"vpcId": "vpc-0123456789abcdef0", "subnets": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
          "securityGroups": ["sg-0123456789abcdef1"]}
ENI_ACTIONS = {"ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets",
               "ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses"}


@pytest.fixture(scope="module")
def placed(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    data = infrastructure_config_data()
    data["network"]["functions"] = PLACED
    return synthesize(data, tmp_path_factory.mktemp("placed"))


def _function(synthesized: Synthesized, name: str) -> dict[str, Any]:
    props: dict[str, Any] = synthesized.resources[
        synthesized.logical_id(synthesized.stack.functions.functions[name])]["Properties"]
    return props


def test_the_kubernetes_clients_run_in_the_configured_subnets_and_groups(placed: Synthesized) -> None:
    for name in KUBERNETES_CLIENTS:
        assert _function(placed, name)["VpcConfig"] == {"SubnetIds": PLACED["subnets"],
                                                         "SecurityGroupIds": PLACED["securityGroups"]}, name
    assert [name for name in FUNCTIONS if "VpcConfig" in _function(placed, name)] == KUBERNETES_CLIENTS


def test_no_function_is_in_a_vpc_unless_placed(synthesized: Synthesized) -> None:
    assert [k for k, f in synthesized.of_type("AWS::Lambda::Function").items() if "VpcConfig" in f["Properties"]] == []
    for name in FUNCTIONS:
        assert not any(a in ENI_ACTIONS - {"ec2:DescribeSubnets"}
                       for s in statements_of(synthesized, name) for a in _listed(s["Action"])), name


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_only_the_placed_functions_may_manage_their_network_interfaces(placed: Synthesized) -> None:
    """The roles are the stack's own, so CDK adds no AWSLambdaVPCAccessExecutionRole: the statement is inline, with
    the actions the Lambda guide lists and no logs actions (each function's log group is granted already)."""
    for name in FUNCTIONS:
        holders = {a for a in ENI_ACTIONS if allowed(placed, name, a)}
        assert holders == (ENI_ACTIONS if name in KUBERNETES_CLIENTS else
                           {"ec2:DescribeSubnets"} & holders), name
    for name in KUBERNETES_CLIENTS:
        [statement] = [s for s in statements_of(placed, name) if s.get("Sid") == "LambdaVpcNetworkInterfaces"]
        assert set(_listed(statement["Action"])) == ENI_ACTIONS
        assert statement["Resource"] == "*"
    for key, role in placed.of_type("AWS::IAM::Role").items():
        assert not any("AWSLambdaVPCAccessExecutionRole" in json.dumps(arn)
                       for arn in role["Properties"].get("ManagedPolicyArns", [])), key


def test_checkov_s_vpc_finding_is_accepted_only_outside_the_vpc(placed: Synthesized) -> None:
    for key, function in placed.of_type("AWS::Lambda::Function").items():
        skipped = {s["id"] for s in function.get("Metadata", {}).get("checkov", {}).get("skip", [])}
        assert ("CKV_AWS_117" in skipped) == ("VpcConfig" not in function["Properties"]), key


def test_placed_functions_are_compliant(placed: Synthesized) -> None:
    test_cdk_nag_has_no_unsuppressed_findings(placed)
    test_cdk_nag_ran_and_every_suppression_has_a_reason(placed)
    test_no_other_synth_errors_or_warnings(placed)
    matches = lint(json.dumps(placed.template.to_json()), regions=[placed.config.region])
    assert [f"{m.rule.id} {m.message}" for m in matches if m.rule.id.startswith("E")] == []


def test_checkov_passes_placed_functions(placed: Synthesized) -> None:
    test_checkov_finds_nothing_unsuppressed_and_every_skip_has_a_reason(placed)

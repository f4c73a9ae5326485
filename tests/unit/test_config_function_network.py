"""`network.functions`: the VPC placement of the functions that call the Kubernetes API (README, Deploy, "A private
API endpoint"). Absent, nothing changes: the published configuration is the same JSON as before."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_autoscaler.config import ConfigError, parse_config

PLACED = {"vpcId": "vpc-0123456789abcdef0", "subnets": ["subnet-0aaa", "subnet-0bbb"],
          "securityGroups": ["sg-0123456789abcdef0"]}


def test_functions_run_outside_any_vpc_unless_placed(config_data: dict[str, Any]) -> None:
    config = parse_config(config_data)
    assert config.network.functions is None
    assert '"functions"' not in config.to_json()


def test_a_placement_names_the_vpc_its_private_subnets_and_security_groups(config_data: dict[str, Any]) -> None:
    config_data["network"]["functions"] = PLACED
    placed = parse_config(config_data).network.functions
    assert placed is not None
    assert placed.vpc_id == "vpc-0123456789abcdef0"
    assert placed.subnets == ["subnet-0aaa", "subnet-0bbb"] and placed.security_groups == ["sg-0123456789abcdef0"]
    assert parse_config(config_data).to_json().count('"vpcId":"vpc-0123456789abcdef0"') == 1


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("vpcId", "vpc0123", "network.functions.vpcId: 'vpc0123' is not a VPC id (vpc-…)"),
        ("subnets", ["subnet-0aaa", "sn-0bbb"],
         "network.functions.subnets[1]: 'sn-0bbb' is not a subnet id (subnet-…)"),
        ("securityGroups", ["group-1"], "network.functions.securityGroups[0]: 'group-1' is not a security group id "
                                        "(sg-…)"),
        ("subnets", [], "network.functions.subnets: List should have at least 1 item"),
        ("securityGroups", [], "network.functions.securityGroups: List should have at least 1 item"),
        # Lambda's VpcConfig: at most 16 subnets and 5 security groups (Lambda API Reference, VpcConfig).
        ("subnets", [f"subnet-0{i:03x}" for i in range(17)], "network.functions.subnets: List should have at most 16"),
        ("securityGroups", [f"sg-0{i:03x}" for i in range(6)], "network.functions.securityGroups: List should have at "
                                                               "most 5"),
    ],
)
def test_a_placement_with_a_wrong_id_is_refused_naming_it(config_data: dict[str, Any], field: str, value: Any,
                                                          message: str) -> None:
    config_data["network"]["functions"] = {**PLACED, field: value}
    with pytest.raises(ConfigError) as caught:
        parse_config(config_data)
    assert message in str(caught.value)


def test_a_placement_needs_all_three(config_data: dict[str, Any]) -> None:
    config_data["network"]["functions"] = {"subnets": ["subnet-0aaa"]}
    with pytest.raises(ConfigError) as caught:
        parse_config(config_data)
    assert "network.functions.vpcId: Field required" in str(caught.value)
    assert "network.functions.securityGroups: Field required" in str(caught.value)

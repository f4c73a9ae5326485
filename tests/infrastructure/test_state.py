"""The table and the configuration parameter."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.naming import ResourceNames

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized


def test_table_keys_billing_recovery_ttl_encryption_and_retention(synthesized: Synthesized) -> None:
    [table] = synthesized.of_type("AWS::DynamoDB::Table").values()
    props = table["Properties"]
    assert props["TableName"] == ResourceNames(synthesized.config.cluster_name).table
    assert props["KeySchema"] == [
        {"AttributeName": "PK", "KeyType": "HASH"},
        {"AttributeName": "SK", "KeyType": "RANGE"},
    ]
    assert props["AttributeDefinitions"] == [
        {"AttributeName": "PK", "AttributeType": "S"},
        {"AttributeName": "SK", "AttributeType": "S"},
    ]
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expiresAt", "Enabled": True}
    assert props["SSESpecification"]["SSEEnabled"] is True
    assert table["UpdateReplacePolicy"] == "Retain"


def test_table_is_retained_except_when_the_deploy_that_created_it_rolls_back(synthesized: Synthesized) -> None:
    """A first deploy that fails and rolls back must not leave the fixed-name table behind: every retry would fail
    with "already exists". RetainExceptOnCreate: "If the stack operation that created the resource is rolled back,
    CloudFormation deletes the resource"; otherwise it is retained as Retain would."""
    [table] = synthesized.of_type("AWS::DynamoDB::Table").values()
    assert table["DeletionPolicy"] == "RetainExceptOnCreate"
    assert table["UpdateReplacePolicy"] == "Retain"


def test_config_parameter_holds_the_configuration(synthesized: Synthesized) -> None:
    [parameter] = synthesized.of_type("AWS::SSM::Parameter").values()
    props = parameter["Properties"]
    assert props["Name"] == ResourceNames(synthesized.config.cluster_name).config_parameter
    assert props["Type"] == "String"
    assert props["Tier"] == "Advanced"
    assert props["Value"] == synthesized.config.to_json()
    assert parse_config(json.loads(props["Value"])) == synthesized.config

"""The table and the configuration parameter."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.naming import ResourceNames
from tests.conftest import ROOT

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


def test_the_readme_says_how_to_deploy_again_over_the_retained_table(synthesized: Synthesized) -> None:
    """The table outlives `cdk destroy` under its fixed name, so the next `cdk deploy` of the cluster would create a
    table that exists and fail ("already exists"; retaining "is not a means to redeploy your application and
    reuse existing resources", aws/aws-cdk#11208): the Teardown section says what is kept, why, and both ways on."""
    [table] = synthesized.of_type("AWS::DynamoDB::Table").values()
    readme = (ROOT / "README.md").read_text()
    teardown = readme[readme.index("### Teardown"):]
    teardown = teardown[:teardown.index("\n## ")]
    assert table["DeletionPolicy"] == "RetainExceptOnCreate" and "TableName" in table["Properties"]
    assert "already exists" in teardown
    assert "cdk import" in teardown, "adopt the kept table into the new stack"
    assert f"aws dynamodb delete-table --table-name {ResourceNames('ml-prod').table}" in teardown, "or delete it"


def test_config_parameter_holds_the_configuration(synthesized: Synthesized) -> None:
    [parameter] = synthesized.of_type("AWS::SSM::Parameter").values()
    props = parameter["Properties"]
    assert props["Name"] == ResourceNames(synthesized.config.cluster_name).config_parameter
    assert props["Type"] == "String"
    assert props["Tier"] == "Advanced"
    assert props["Value"] == synthesized.config.to_json()
    assert parse_config(json.loads(props["Value"])) == synthesized.config


def test_the_readme_imports_the_kept_table_by_its_logical_id(synthesized: Synthesized) -> None:
    """`cdk import` asks about every resource the template adds (aws-cdk-cli `importer.ts`,
    `askForResourceIdentifier`), dozens here, and only the table exists: the README maps the table alone, by the
    logical id the stack gives it, so the import takes the table and `cdk deploy` creates the rest."""
    [logical_id] = synthesized.of_type("AWS::DynamoDB::Table")
    readme = (ROOT / "README.md").read_text()
    table = ResourceNames("ml-prod").table
    assert f'--resource-mapping-inline \'{{"{logical_id}":{{"TableName":"{table}"}}}}\'' in readme

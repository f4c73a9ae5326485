"""The single DynamoDB table: claims, pod assignments, unavailable offerings, demand, idempotency records."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

if TYPE_CHECKING:
    from gpu_autoscaler.naming import ResourceNames

from gpu_autoscaler.naming import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE

__all__ = ["StateTable"]


class StateTable(Construct):
    """On-demand (the load follows the pending pods, idle most of the time) and retained on stack deletion:
    it holds the record of what we launched, which outlives any deployment of the functions.

    Retained except when the deploy that created it rolls back (DeletionPolicy RetainExceptOnCreate: "If the stack
    operation that created the resource is rolled back, CloudFormation deletes the resource"): with its fixed name,
    a table left by a failed first deploy would fail every retry with "already exists". For the same reason the
    first deploy after `cdk destroy` needs the kept table imported (`cdk import`) or deleted (README, Teardown)."""

    def __init__(self, scope: Construct, construct_id: str, *, names: ResourceNames) -> None:
        super().__init__(scope, construct_id)
        self.table = dynamodb.Table(
            self,
            "Table",
            table_name=names.table,
            partition_key=dynamodb.Attribute(name=PARTITION_KEY, type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name=SORT_KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=TTL_ATTRIBUTE,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            removal_policy=RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE,
        )

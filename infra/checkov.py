"""checkov's findings this stack accepts, each with its reason, written into the template's metadata.

checkov (an independent scanner) reads `Metadata.checkov.skip: [{id, comment}]` on a resource; the reasons
live here in one table by resource type, next to the rule they answer, as cdk-nag's live beside the
resources they concern. An Aspect adds them at synth, so a resource added later gets the same answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jsii
from aws_cdk import CfnResource, IAspect
from aws_cdk import aws_lambda as lambda_

if TYPE_CHECKING:
    from constructs import IConstruct

__all__ = ["ACCEPTED", "CheckovSkips"]

_AWS_MANAGED_KEYS = (
    "Encrypted at rest with the service's AWS managed key (SSE-SQS, DynamoDB's AWS owned/managed key, CloudWatch "
    "Logs' default encryption). The data is queue messages, claim records and logs of this stack's own decisions, "
    "no customer data; a customer managed key would add a key policy every producer (EventBridge, Scheduler, the "
    "agent) must be granted, and a yearly cost, for no threat this data faces."
)

ACCEPTED: dict[str, dict[str, str]] = {
    "AWS::SNS::Topic": {
        "CKV_AWS_26": "The alarm topic is not encrypted at rest: CloudWatch alarms can publish to an encrypted "
        "topic only under a customer managed key whose policy grants cloudwatch.amazonaws.com (the AWS managed "
        "key's policy cannot), and its messages are alarm state changes naming this stack's queues and functions, "
        "no customer data. Publishing without TLS is denied (aws:SecureTransport).",
    },
    "AWS::SQS::Queue": {"CKV_AWS_27": _AWS_MANAGED_KEYS},
    "AWS::DynamoDB::Table": {"CKV_AWS_119": _AWS_MANAGED_KEYS},
    "AWS::Logs::LogGroup": {"CKV_AWS_158": _AWS_MANAGED_KEYS},
    "AWS::Lambda::Function": {
        "CKV_AWS_116": "Nothing invokes these functions synchronously without a retry home: the queue-fed ones "
        "keep failed messages in their queue's redrive dead-letter queue (maxReceiveCount), and the scheduled "
        "ones send failed asynchronous invocations to the scheduler DLQ through an on-failure destination, "
        "which supersedes the function-level DeadLetterConfig. The deletion hook's handlers (`infra.teardown`) "
        "are invoked synchronously by CDK's custom resource Provider framework, which reports a failure to "
        "CloudFormation.",
        "CKV_AWS_117": "The functions call AWS APIs and the cluster's Kubernetes API endpoint; none reaches a "
        "private resource. A VPC would need the user's subnets with NAT or VPC endpoints. A cluster whose API "
        "endpoint is private only is served by `network.functions`, which places the functions that call it in the "
        "cluster's VPC (README, Deploy); accepted only for a function outside a VPC.",
        "CKV_AWS_173": "The environment holds resource names and URLs only (table, queues, parameter, launch "
        "template) and the configuration's digest, no secret; Lambda encrypts it at rest with its AWS managed key.",
    },
}
"""Resource type → checkov check id → why this stack accepts the finding."""

_UNRESERVED = (
    "No reserved concurrency on purpose: the packer runs one at a time by its FIFO queue's one message group, the "
    "fleet and drain functions are bounded by their SQS event source's MaximumConcurrency, the interruption "
    "function must not queue one Spot warning behind another inside the two-minute notice, and prewarm and "
    "consolidate run one tick at a time by a lease in the state table (a tick that finds it held skips); reserving "
    "concurrency would also take from the account's unreserved pool, which cannot go below 100 (10 in a new "
    "account's 10) and so fails the deploy in new accounts."
)


@jsii.implements(IAspect)
class CheckovSkips:
    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, CfnResource):
            return
        skips = dict(ACCEPTED.get(node.cfn_resource_type, {}))
        if isinstance(node, lambda_.CfnFunction) and node.reserved_concurrent_executions is None:
            skips["CKV_AWS_115"] = _UNRESERVED
        if isinstance(node, lambda_.CfnFunction) and node.vpc_config is not None:
            del skips["CKV_AWS_117"]  # in a VPC: nothing to accept
        if not skips:
            return
        existing: Any = node.get_metadata("checkov") or {}
        listed = {entry["id"] for entry in existing.get("skip", [])}
        entries = [*existing.get("skip", []),
                   *({"id": check, "comment": reason} for check, reason in skips.items() if check not in listed)]
        node.add_metadata("checkov", {**existing, "skip": entries})

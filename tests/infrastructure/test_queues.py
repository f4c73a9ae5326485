"""Queues: FIFO pending-pods, every queue with SSE, TLS only and a DLQ after 5 receives, visibility ≥ 6 × timeout."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk.assertions import Match

from gpu_autoscaler.event_patterns import INTERRUPTION_RULES
from gpu_autoscaler.naming import ResourceNames
from infra.queues import WorkQueue

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized


def _queue_id(synthesized: Synthesized, kind: WorkQueue, *, dlq: bool = False) -> str:
    queues = synthesized.stack.queues
    return synthesized.logical_id((queues.dead_letter_queues if dlq else queues.queues)[kind])


def test_nine_queues_all_encrypted_with_their_names(synthesized: Synthesized) -> None:
    names = ResourceNames(synthesized.config.cluster_name)
    queues = synthesized.of_type("AWS::SQS::Queue")
    assert sorted(q["Properties"]["QueueName"] for q in queues.values()) == sorted([
        names.pending_pods_queue, names.pending_pods_dlq,
        names.interruption_queue, names.interruption_dlq,
        names.launch_queue, names.launch_dlq,
        names.drain_queue, names.drain_dlq,
        names.scheduler_dlq,
    ])  # fmt: skip
    for queue in queues.values():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True


def test_pending_pods_is_fifo_without_content_dedup_and_its_dlq_is_fifo(synthesized: Synthesized) -> None:
    queue = synthesized.resources[_queue_id(synthesized, WorkQueue.PENDING_PODS)]["Properties"]
    dlq = synthesized.resources[_queue_id(synthesized, WorkQueue.PENDING_PODS, dlq=True)]["Properties"]
    assert queue["FifoQueue"] is True
    assert queue["ContentBasedDeduplication"] is False
    assert dlq["FifoQueue"] is True
    for kind in (WorkQueue.INTERRUPTION, WorkQueue.LAUNCH, WorkQueue.DRAIN):
        assert "FifoQueue" not in synthesized.resources[_queue_id(synthesized, kind)]["Properties"]


def test_each_work_queue_redrives_to_its_own_dlq_after_five_receives(synthesized: Synthesized) -> None:
    for kind in WorkQueue:
        props = synthesized.resources[_queue_id(synthesized, kind)]["Properties"]
        assert props["RedrivePolicy"] == {
            "deadLetterTargetArn": {"Fn::GetAtt": [_queue_id(synthesized, kind, dlq=True), "Arn"]},
            "maxReceiveCount": 5,
        }


def test_visibility_timeout_is_at_least_six_times_the_consumer_timeout(synthesized: Synthesized) -> None:
    functions = synthesized.of_type("AWS::Lambda::Function")
    mappings = synthesized.of_type("AWS::Lambda::EventSourceMapping")
    assert len(mappings) == 4
    for mapping in mappings.values():
        queue_id = mapping["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]
        function_id = mapping["Properties"]["FunctionName"]["Ref"]
        visibility = synthesized.resources[queue_id]["Properties"]["VisibilityTimeout"]
        assert visibility >= 6 * functions[function_id]["Properties"]["Timeout"]


def test_every_queue_denies_requests_without_tls(synthesized: Synthesized) -> None:
    policies = synthesized.of_type("AWS::SQS::QueuePolicy")
    protected: set[str] = set()
    for policy in policies.values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Effect"] == "Deny" and statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}:
                protected.update(queue["Ref"] for queue in policy["Properties"]["Queues"])
    assert protected == set(synthesized.of_type("AWS::SQS::Queue"))


def test_interruption_queue_admits_only_the_eventbridge_rules(synthesized: Synthesized) -> None:
    queue_id = _queue_id(synthesized, WorkQueue.INTERRUPTION)
    rule_ids = {synthesized.logical_id(rule) for rule in synthesized.stack.interruption_rules.rules.values()}
    assert len(rule_ids) == len(INTERRUPTION_RULES)
    [policy] = [p for p in synthesized.of_type("AWS::SQS::QueuePolicy").values()
                if p["Properties"]["Queues"] == [{"Ref": queue_id}]]  # fmt: skip
    allows = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    admitted: set[str] = set()
    for statement in allows:
        assert statement["Principal"] == {"Service": "events.amazonaws.com"}
        assert "sqs:SendMessage" in statement["Action"]
        source = statement["Condition"]["ArnEquals"]["aws:SourceArn"]["Fn::GetAtt"]
        assert source[1] == "Arn"
        admitted.add(source[0])
    assert admitted == rule_ids


def test_agent_policy_sends_to_the_pending_pods_queue_only(synthesized: Synthesized) -> None:
    queue_id = _queue_id(synthesized, WorkQueue.PENDING_PODS)
    synthesized.template.has_resource_properties("AWS::IAM::ManagedPolicy", {
        "PolicyDocument": {"Statement": [{
            "Effect": "Allow",
            "Action": ["sqs:SendMessage", "sqs:GetQueueUrl"],
            "Resource": {"Fn::GetAtt": [queue_id, "Arn"]},
        }]},
    })  # fmt: skip
    policy_id = synthesized.logical_id(synthesized.stack.agent.policy)
    assert synthesized.outputs["AgentPolicyArn"]["Value"] == {"Ref": policy_id}


def test_outputs_name_queues_table_and_parameter(synthesized: Synthesized) -> None:
    for kind, label in ((WorkQueue.PENDING_PODS, "PendingPods"), (WorkQueue.INTERRUPTION, "Interruption"),
                        (WorkQueue.LAUNCH, "Launch"), (WorkQueue.DRAIN, "Drain")):  # fmt: skip
        assert synthesized.outputs[f"{label}QueueUrl"]["Value"] == {"Ref": _queue_id(synthesized, kind)}
    synthesized.template.has_output("TableName", {"Value": {"Ref": Match.string_like_regexp("^StateTable")}})
    synthesized.template.has_output("ConfigParameterName", {"Value": {"Ref": Match.string_like_regexp("^Config")}})

"""EventBridge rules: exactly the shared interruption patterns, each delivering to the interruption queue."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gpu_autoscaler.event_patterns import INTERRUPTION_RULES
from infra.queues import WorkQueue

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized


def test_one_rule_per_shared_pattern(synthesized: Synthesized) -> None:
    rules = synthesized.of_type("AWS::Events::Rule")
    patterns = sorted(json.dumps(r["Properties"]["EventPattern"], sort_keys=True) for r in rules.values())
    assert patterns == sorted(json.dumps(p, sort_keys=True) for p in INTERRUPTION_RULES.values())


def test_state_change_rule_lists_the_four_states(synthesized: Synthesized) -> None:
    synthesized.template.has_resource_properties("AWS::Events::Rule", {"EventPattern": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance State-change Notification"],
        "detail": {"state": ["stopping", "stopped", "shutting-down", "terminated"]},
    }})  # fmt: skip


def test_every_rule_targets_the_interruption_queue_with_a_dlq(synthesized: Synthesized) -> None:
    queues = synthesized.stack.queues
    queue_id = synthesized.logical_id(queues.queues[WorkQueue.INTERRUPTION])
    dlq_id = synthesized.logical_id(queues.dead_letter_queues[WorkQueue.INTERRUPTION])
    for rule in synthesized.of_type("AWS::Events::Rule").values():
        assert rule["Properties"]["State"] == "ENABLED"
        [target] = rule["Properties"]["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [queue_id, "Arn"]}
        assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [dlq_id, "Arn"]}}
        assert target["RetryPolicy"]["MaximumRetryAttempts"] > 0


def test_capacity_block_ends_and_interruptible_reservations_are_matched_in_both_spellings(
        synthesized: Synthesized) -> None:
    """EC2 User Guide, "Monitor Capacity Blocks using EventBridge" (the warning 40 minutes before a block ends, named
    both ways on that page's versions) and "Monitor interruptible Capacity Reservations" (both detail-types)."""
    synthesized.template.has_resource_properties("AWS::Events::Rule", {"EventPattern": {
        "source": ["aws.ec2"],
        "detail-type": ["Capacity Block Reservation Expiration Warning", "Capacity Block Expiration Warning"],
    }})  # fmt: skip
    synthesized.template.has_resource_properties("AWS::Events::Rule", {"EventPattern": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning",
                        "EC2 Interruptible Capacity Reservation Instance Interruption Warning"],
    }})  # fmt: skip

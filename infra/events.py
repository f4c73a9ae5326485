"""EventBridge rules that carry what AWS says about our capacity into the interruption queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from constructs import Construct

from gpu_autoscaler.event_patterns import INTERRUPTION_RULES
from gpu_autoscaler.wiring import RULE_TARGET_MAX_EVENT_AGE_SECONDS, RULE_TARGET_RETRY_ATTEMPTS

if TYPE_CHECKING:
    from aws_cdk import aws_sqs as sqs

__all__ = ["InterruptionRules", "event_pattern"]

_PATTERN_FIELDS = {"source": "source", "detail-type": "detail_type", "detail": "detail", "account": "account",
                   "region": "region", "resources": "resources"}  # fmt: skip


def event_pattern(pattern: dict[str, Any]) -> events.EventPattern:
    """The shared pattern (EventBridge's JSON keys) as CDK's EventPattern; an unknown key is an error, not dropped."""
    unknown = set(pattern) - set(_PATTERN_FIELDS)
    if unknown:
        raise ValueError(f"event pattern keys not supported here: {', '.join(sorted(unknown))}")
    return events.EventPattern(**{_PATTERN_FIELDS[key]: value for key, value in pattern.items()})


class InterruptionRules(Construct):
    """One rule per pattern of `gpu_autoscaler.event_patterns`, the same patterns the emulator routes by.

    Each SQS target adds a queue-policy statement for events.amazonaws.com conditioned on that rule's ARN
    (`aws:SourceArn`), so the queue admits these rules and nothing else. An event EventBridge cannot deliver
    after its retries lands in the interruption DLQ rather than being dropped.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        queue: sqs.IQueue,
        dead_letter_queue: sqs.IQueue,
    ) -> None:
        super().__init__(scope, construct_id)
        self.rules: dict[str, events.Rule] = {}
        for name, pattern in INTERRUPTION_RULES.items():
            rule = events.Rule(
                self,
                "".join(part.title() for part in name.split("-")),
                description=f"gpu-autoscaler {cluster_name}: {name} events to the interruption queue",
                event_pattern=event_pattern(pattern),
            )
            rule.add_target(
                targets.SqsQueue(
                    queue,
                    dead_letter_queue=dead_letter_queue,
                    retry_attempts=RULE_TARGET_RETRY_ATTEMPTS,
                    max_event_age=Duration.seconds(RULE_TARGET_MAX_EVENT_AGE_SECONDS),
                )
            )
            self.rules[name] = rule

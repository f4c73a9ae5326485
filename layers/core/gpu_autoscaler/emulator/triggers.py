"""The stack's EventBridge rules and Scheduler schedules, created on the emulator's endpoint.

The rules are real moto rules with the shared patterns (`gpu_autoscaler.event_patterns`) and an SQS target:
moto routes `PutEvents` on the default bus to the interruption queue by them, as EventBridge does. The
schedules are stored in moto's Scheduler (so a client can list them) and fired by the emulator
(`gpu_autoscaler.emulator.schedules`), which reads them back from there: moto stores schedules, it does not
run them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.event_patterns import INTERRUPTION_RULES
from gpu_autoscaler.lambda_context import DEFAULT_ACCOUNT
from gpu_autoscaler.wiring import (
    RATE_SCHEDULES,
    RULE_TARGET_MAX_EVENT_AGE_SECONDS,
    RULE_TARGET_RETRY_ATTEMPTS,
    SCHEDULE_DELIVERY_RETRIES,
    schedule_name,
    tick_input,
    tick_retry,
)

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.naming import ResourceNames

__all__ = ["ScheduleSpec", "create_rules", "create_schedules", "function_arn", "read_schedules", "rule_name"]


def rule_name(names: ResourceNames, rule: str) -> str:
    """`<cluster>-gpu-autoscaler-<rule>`, shortened to fit (the stack lets CloudFormation name its rules; the
    emulator needs names)."""
    return names.rule(rule)


def function_arn(names: ResourceNames, function: str, region: str, account: str = DEFAULT_ACCOUNT) -> str:
    return f"arn:aws:lambda:{region}:{account}:function:{names.function(function)}"


def create_rules(
    clients: AwsClients, names: ResourceNames, queue_arn: str, dead_letter_arn: str, tags: dict[str, str]
) -> list[str]:
    """One rule per shared pattern, each targeting the interruption queue (its DLQ for undeliverable events)."""
    events = clients.client("events")
    created = []
    for rule, pattern in INTERRUPTION_RULES.items():
        name = rule_name(names, rule)
        events.put_rule(
            Name=name, EventPattern=json.dumps(pattern), State="ENABLED",
            Description=f"gpu-autoscaler {names.cluster}: {rule} events to the interruption queue",
            Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
        )
        events.put_targets(Rule=name, Targets=[{
            "Id": "interruption-queue",
            "Arn": queue_arn,
            "DeadLetterConfig": {"Arn": dead_letter_arn},
            "RetryPolicy": {
                "MaximumRetryAttempts": RULE_TARGET_RETRY_ATTEMPTS,
                "MaximumEventAgeInSeconds": RULE_TARGET_MAX_EVENT_AGE_SECONDS,
            },
        }])
        created.append(name)
    return created


def _scheduler_role(clients: AwsClients, names: ResourceNames, tags: dict[str, str]) -> str:
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "scheduler.amazonaws.com"},
                       "Action": "sts:AssumeRole"}],
    }  # fmt: skip
    return str(clients.client("iam").create_role(
        RoleName=names.role("scheduler"), AssumeRolePolicyDocument=json.dumps(trust),
        Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
        Description="EventBridge Scheduler: invoke the prewarm and consolidate functions, nothing else",
    )["Role"]["Arn"])


def create_schedules(
    clients: AwsClients, config: Config, names: ResourceNames, dead_letter_arn: str, tags: dict[str, str]
) -> list[str]:
    """The schedule group, a schedule per scaling window (cron + time zone) and the two rate schedules."""
    scheduler = clients.client("scheduler")
    group = names.schedule_group()
    scheduler.create_schedule_group(Name=group, Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    role = _scheduler_role(clients, names, tags)

    def create(name: str, expression: str, timezone: str | None, function: str, payload: str,
               description: str) -> str:
        extra: dict[str, Any] = {"ScheduleExpressionTimezone": timezone} if timezone else {}
        scheduler.create_schedule(
            Name=name, GroupName=group, ScheduleExpression=expression, Description=description,
            FlexibleTimeWindow={"Mode": "OFF"}, State="ENABLED",
            Target={
                "Arn": function_arn(names, function, config.region), "RoleArn": role, "Input": payload,
                "RetryPolicy": {"MaximumRetryAttempts": SCHEDULE_DELIVERY_RETRIES,
                                "MaximumEventAgeInSeconds": tick_retry(function).max_event_age_seconds},
                "DeadLetterConfig": {"Arn": dead_letter_arn},
            },
            **extra,
        )
        return name

    created = [
        create(schedule_name(w.name), w.schedule, w.timezone, "prewarm", tick_input(w.name),
               f"scaling window {w.name}: warm pool {w.node_pool}")
        for w in config.scaling_windows
    ]
    created += [
        create(rate.name, rate.expression, None, rate.function, tick_input(None), f"{rate.function} tick")
        for rate in RATE_SCHEDULES
    ]
    return created


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule as Scheduler stores it: what the emulator needs to fire it."""

    name: str
    expression: str
    timezone: str | None
    function: str
    """The target function's short name (`prewarm`, `consolidate`)."""
    target_arn: str
    input: str


def _short_function_name(names: ResourceNames, arn: str) -> str:
    physical = arn.rsplit(":", 1)[1]
    return names.function_of(physical) or physical


def read_schedules(clients: AwsClients, names: ResourceNames) -> list[ScheduleSpec]:
    """Every enabled schedule of the stack's group, read back from the endpoint."""
    scheduler = clients.client("scheduler")
    group = names.schedule_group()
    specs = []
    for summary in scheduler.list_schedules(GroupName=group)["Schedules"]:
        schedule = scheduler.get_schedule(GroupName=group, Name=summary["Name"])
        if schedule.get("State", "ENABLED") != "ENABLED":
            continue
        target = schedule["Target"]
        specs.append(ScheduleSpec(
            name=schedule["Name"],
            expression=schedule["ScheduleExpression"],
            timezone=schedule.get("ScheduleExpressionTimezone"),
            function=_short_function_name(names, target["Arn"]),
            target_arn=target["Arn"],
            input=target.get("Input", "{}"),
        ))
    return specs

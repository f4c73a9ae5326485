"""EventBridge Scheduler: a schedule per scaling window in its time zone, the two rate ticks, retries and a DLQ."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.models.messages import ScheduleTick
from infra.schedules import SCHEDULED_TIME, schedule_name

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized


def _schedules(synthesized: Synthesized) -> dict[str, dict[str, Any]]:
    return {s["Properties"]["Name"]: s["Properties"] for s in synthesized.of_type("AWS::Scheduler::Schedule").values()}


def _function_id(synthesized: Synthesized, name: str) -> str:
    return synthesized.logical_id(synthesized.stack.functions.functions[name])


def _tick(target: dict[str, Any]) -> ScheduleTick:
    """The target input as the function will receive it: Scheduler fills in the scheduled time."""
    payload = target["Input"].replace(SCHEDULED_TIME, "2026-11-23T14:00:00Z")
    return ScheduleTick.model_validate(json.loads(payload))


def test_one_schedule_per_window_with_its_cron_and_time_zone(synthesized: Synthesized) -> None:
    schedules = _schedules(synthesized)
    assert len(schedules) == len(synthesized.config.scaling_windows) + 2
    for window in synthesized.config.scaling_windows:
        schedule = schedules[schedule_name(window.name)]
        assert schedule["ScheduleExpression"] == window.schedule
        assert schedule["ScheduleExpressionTimezone"] == window.timezone
        assert schedule["Target"]["Arn"] == {"Fn::GetAtt": [_function_id(synthesized, "prewarm"), "Arn"]}
        tick = _tick(schedule["Target"])
        assert (tick.trigger, tick.window) == ("window", window.name)
        assert tick.scheduled_time == datetime(2026, 11, 23, 14, tzinfo=UTC)
    assert {
        schedules[schedule_name(w.name)]["ScheduleExpressionTimezone"] for w in synthesized.config.scaling_windows
    } == {"America/New_York", "Asia/Tokyo"}


def test_rate_ticks_for_prewarm_and_consolidate(synthesized: Synthesized) -> None:
    schedules = _schedules(synthesized)
    for name, expression in (("prewarm", "rate(5 minutes)"), ("consolidate", "rate(1 minute)")):
        schedule = schedules[f"{name}-rate"]
        assert schedule["ScheduleExpression"] == expression
        assert schedule["Target"]["Arn"] == {"Fn::GetAtt": [_function_id(synthesized, name), "Arn"]}
        tick = _tick(schedule["Target"])
        assert (tick.trigger, tick.window) == ("rate", None)


def test_every_schedule_retries_and_dead_letters(synthesized: Synthesized) -> None:
    dlq_id = synthesized.logical_id(synthesized.stack.queues.scheduler_dlq)
    group = synthesized.stack.schedules.group.name
    for schedule in _schedules(synthesized).values():
        assert schedule["GroupName"] == group
        assert schedule["FlexibleTimeWindow"] == {"Mode": "OFF"}
        retry = schedule["Target"]["RetryPolicy"]
        assert retry["MaximumRetryAttempts"] >= 1 and 60 <= retry["MaximumEventAgeInSeconds"] <= 86400
        assert schedule["Target"]["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [dlq_id, "Arn"]}}


INTENDED_TICK_RETRY = {"prewarm": (2, 900), "consolidate": (0, 60)}
"""(retries, maximum age in seconds) of each scheduled function's ticks: a window's tick (prewarm) is retried as often
as Lambda allows and kept 15 minutes; a consolidation tick older than its minute is superseded by the next one."""


def test_each_scheduled_functions_async_invoke_config_holds_its_ticks_retries(synthesized: Synthesized) -> None:
    """Scheduler invokes Lambda asynchronously ("When you set up EventBridge Scheduler with Lambda, EventBridge
    Scheduler invokes your Lambda function asynchronously"): a failed tick is retried by the function's
    EventInvokeConfig, not by the schedule's RetryPolicy, which only covers delivering the invocation."""
    configs = {c["Properties"]["FunctionName"]["Ref"]: c["Properties"]
               for c in synthesized.of_type("AWS::Lambda::EventInvokeConfig").values()}  # fmt: skip
    functions = {_function_id(synthesized, name): name for name in INTENDED_TICK_RETRY}
    for name, schedule in _schedules(synthesized).items():
        function = functions[schedule["Target"]["Arn"]["Fn::GetAtt"][0]]
        retries, age = INTENDED_TICK_RETRY[function]
        config = configs[_function_id(synthesized, function)]
        assert (config["MaximumRetryAttempts"], config["MaximumEventAgeInSeconds"]) == (retries, age), name
        assert schedule["Target"]["RetryPolicy"]["MaximumEventAgeInSeconds"] == age, name


def test_scheduler_role_may_only_invoke_the_two_functions(synthesized: Synthesized) -> None:
    role = synthesized.stack.schedules.role
    role_id = synthesized.logical_id(role)
    assume = synthesized.resources[role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [s["Principal"] for s in assume] == [{"Service": "scheduler.amazonaws.com"}]
    assert assume[0]["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    [policy] = [p for p in synthesized.of_type("AWS::IAM::Policy").values()
                if p["Properties"]["Roles"] == [{"Ref": role_id}]]  # fmt: skip
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    by_action = {s["Action"]: s["Resource"] for s in statements}
    assert set(by_action) == {"lambda:InvokeFunction", "sqs:SendMessage"}
    assert by_action["lambda:InvokeFunction"] == [
        {"Fn::GetAtt": [_function_id(synthesized, "prewarm"), "Arn"]},
        {"Fn::GetAtt": [_function_id(synthesized, "consolidate"), "Arn"]},
    ]
    assert by_action["sqs:SendMessage"] == {
        "Fn::GetAtt": [synthesized.logical_id(synthesized.stack.queues.scheduler_dlq), "Arn"]
    }


def test_long_window_names_fit_the_schedule_name_limit() -> None:
    name = schedule_name("w" * 64)
    assert len(name) <= 64 and name.startswith("window-")
    assert schedule_name("w" * 64) != schedule_name("w" * 63 + "x")

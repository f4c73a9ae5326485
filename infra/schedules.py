"""EventBridge Scheduler: a schedule per scaling window, and the rate ticks of pre-warm and consolidation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Aws
from aws_cdk import aws_iam as iam
from aws_cdk import aws_scheduler as scheduler
from constructs import Construct

from gpu_autoscaler.wiring import (
    RATE_SCHEDULES,
    SCHEDULE_DELIVERY_RETRIES,
    SCHEDULED_TIME,
    RateSchedule,
    schedule_name,
    tick_input,
    tick_retry,
)

if TYPE_CHECKING:
    from aws_cdk import aws_lambda as lambda_
    from aws_cdk import aws_sqs as sqs

    from gpu_autoscaler.config import ScalingWindow
    from gpu_autoscaler.naming import ResourceNames

__all__ = ["RATE_SCHEDULES", "SCHEDULED_TIME", "RateSchedule", "Schedules", "schedule_name", "tick_input"]


class Schedules(Construct):
    """The schedules, their group, and the role Scheduler assumes to invoke the two scheduled functions."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        names: ResourceNames,
        windows: list[ScalingWindow],
        functions: dict[str, lambda_.IFunction],
        dead_letter_queue: sqs.IQueue,
    ) -> None:
        super().__init__(scope, construct_id)
        self.group = scheduler.CfnScheduleGroup(self, "Group", name=names.schedule_group())
        targets = {"prewarm": functions["prewarm"], "consolidate": functions["consolidate"]}
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}
            ),
            description="EventBridge Scheduler: invoke the prewarm and consolidate functions, nothing else",
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["lambda:InvokeFunction"], resources=[fn.function_arn for fn in targets.values()]
            )
        )
        # Scheduler delivers dead-letter events with the schedule's execution role.
        self.role.add_to_policy(
            iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[dead_letter_queue.queue_arn])
        )
        self._dlq_arn = dead_letter_queue.queue_arn
        self._targets = targets
        self.schedules: dict[str, scheduler.CfnSchedule] = {}
        for window in windows:
            self._schedule(
                f"Window{len(self.schedules)}",
                name=schedule_name(window.name),
                expression=window.schedule,
                timezone=window.timezone,
                function="prewarm",
                payload=tick_input(window.name),
                description=f"scaling window {window.name}: warm pool {window.node_pool} for "
                f"{int(window.duration.total_seconds() // 60)} min",
            )
        for rate in RATE_SCHEDULES:
            self._schedule(
                f"{rate.function.title()}Rate",
                name=rate.name,
                expression=rate.expression,
                timezone=None,
                function=rate.function,
                payload=tick_input(None),
                description=f"{rate.function} tick",
            )

    def _schedule(
        self,
        construct_id: str,
        *,
        name: str,
        expression: str,
        timezone: str | None,
        function: str,
        payload: str,
        description: str,
    ) -> None:
        """The RetryPolicy covers only Scheduler's delivery of the tick to Lambda, which invokes asynchronously: a
        failed run is Lambda's to retry, by the function's EventInvokeConfig (`gpu_autoscaler.wiring.TickRetry`);
        a tick is delivered no later than the function would still run it."""
        schedule = scheduler.CfnSchedule(
            self,
            construct_id,
            name=name,
            group_name=self.group.name,
            description=description,
            schedule_expression=expression,
            schedule_expression_timezone=timezone,
            flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
            target=scheduler.CfnSchedule.TargetProperty(
                arn=self._targets[function].function_arn,
                role_arn=self.role.role_arn,
                input=payload,
                retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                    maximum_retry_attempts=SCHEDULE_DELIVERY_RETRIES,
                    maximum_event_age_in_seconds=tick_retry(function).max_event_age_seconds,
                ),
                dead_letter_config=scheduler.CfnSchedule.DeadLetterConfigProperty(arn=self._dlq_arn),
            ),
        )
        schedule.node.add_dependency(self.group)
        self.schedules[name] = schedule

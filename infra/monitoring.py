"""Alarms on everything that means work was lost or failed, and one dashboard of the pipeline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from gpu_autoscaler.wiring import FUNCTION_WIRING

if TYPE_CHECKING:
    from aws_cdk import aws_lambda as lambda_
    from aws_cdk import aws_sqs as sqs

    from gpu_autoscaler.naming import ResourceNames

__all__ = ["Monitoring"]

_PERIOD = Duration.minutes(1)


class Monitoring(Construct):
    """Any message in a DLQ, and any function error, is an alarm: both mean a decision did not happen."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        names: ResourceNames,
        functions: dict[str, lambda_.Function],
        queues: dict[str, sqs.Queue],
        dead_letter_queues: dict[str, sqs.Queue],
    ) -> None:
        super().__init__(scope, construct_id)
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for label, dlq in dead_letter_queues.items():
            self.alarms[f"dlq-{label}"] = self._any_above_zero(
                f"{_camel(label)}DlqNotEmpty",
                alarm_name=names.alarm(f"{label}-dlq-not-empty"),
                alarm_description=f"Messages in the {label} dead-letter queue: look at them, fix, redrive.",
                metric=dlq.metric_approximate_number_of_messages_visible(period=_PERIOD, statistic="Maximum"),
            )
        for name, function in functions.items():
            self.alarms[f"errors-{name}"] = self._any_above_zero(
                f"{_camel(name)}Errors",
                alarm_name=names.alarm(f"{name}-errors"),
                alarm_description=f"The {name} function failed (uncaught error or timeout).",
                metric=function.metric_errors(period=_PERIOD, statistic="Sum"),
            )
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=names.dashboard)
        fns = list(functions.items())
        self.dashboard.add_widgets(
            _graph("Invocations", [f.metric_invocations(label=n) for n, f in fns]),
            _graph("Errors", [f.metric_errors(label=n) for n, f in fns]),
            _graph("Throttles", [f.metric_throttles(label=n) for n, f in fns]),
            _graph("Duration p99 (ms)", [f.metric_duration(label=n, statistic="p99") for n, f in fns]),
        )
        work = list(queues.items())
        dead = list(dead_letter_queues.items())
        fed = [name for name in functions if FUNCTION_WIRING[name].queue is not None]
        self.dashboard.add_widgets(
            # The handlers' own count (Powertools metrics, dimension `service`): a partial batch failure is no
            # Lambda error, so this is the one sign of records going back to their queue before a DLQ has any.
            _graph("Records back to the queue", [
                cloudwatch.Metric(namespace=names.metrics_namespace, metric_name="RecordsFailed",
                                  dimensions_map={"service": name}, statistic="Sum", label=name) for name in fed]),
        )
        self.dashboard.add_widgets(
            _graph("Queue depth", [q.metric_approximate_number_of_messages_visible(label=n) for n, q in work]),
            _graph("Oldest message (s)", [q.metric_approximate_age_of_oldest_message(label=n) for n, q in work]),
            _graph(
                "Dead-letter queues",
                [q.metric_approximate_number_of_messages_visible(label=n, statistic="Maximum") for n, q in dead],
            ),
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values()), width=6),
        )

    def _any_above_zero(
        self, construct_id: str, *, alarm_name: str, alarm_description: str, metric: cloudwatch.IMetric
    ) -> cloudwatch.Alarm:
        """One breaching minute is enough: every alarm here counts things that should never happen."""
        return cloudwatch.Alarm(
            self,
            construct_id,
            alarm_name=alarm_name,
            alarm_description=alarm_description,
            metric=metric,
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )


def _graph(title: str, metrics: list[cloudwatch.IMetric]) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(title=title, left=metrics, width=6, period=_PERIOD)


def _camel(label: str) -> str:
    return "".join(part.title() for part in label.split("-"))

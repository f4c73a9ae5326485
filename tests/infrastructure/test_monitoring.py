"""Alarms on every DLQ and every function's errors, and the dashboard."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.naming import FUNCTIONS

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized


def _alarms(synthesized: Synthesized) -> list[dict]:
    return [a["Properties"] for a in synthesized.of_type("AWS::CloudWatch::Alarm").values()]


def test_every_dlq_alarms_on_its_first_message(synthesized: Synthesized) -> None:
    dlqs = {synthesized.logical_id(q) for q in synthesized.stack.queues.all_dead_letter_queues.values()}
    assert len(dlqs) == 5
    watched = set()
    for alarm in _alarms(synthesized):
        if alarm["MetricName"] == "ApproximateNumberOfMessagesVisible":
            assert alarm["Namespace"] == "AWS/SQS"
            assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")
            [dimension] = alarm["Dimensions"]
            watched.add(dimension["Value"]["Fn::GetAtt"][0])
    assert watched == dlqs


def test_every_function_alarms_on_errors(synthesized: Synthesized) -> None:
    functions = {synthesized.logical_id(f): n for n, f in synthesized.stack.functions.functions.items()}
    watched = set()
    for alarm in _alarms(synthesized):
        if alarm["MetricName"] == "Errors":
            assert alarm["Namespace"] == "AWS/Lambda" and alarm["Statistic"] == "Sum"
            assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")
            [dimension] = alarm["Dimensions"]
            watched.add(functions[dimension["Value"]["Ref"]])
    assert watched == set(FUNCTIONS)


def test_one_dashboard(synthesized: Synthesized) -> None:
    assert len(synthesized.of_type("AWS::CloudWatch::Dashboard")) == 1


def test_the_dashboard_graphs_the_records_each_queue_fed_function_sent_back(synthesized: Synthesized) -> None:
    """A partial batch failure is no Lambda error, so the handlers' own `RecordsFailed` count is the one signal of
    records going back to their queue before any reaches a dead-letter queue."""
    import json

    from gpu_autoscaler.wiring import FUNCTION_WIRING

    [dashboard] = synthesized.of_type("AWS::CloudWatch::Dashboard").values()
    body = dashboard["Properties"]["DashboardBody"]
    text = "".join(part if isinstance(part, str) else json.dumps(part) for part in body["Fn::Join"][1])
    fed = sorted(name for name, wiring in FUNCTION_WIRING.items() if wiring.queue is not None)
    assert fed == ["drain", "fleet", "interruption", "packer"]
    for name in fed:
        assert f'["GpuAutoscaler","RecordsFailed","service","{name}"' in text

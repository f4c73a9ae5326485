"""Alarms on every DLQ and every function's errors, and the dashboard."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.naming import FUNCTIONS, ResourceNames
from infra.monitoring import ALARM_EMAIL_CONTEXT
from tests.infrastructure.conftest import infrastructure_config_data, synthesize

if TYPE_CHECKING:
    from pathlib import Path

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


def test_every_alarm_notifies_the_alarm_topic_on_alarm_and_ok(synthesized: Synthesized) -> None:
    """An alarm with no action notifies no one: each publishes to the stack's topic when it fires and clears."""
    [topic_id] = synthesized.of_type("AWS::SNS::Topic")
    alarms = _alarms(synthesized)
    assert alarms
    for alarm in alarms:
        assert alarm["AlarmActions"] == [{"Ref": topic_id}], alarm["AlarmName"]
        assert alarm["OKActions"] == [{"Ref": topic_id}], alarm["AlarmName"]


def test_the_alarm_topic_takes_only_tls_and_cloudwatchs_publishing(synthesized: Synthesized) -> None:
    """cdk-nag's AwsSolutions-SNS3: a topic policy denying publishers that do not use TLS (aws:SecureTransport).
    A topic policy replaces SNS's default one, so it also lets CloudWatch publish for this stack's alarms only."""
    [topic_id] = synthesized.of_type("AWS::SNS::Topic")
    [policy] = synthesized.of_type("AWS::SNS::TopicPolicy").values()
    assert policy["Properties"]["Topics"] == [{"Ref": topic_id}]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in statements)
    [allow] = [s for s in statements if s["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "cloudwatch.amazonaws.com"} and allow["Action"] == "sns:Publish"
    alarms = {key for key, value in synthesized.resources.items() if value["Type"] == "AWS::CloudWatch::Alarm"}
    assert {arn["Fn::GetAtt"][0] for arn in allow["Condition"]["ArnEquals"]["aws:SourceArn"]} == alarms
    assert allow["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert not [m for m in synthesized.messages if "AwsSolutions-SNS" in m["text"] and m["level"] == "error"]


def test_an_alarm_email_from_the_context_subscribes_to_the_topic(tmp_path: Path) -> None:
    app_context = {ALARM_EMAIL_CONTEXT: "ops@example.com"}
    synthesized = synthesize(infrastructure_config_data(), tmp_path, extra_context=app_context)
    [topic_id] = synthesized.of_type("AWS::SNS::Topic")
    [subscription] = synthesized.of_type("AWS::SNS::Subscription").values()
    assert subscription["Properties"] == {"Protocol": "email", "Endpoint": "ops@example.com",
                                          "TopicArn": {"Ref": topic_id}}


def test_without_an_alarm_email_the_topic_has_no_subscription_and_is_an_output(synthesized: Synthesized) -> None:
    assert synthesized.of_type("AWS::SNS::Subscription") == {}
    [topic_id] = synthesized.of_type("AWS::SNS::Topic")
    assert synthesized.outputs["AlarmTopicArn"]["Value"] == {"Ref": topic_id}


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
    namespace = ResourceNames(synthesized.config.cluster_name).metrics_namespace
    for name in fed:
        assert f'["{namespace}","RecordsFailed","service","{name}"' in text


def test_refused_pod_events_alarm_on_the_functions_that_post_them(synthesized: Synthesized) -> None:
    """Events are best effort: a packer or drain whose Events the API server refuses (401, 403: the access entry or
    the RBAC binding is missing) goes on with its work and counts `PodEventsRefused`, so no Errors alarm fires; this
    one does, for a missing grant that otherwise shows only in the log."""
    namespace = ResourceNames(synthesized.config.cluster_name).metrics_namespace
    watched = set()
    for alarm in _alarms(synthesized):
        if alarm["MetricName"] == "PodEventsRefused":
            assert alarm["Namespace"] == namespace and alarm["Statistic"] == "Sum"
            assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")
            [dimension] = alarm["Dimensions"]
            assert dimension["Name"] == "service"
            watched.add(dimension["Value"])
    assert watched == {"packer", "drain"}

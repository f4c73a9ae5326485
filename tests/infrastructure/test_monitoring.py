"""Alarms on every DLQ and every function's errors, on what the functions count that fails nothing, and the
dashboard.

The functions' own metrics are checked end to end: a handler is imported as Lambda imports it, with the variables
the stack gives its function, its metric code run, and the EMF it prints read back (`tests.emf`); an alarm watches
a metric only when its namespace, name and dimensions are exactly those of a series the handler emits.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.naming import FUNCTIONS, ResourceNames
from infra.monitoring import ALARM_EMAIL_CONTEXT
from tests.conftest import ROOT
from tests.emf import emitted
from tests.infrastructure.conftest import infrastructure_config_data, synthesize

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path
    from types import ModuleType

    from tests.emf import Emitted
    from tests.infrastructure.conftest import Synthesized


def _alarms(synthesized: Synthesized) -> list[dict]:
    return [a["Properties"] for a in synthesized.of_type("AWS::CloudWatch::Alarm").values()]


def _custom_alarms(synthesized: Synthesized) -> dict[tuple[str, frozenset[tuple[str, str]]], dict[str, Any]]:
    """The alarms on the functions' own namespace, by (metric, dimensions)."""
    namespace = ResourceNames(synthesized.config.cluster_name).metrics_namespace
    return {(a["MetricName"], frozenset((d["Name"], d["Value"]) for d in a.get("Dimensions", []))): a
            for a in _alarms(synthesized) if a.get("Namespace") == namespace}


def _alarmed(synthesized: Synthesized, metrics: list[Emitted]) -> list[Emitted]:
    """The metrics, among those emitted above zero, that an alarm of the stack watches (Sum > 0)."""
    watched = _custom_alarms(synthesized)
    namespace = ResourceNames(synthesized.config.cluster_name).metrics_namespace
    return [m for m in metrics if m.value > 0 and m.namespace == namespace and (m.name, m.dimensions) in watched]


@pytest.fixture
def handler_module(synthesized: Synthesized, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], ModuleType]]:
    """A function's handler imported as Lambda imports it, under the variables the stack gives that function."""
    loaded: list[str] = []

    def load(function: str) -> ModuleType:
        resource = synthesized.resources[synthesized.logical_id(synthesized.stack.functions.functions[function])]
        for key, value in resource["Properties"]["Environment"]["Variables"].items():
            if isinstance(value, str):
                monkeypatch.setenv(key, value)
        monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
        name = f"monitoring_test_{function}_handler"
        spec = importlib.util.spec_from_file_location(name, ROOT / "functions" / function / "handler.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        loaded.append(name)
        spec.loader.exec_module(module)
        return module

    yield load
    for name in loaded:
        sys.modules.pop(name, None)


def _statically_emitted() -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """(metric, dimensions) of each handler's `metrics.add_metric(name=...)` under its `Metrics(service=)`, and
    `RecordsFailed` of each handler that reports partial batch failures (`batch_failures.report_failures`)."""
    found: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for path in sorted((ROOT / "functions").glob("*/handler.py")):
        tree = ast.parse(path.read_text())
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
        services = [str(k.value.value) for c in calls if getattr(c.func, "id", None) == "Metrics"
                    for k in c.keywords if k.arg == "service" and isinstance(k.value, ast.Constant)]
        if not services:  # the teardown hook's: CloudFormation shows its failure, it publishes no metric
            continue
        [service] = services
        for call in calls:
            if (isinstance(call.func, ast.Attribute) and call.func.attr == "add_metric"
                    and getattr(call.func.value, "id", None) == "metrics"):
                for keyword in call.keywords:
                    if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                        found.add((str(keyword.value.value), frozenset({("service", service)})))
        if any(getattr(c.func, "id", None) == "report_failures" for c in calls):
            found.add(("RecordsFailed", frozenset({("service", service)})))
    return found


def test_every_alarm_on_the_functions_metrics_names_a_series_a_handler_emits(synthesized: Synthesized) -> None:
    """An alarm whose name or dimensions differ from the emitted series by a letter watches a series that never
    has data, and missing data is not breaching: it would stay OK for ever."""
    emits = _statically_emitted()
    alarms = _custom_alarms(synthesized)
    assert alarms
    for key in alarms:
        assert key in emits, f"{key[0]} {dict(key[1])} is no series a handler emits"


def test_every_dlq_alarms_on_its_first_message(synthesized: Synthesized) -> None:
    dlqs = {synthesized.logical_id(q) for q in synthesized.stack.queues.all_dead_letter_queues.values()}
    assert len(dlqs) == 5
    watched = set()
    for alarm in _alarms(synthesized):
        if alarm.get("MetricName") == "ApproximateNumberOfMessagesVisible":
            assert alarm["Namespace"] == "AWS/SQS"
            assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")
            [dimension] = alarm["Dimensions"]
            watched.add(dimension["Value"]["Fn::GetAtt"][0])
    assert watched == dlqs


def test_every_function_alarms_on_errors(synthesized: Synthesized) -> None:
    functions = {synthesized.logical_id(f): n for n, f in synthesized.stack.functions.functions.items()}
    watched = set()
    for alarm in _alarms(synthesized):
        if alarm.get("MetricName") == "Errors":
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
    A topic policy replaces SNS's default one, so it also lets CloudWatch publish: for the alarms of this account
    and region named under the deployment's prefix, the stack's and any an operator adds under it (an alarm the
    policy does not admit gets "not authorized to perform: SNS:Publish" in its history, and nobody hears it)."""
    import fnmatch

    [topic_id] = synthesized.of_type("AWS::SNS::Topic")
    [policy] = synthesized.of_type("AWS::SNS::TopicPolicy").values()
    assert policy["Properties"]["Topics"] == [{"Ref": topic_id}]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in statements)
    [allow] = [s for s in statements if s["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "cloudwatch.amazonaws.com"} and allow["Action"] == "sns:Publish"
    assert set(allow["Condition"]) == {"ArnLike", "StringEquals"}
    separator, parts = allow["Condition"]["ArnLike"]["aws:SourceArn"]["Fn::Join"]
    arn = separator.join(p if isinstance(p, str) else "{" + p["Ref"] + "}" for p in parts)
    names = ResourceNames(synthesized.config.cluster_name)
    assert arn == f"arn:{{AWS::Partition}}:cloudwatch:{{AWS::Region}}:{{AWS::AccountId}}:alarm:{names.prefix}-*"
    pattern = arn.rsplit(":", 1)[1]
    for alarm in _alarms(synthesized):
        assert fnmatch.fnmatchcase(alarm["AlarmName"], pattern), alarm["AlarmName"]
    assert fnmatch.fnmatchcase(names.alarm("fleet-throttles"), pattern)  # one an operator adds
    assert not fnmatch.fnmatchcase(ResourceNames(f"{synthesized.config.cluster_name}x").alarm("errors"), pattern)
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
        if alarm.get("MetricName") == "PodEventsRefused":
            assert alarm["Namespace"] == namespace and alarm["Statistic"] == "Sum"
            assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")
            [dimension] = alarm["Dimensions"]
            assert dimension["Name"] == "service"
            watched.add(dimension["Value"])
    assert watched == {"packer", "drain"}


def test_a_launch_ec2_refuses_for_a_non_capacity_reason_alarms(
        synthesized: Synthesized, handler_module: Callable[[str], ModuleType],
        capsys: pytest.CaptureFixture[str]) -> None:
    """EC2 refusing a launch for a reason no retry or other offering mends (UnauthorizedOperation: a PassRole or
    launch-template grant missing; an invalid parameter or launch template; the Spot service-linked role) ends the
    claim and releases its pods with no Lambda error and no dead letter: the handler's `LaunchesRefused` is the
    one sign, so an alarm watches it. A claim that found no capacity (Spot's normal weather) counts 0 there."""
    from gpu_autoscaler.services.fleet import FailedClaim, LaunchOutcome

    fleet = handler_module("fleet")
    capsys.readouterr()
    no_capacity = FailedClaim("c2", "could not launch: InsufficientInstanceCapacity",
                              "InsufficientInstanceCapacity", ("pod-2",))
    fleet.record_metrics(LaunchOutcome(cluster="ml-prod", requested=("c2",), failed=[no_capacity]))
    fleet.metrics.flush_metrics()
    assert not _alarmed(synthesized, emitted(capsys.readouterr().out))

    refused = FailedClaim("c1", "EC2 refused the launch: UnauthorizedOperation You are not authorized",
                          "UnauthorizedOperation", ("pod-1",), refused=True)
    fleet.record_metrics(LaunchOutcome(cluster="ml-prod", requested=("c1",), failed=[refused]))
    fleet.metrics.flush_metrics()
    metrics = emitted(capsys.readouterr().out)
    [alarmed] = _alarmed(synthesized, metrics)
    assert (alarmed.name, dict(alarmed.dimensions), alarmed.value) == ("LaunchesRefused", {"service": "fleet"}, 1)
    alarm = _custom_alarms(synthesized)[(alarmed.name, alarmed.dimensions)]
    assert alarm["Statistic"] == "Sum"
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")


def test_the_dashboard_graphs_launches_and_their_failures_by_reason(synthesized: Synthesized) -> None:
    """Whether capacity flows at all, at a glance: claims launched, launches refused, nodes that never joined, and
    every failure by its reason (a SEARCH over the `reason` dimension: EC2's error codes, not known in advance)."""
    [dashboard] = synthesized.of_type("AWS::CloudWatch::Dashboard").values()
    body = dashboard["Properties"]["DashboardBody"]
    text = "".join(part if isinstance(part, str) else json.dumps(part) for part in body["Fn::Join"][1])
    namespace = ResourceNames(synthesized.config.cluster_name).metrics_namespace
    assert f'["{namespace}","ClaimsLaunched","service","fleet"' in text
    assert f'["{namespace}","LaunchesRefused","service","fleet"' in text
    assert f'["{namespace}","RegistrationTimeouts","service","consolidate"' in text
    search = f"""SEARCH('{{"{namespace}",reason,service}} MetricName="LaunchFailures"', 'Sum', 60)"""
    assert json.dumps(search) in text  # the widget's expression, as the body's JSON writes it


def test_a_node_that_never_joins_alarms(
        synthesized: Synthesized, handler_module: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An instance whose node never registers or initializes (no access entry for the node role, user data, a
    security group, no GPU Operator) is terminated after `timeouts.registrationTtl` and its pods planned again, onto
    a new instance with the same fate: a tick that succeeds, no dead letter, one GPU instance billed for nothing
    each time. The consolidate handler's `RegistrationTimeouts` is the one sign, so an alarm watches it (Karpenter
    sets its NodePool's NodeRegistrationHealthy False for the same: pkg/controllers/nodeclaim/lifecycle/liveness.go)."""
    from types import SimpleNamespace

    from gpu_autoscaler.lambda_context import local_context

    consolidate = handler_module("consolidate")
    capsys.readouterr()
    outcome = SimpleNamespace(
        reconcile=SimpleNamespace(registered=[], timed_out=["claim-1"], collected=None), saving=0.0, proposed=[],
        rejected=[], by_reason=dict, summary=lambda: {"timedOut": ["claim-1"]}, gpu_pods_unschedulable=0,
        api_failure=None)
    monkeypatch.setattr(consolidate, "lease", lambda: SimpleNamespace(run_invocation=lambda context, run: outcome))
    consolidate.handler({"trigger": "rate", "scheduledTime": "2026-11-29T15:00:00Z"},
                        local_context("ml-prod-gpu-autoscaler-consolidate"))
    [alarmed] = _alarmed(synthesized, emitted(capsys.readouterr().out))
    assert (alarmed.name, dict(alarmed.dimensions), alarmed.value) == (
        "RegistrationTimeouts", {"service": "consolidate"}, 1)
    alarm = _custom_alarms(synthesized)[(alarmed.name, alarmed.dimensions)]
    assert alarm["Statistic"] == "Sum"
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")


def test_ticks_that_cannot_reach_the_kubernetes_api_five_minutes_running_alarm(
        synthesized: Synthesized, handler_module: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A tick that cannot reach the Kubernetes API ends normally (the next tick is the retry), so neither the Errors
    alarm nor any count sees it; an endpoint the functions never reach (private only, or `publicAccessCidrs` that
    leave Lambda's addresses out) looks the same for ever: no registration, consolidation or garbage collection,
    every GPU node billed after its work ends. The tick counts `KubernetesUnreachable`, alarmed five minutes
    running, so a short outage still only skips."""
    from types import SimpleNamespace

    from gpu_autoscaler.domain.consolidation_models import ConsolidationResult
    from gpu_autoscaler.lambda_context import local_context
    from gpu_autoscaler.services.consolidate import ConsolidateOutcome
    from gpu_autoscaler.services.reconcile import ReconcileOutcome

    consolidate = handler_module("consolidate")
    for failure in (None, "Kubernetes API unreachable: GET /api/v1/nodes: ConnectTimeoutError"):
        capsys.readouterr()
        outcome = ConsolidateOutcome(ReconcileOutcome(), ConsolidationResult(), api_failure=failure)
        lease = SimpleNamespace(run_invocation=lambda context, run, result=outcome: result)
        monkeypatch.setattr(consolidate, "lease", lambda lease=lease: lease)
        consolidate.handler({"trigger": "rate", "scheduledTime": "2026-11-29T15:00:00Z"},
                            local_context("ml-prod-gpu-autoscaler-consolidate"))
        alarmed = _alarmed(synthesized, emitted(capsys.readouterr().out))
        if failure is None:
            assert alarmed == []
    [unreachable] = alarmed
    assert (unreachable.name, dict(unreachable.dimensions), unreachable.value) == (
        "KubernetesUnreachable", {"service": "consolidate"}, 1)
    alarm = _custom_alarms(synthesized)[(unreachable.name, unreachable.dimensions)]
    assert (alarm["Statistic"], alarm["Period"], alarm["Threshold"]) == ("Sum", 60, 0)
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (5, 5)
    assert alarm["TreatMissingData"] == "notBreaching"


def test_an_instance_that_lost_our_ownership_tag_alarms(
        synthesized: Synthesized, handler_module: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A live claim's instance that EC2 still has without `gpu-autoscaler/cluster=<cluster>`
    (re-tagged or untagged by someone) is left alone by the garbage collector, and nothing of this cluster can end
    it any more (IAM's ResourceTag condition): it runs and bills until someone puts the tag back. The consolidate
    handler counts it as `OwnershipTagLost`, and an alarm watches that."""
    from types import SimpleNamespace

    from gpu_autoscaler.lambda_context import local_context
    from gpu_autoscaler.services.garbage_collection import CollectionOutcome

    consolidate = handler_module("consolidate")
    capsys.readouterr()
    collected = CollectionOutcome(ownership_lost=["i-0123456789abcdef0"])
    outcome = SimpleNamespace(
        reconcile=SimpleNamespace(registered=[], timed_out=[], collected=collected), saving=0.0, proposed=[],
        rejected=[], by_reason=dict, summary=lambda: {}, gpu_pods_unschedulable=0, api_failure=None)
    monkeypatch.setattr(consolidate, "lease", lambda: SimpleNamespace(run_invocation=lambda context, run: outcome))
    consolidate.handler({"trigger": "rate", "scheduledTime": "2026-11-29T15:00:00Z"},
                        local_context("ml-prod-gpu-autoscaler-consolidate"))
    [alarmed] = _alarmed(synthesized, emitted(capsys.readouterr().out))
    assert (alarmed.name, dict(alarmed.dimensions), alarmed.value) == (
        "OwnershipTagLost", {"service": "consolidate"}, 1)
    alarm = _custom_alarms(synthesized)[(alarmed.name, alarmed.dimensions)]
    assert (alarm["Statistic"], alarm["Threshold"], alarm["ComparisonOperator"]) == ("Sum", 0, "GreaterThanThreshold")


def test_the_interruption_and_pending_pods_queues_alarm_on_their_oldest_message(synthesized: Synthesized) -> None:
    """A Spot warning gives two minutes; the DLQ alarm hears of a record only after maxReceiveCount deliveries
    (15 to 30 minutes, and up to 15 more before an idle DLQ's metrics resume). Messages no invocation takes (the
    function throttled, its event source mapping disabled) or that wait behind a failing one in the packer's single
    FIFO group only age: the queue's ApproximateAgeOfOldestMessage says so within a minute or three. Missing data
    (an idle queue publishes none: SQS developer guide) is no breach."""
    queues = {kind.value: synthesized.logical_id(queue) for kind, queue in synthesized.stack.queues.queues.items()}
    by_queue = {}
    for alarm in _alarms(synthesized):
        if alarm.get("MetricName") == "ApproximateAgeOfOldestMessage":
            [dimension] = alarm["Dimensions"]
            assert dimension["Name"] == "QueueName"
            by_queue[dimension["Value"]["Fn::GetAtt"][0]] = alarm
    assert set(by_queue) == {queues["interruption"], queues["pending-pods"]}
    thresholds = {}
    for name in ("interruption", "pending-pods"):
        alarm = by_queue[queues[name]]
        assert (alarm["Namespace"], alarm["Statistic"], alarm["Period"]) == ("AWS/SQS", "Maximum", 60)
        assert alarm["ComparisonOperator"] == "GreaterThanThreshold" and alarm["EvaluationPeriods"] == 1
        assert alarm["TreatMissingData"] == "notBreaching"
        thresholds[name] = alarm["Threshold"]
    assert thresholds == {"interruption": 60, "pending-pods": 180}


def test_interruption_records_handed_back_two_minutes_running_alarm(synthesized: Synthesized) -> None:
    """A record the interruption function hands back (partial batch failure: no Lambda error) comes back after
    10 s and 40 s, so it has been received three times within a minute: from then on SQS leaves it out of
    ApproximateAgeOfOldestMessage (SQS developer guide, "Available CloudWatch metrics for Amazon SQS": a
    poison-pill message's age is not included), and the age alarm cannot see it. `RecordsFailed` can: failures in
    two minutes running mean a record that keeps failing, not one duplicate notice found in progress once."""
    alarm = _custom_alarms(synthesized)[("RecordsFailed", frozenset({("service", "interruption")}))]
    assert alarm["Statistic"] == "Sum" and alarm["Period"] == 60
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (2, 2)
    assert alarm["TreatMissingData"] == "notBreaching"


def test_gpu_pods_waiting_while_the_agent_sends_nothing_alarm(
        synthesized: Synthesized, handler_module: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An agent not installed, crash-looping or refused by SQS leaves the pending-pods queue empty, which looks like
    a quiet cluster (an idle queue publishes no metrics at all). The consolidate tick lists the pods anyway and
    counts the GPU pods the scheduler found no node for, long enough that the agent must have reported them
    (`GpuPodsUnschedulable`); the alarm fires when there are some and nothing reached the pending-pods queue
    (NumberOfMessagesSent, missing taken as none), two periods running."""
    from types import SimpleNamespace

    from gpu_autoscaler.lambda_context import local_context

    consolidate = handler_module("consolidate")
    capsys.readouterr()
    outcome = SimpleNamespace(
        reconcile=SimpleNamespace(registered=[], timed_out=[], collected=None), saving=0.0, proposed=[], rejected=[],
        by_reason=dict, summary=dict, gpu_pods_unschedulable=2, api_failure=None)
    monkeypatch.setattr(consolidate, "lease", lambda: SimpleNamespace(run_invocation=lambda context, run: outcome))
    consolidate.handler({"trigger": "rate", "scheduledTime": "2026-11-29T15:00:00Z"},
                        local_context("ml-prod-gpu-autoscaler-consolidate"))
    [counted] = [m for m in emitted(capsys.readouterr().out) if m.name == "GpuPodsUnschedulable"]
    assert (dict(counted.dimensions), counted.value) == ({"service": "consolidate"}, 2)

    queue = synthesized.logical_id(synthesized.stack.queues.queues[next(
        k for k in synthesized.stack.queues.queues if k.value == "pending-pods")])
    [alarm] = [a for a in _alarms(synthesized) if "Metrics" in a]
    stats = {q["Id"]: q["MetricStat"] for q in alarm["Metrics"] if "MetricStat" in q}
    [expression] = [q for q in alarm["Metrics"] if "Expression" in q]
    assert expression["ReturnData"] is True
    by_name = {s["Metric"]["MetricName"]: (i, s) for i, s in stats.items()}
    pods_id, pods = by_name["GpuPodsUnschedulable"]
    assert pods["Metric"]["Namespace"] == counted.namespace
    assert {(d["Name"], d["Value"]) for d in pods["Metric"]["Dimensions"]} == set(counted.dimensions)
    assert pods["Stat"] == "Maximum"
    sent_id, sent = by_name["NumberOfMessagesSent"]
    assert sent["Metric"]["Namespace"] == "AWS/SQS" and sent["Stat"] == "Sum"
    assert sent["Metric"]["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue, "QueueName"]}}]
    assert expression["Expression"] == f"IF({pods_id} > 0 AND FILL({sent_id}, 0) == 0, 1, 0)"
    assert pods["Period"] == sent["Period"] == 180
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (2, 2)
    assert alarm["TreatMissingData"] == "notBreaching"

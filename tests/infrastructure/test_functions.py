"""The six functions: one loop, same runtime and layer, own role and log group, the settings contract."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import aws_cdk.aws_lambda as lambda_

from gpu_autoscaler.config import config_digest
from gpu_autoscaler.naming import FUNCTIONS, ResourceNames
from gpu_autoscaler.settings import FunctionSettings
from gpu_autoscaler.wiring import APPLICATION_LOG_LEVEL, FULL_VCPU_MB, FUNCTION_WIRING
from infra.functions import FUNCTION_SPECS
from infra.queues import WorkQueue
from tests.infrastructure.conftest import infrastructure_config_data, synthesize

if TYPE_CHECKING:
    import pytest

    from tests.infrastructure.conftest import Synthesized

COMMON_ENV = {"CONFIG_PARAMETER", "CONFIG_DIGEST", "TABLE_NAME", "LAUNCH_QUEUE_URL", "DRAIN_QUEUE_URL",
              "POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "OPENBLAS_NUM_THREADS",
              "POWERTOOLS_TRACER_CAPTURE_RESPONSE"}  # fmt: skip
LIBRARY_ENV = {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "OPENBLAS_NUM_THREADS",
               "POWERTOOLS_TRACER_CAPTURE_RESPONSE"}
"""Read by the libraries, not by `FunctionSettings`."""


def _function(synthesized: Synthesized, name: str) -> dict[str, Any]:
    props: dict[str, Any] = synthesized.resources[synthesized.logical_id(synthesized.stack.functions.functions[name])][
        "Properties"
    ]
    return props


def _newest_python() -> str:
    versions = [getattr(lambda_.Runtime, n).name for n in dir(lambda_.Runtime) if n.startswith("PYTHON_3_")]
    return max(versions, key=lambda v: tuple(int(p) for p in v.removeprefix("python").split(".")))


def test_six_functions_named_and_built_alike(synthesized: Synthesized) -> None:
    names = ResourceNames(synthesized.config.cluster_name)
    layer_id = synthesized.logical_id(synthesized.stack.layer.layer)
    teardown = synthesized.stack.teardown  # the deletion hook's handlers and the Provider framework's three
    hook = {synthesized.logical_id(f) for f in teardown.handlers.values()} | {
        k for k in synthesized.of_type("AWS::Lambda::Function") if k.startswith("TeardownProviderframework")}
    assert len(hook) == 5
    assert len(set(synthesized.of_type("AWS::Lambda::Function")) - hook) == len(FUNCTIONS) == 6
    for name in FUNCTIONS:
        props = _function(synthesized, name)
        assert props["FunctionName"] == names.function(name)
        assert props["Runtime"] == _newest_python()
        assert props["Architectures"] == ["arm64"]
        assert props["Handler"] == "handler.handler"
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert props["Layers"] == [{"Ref": layer_id}]


def test_one_layer_for_the_same_runtime_and_architecture(synthesized: Synthesized) -> None:
    [layer] = synthesized.of_type("AWS::Lambda::LayerVersion").values()
    assert layer["Properties"]["CompatibleRuntimes"] == [_newest_python()]
    assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]


def test_environment_is_the_settings_contract(synthesized: Synthesized) -> None:
    stack = synthesized.stack
    templates = {ct: synthesized.logical_id(t) for ct, t in stack.nodes.templates.items()}
    for spec in FUNCTION_SPECS:
        env = _function(synthesized, spec.name)["Environment"]["Variables"]
        expected = COMMON_ENV | ({"LAUNCH_TEMPLATE_ID", "LAUNCH_TEMPLATES"} if spec.name == "fleet" else set()) | (
            {"PENDING_PODS_DLQ_URL"} if spec.name == "packer" else set())
        assert set(env) == expected, spec.name
        assert env["CONFIG_PARAMETER"] == {"Ref": synthesized.logical_id(stack.parameter)}
        assert env["CONFIG_DIGEST"] == config_digest(synthesized.config.to_json())
        assert env["TABLE_NAME"] == {"Ref": synthesized.logical_id(stack.table)}
        assert env["LAUNCH_QUEUE_URL"] == {"Ref": synthesized.logical_id(stack.queues.queues[WorkQueue.LAUNCH])}
        assert env["DRAIN_QUEUE_URL"] == {"Ref": synthesized.logical_id(stack.queues.queues[WorkQueue.DRAIN])}
        assert env["POWERTOOLS_SERVICE_NAME"] == spec.name
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == ResourceNames(synthesized.config.cluster_name).metrics_namespace
        assert env["OPENBLAS_NUM_THREADS"] == "1"  # numpy's OpenBLAS starts no worker to spin through a cold start
        assert env["POWERTOOLS_TRACER_CAPTURE_RESPONSE"] == "false"  # no pod names, no subsegment over 64 KB
        if spec.name == "fleet":
            assert env["LAUNCH_TEMPLATE_ID"] == {"Ref": templates["on-demand"]}
            joined = json.dumps(env["LAUNCH_TEMPLATES"])
            assert all(logical in joined for logical in templates.values())
        settings_names = {f.alias for f in FunctionSettings.model_fields.values()}
        assert set(env) - LIBRARY_ENV <= settings_names


def _joined_json(value: dict[str, Any]) -> Any:
    """A `Stack.to_json_string` value as JSON, each intrinsic written `Ref:<logical>` or `GetAtt:<logical>.<attr>`."""
    parts = value["Fn::Join"][1]
    return json.loads("".join(
        p if isinstance(p, str) else f"Ref:{p['Ref']}" if "Ref" in p else "GetAtt:" + ".".join(p["Fn::GetAtt"])
        for p in parts))


def test_the_fleet_launches_the_version_each_template_last_got(synthesized: Synthesized) -> None:
    """CloudFormation adds a version on a template data change and leaves the default at 1 (infra/nodes.py): the
    fleet function is given each template's latest version number, so a change of it updates the function too."""
    env = _function(synthesized, "fleet")["Environment"]["Variables"]
    templates = {key: synthesized.logical_id(t) for key, t in synthesized.stack.nodes.templates.items()}
    assert _joined_json(env["LAUNCH_TEMPLATES"]) == {
        key: {"id": f"Ref:{logical}", "version": f"GetAtt:{logical}.LatestVersionNumber"}
        for key, logical in templates.items()}


def test_each_function_has_its_own_role_and_a_log_group_with_retention(synthesized: Synthesized) -> None:
    roles = {_function(synthesized, name)["Role"]["Fn::GetAtt"][0] for name in FUNCTIONS}
    assert len(roles) == 6
    groups = synthesized.of_type("AWS::Logs::LogGroup")
    for name in FUNCTIONS:
        props = _function(synthesized, name)
        group = groups[props["LoggingConfig"]["LogGroup"]["Ref"]]["Properties"]
        assert group["LogGroupName"] == f"/aws/lambda/{props['FunctionName']}"
        assert group["RetentionInDays"] == 30


def test_each_function_logs_json_at_the_application_log_level(synthesized: Synthesized) -> None:
    """Lambda's Python runtime sets the root logger's level only from the application log level; without it the
    root stays at WARNING and the services' INFO lines (launches, consolidation decisions) are dropped
    (tests/unit/test_function_logs.py runs each handler as the runtime sets it up with this level)."""
    for name in FUNCTIONS:
        config = _function(synthesized, name)["LoggingConfig"]
        assert config["LogFormat"] == "JSON", name
        assert config["ApplicationLogLevel"] == APPLICATION_LOG_LEVEL, name
        assert config["SystemLogLevel"] == "WARN", name


def test_queue_triggers_report_partial_batch_failures(synthesized: Synthesized) -> None:
    stack = synthesized.stack
    mappings = {m["Properties"]["FunctionName"]["Ref"]: m["Properties"]
                for m in synthesized.of_type("AWS::Lambda::EventSourceMapping").values()}  # fmt: skip
    triggers = {"packer": WorkQueue.PENDING_PODS, "interruption": WorkQueue.INTERRUPTION,
                "fleet": WorkQueue.LAUNCH, "drain": WorkQueue.DRAIN}  # fmt: skip
    assert len(mappings) == len(triggers)
    for name, queue in triggers.items():
        mapping = mappings[synthesized.logical_id(stack.functions.functions[name])]
        assert mapping["EventSourceArn"] == {"Fn::GetAtt": [synthesized.logical_id(stack.queues.queues[queue]), "Arn"]}
        assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        # What the emulator drives the handlers by (`wiring.FUNCTION_WIRING`) is what Lambda is given: one Spot
        # warning an invocation, ten at once, among them.
        wiring = FUNCTION_WIRING[name]
        assert mapping["BatchSize"] == wiring.batch_size, name
        assert mapping.get("ScalingConfig", {}).get("MaximumConcurrency") == wiring.max_concurrency, name
    assert mappings[synthesized.logical_id(stack.functions.functions["packer"])]["BatchSize"] == 10
    interruption = mappings[synthesized.logical_id(stack.functions.functions["interruption"])]
    assert (interruption["BatchSize"], interruption["ScalingConfig"]["MaximumConcurrency"]) == (1, 10)


def test_queue_fed_functions_may_bring_a_failed_record_back_soon(synthesized: Synthesized) -> None:
    """`batch_failures.report_failures` looks up the record's queue and its visibility timeout and changes the
    record's: the role must allow all three on the queue that feeds it."""
    stack = synthesized.stack
    triggers = {"packer": WorkQueue.PENDING_PODS, "interruption": WorkQueue.INTERRUPTION,
                "fleet": WorkQueue.LAUNCH, "drain": WorkQueue.DRAIN}  # fmt: skip
    for name, queue in triggers.items():
        role = stack.functions.functions[name].role
        assert role is not None
        role_id = synthesized.logical_id(role)
        queue_arn = {"Fn::GetAtt": [synthesized.logical_id(stack.queues.queues[queue]), "Arn"]}
        allowed: set[str] = set()
        for policy in synthesized.of_type("AWS::IAM::Policy").values():
            if {"Ref": role_id} not in policy["Properties"]["Roles"]:
                continue
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                resources, actions = statement["Resource"], statement["Action"]
                if statement["Effect"] == "Allow" and queue_arn in (resources if isinstance(resources, list)
                                                                    else [resources]):
                    allowed.update(actions if isinstance(actions, list) else [actions])
        assert {"sqs:GetQueueUrl", "sqs:GetQueueAttributes", "sqs:ChangeMessageVisibility"} <= allowed, name


def test_no_function_reserves_concurrency(synthesized: Synthesized) -> None:
    """A reservation fails the deploy in a new account: Lambda keeps 100 of an account's concurrency unreserved
    ("You can reserve up to the Unreserved account concurrency value that is shown, minus 100 for functions that
    don't have reserved concurrency"), and "New AWS accounts have reduced concurrency and memory quotas", as low as
    10. The packer runs one batch at a time by its FIFO queue's one message group ("for FIFO queues, concurrent
    invocations are capped either by the number of message group IDs or the maximum concurrency setting"), and
    prewarm and consolidate one tick at a time by their lease in the state table (`services.tick_lease`)."""
    functions = synthesized.of_type("AWS::Lambda::Function")
    assert functions
    assert {logical_id: function["Properties"]["ReservedConcurrentExecutions"]
            for logical_id, function in functions.items()
            if "ReservedConcurrentExecutions" in function["Properties"]} == {}


def test_drain_may_re_enqueue_itself(synthesized: Synthesized) -> None:
    assert _function(synthesized, "drain")["RecursiveLoop"] == "Allow"
    assert _function(synthesized, "packer")["RecursiveLoop"] == "Terminate"


def test_scheduled_functions_send_failed_ticks_to_the_scheduler_dlq(synthesized: Synthesized) -> None:
    dlq_id = synthesized.logical_id(synthesized.stack.queues.scheduler_dlq)
    configs = {c["Properties"]["FunctionName"]["Ref"]: c["Properties"]
               for c in synthesized.of_type("AWS::Lambda::EventInvokeConfig").values()}  # fmt: skip
    expected = {synthesized.logical_id(synthesized.stack.functions.functions[n]) for n in ("prewarm", "consolidate")}
    assert set(configs) == expected
    for config in configs.values():
        assert config["DestinationConfig"] == {"OnFailure": {"Destination": {"Fn::GetAtt": [dlq_id, "Arn"]}}}


def test_the_interruption_function_gets_a_whole_vcpu(synthesized: Synthesized) -> None:
    """Its cold start is on the Spot warning → cordon path, which has 5 s of the two-minute notice."""
    assert _function(synthesized, "interruption")["MemorySize"] >= FULL_VCPU_MB == 1769


def test_a_configuration_change_updates_every_function(synthesized: Synthesized,
                                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each function reads the configuration once per execution environment, and a warm one lives for hours
    ("Lambda terminates execution environments every few hours ... even for functions that are invoked
    continuously", Lambda Developer Guide, lambda-runtime-environment.html). A deploy that changed only the SSM
    parameter changed no function, so consolidate (invoked every minute) kept the old pools and limits for hours
    while cold starts ran the new ones. With the parameter's digest in its environment, every function is updated,
    and Lambda serves the invocations after an update with the new configuration (UpdateFunctionConfiguration)."""
    data = infrastructure_config_data()
    data["nodePools"][1]["limits"] = {"gpus": 8}
    changed = synthesize(data, tmp_path_factory.mktemp("changed"))
    [before] = synthesized.of_type("AWS::SSM::Parameter").values()
    [after] = changed.of_type("AWS::SSM::Parameter").values()
    assert before["Properties"]["Value"] != after["Properties"]["Value"]
    for name in FUNCTIONS:
        old, new = _function(synthesized, name), _function(changed, name)
        assert old["Environment"]["Variables"]["CONFIG_DIGEST"] == config_digest(before["Properties"]["Value"]), name
        assert new["Environment"]["Variables"]["CONFIG_DIGEST"] == config_digest(after["Properties"]["Value"]), name

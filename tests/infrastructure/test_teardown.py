"""`cdk destroy` ends the instances the functions launched before it deletes what they run on.

The stack owns no instance: the fleet function launches them outside CloudFormation. Deleting the stack deletes
dependents first ("Resource A is deleted before resource B" when A depends on B, DependsOn attribute), so without
a hook it removed the functions (nothing left to end the instances), the launch templates and the instance
profile (IAM: "Deleting a role or instance profile that is associated with a running instance will break any
applications running on the instance"), and failed on an EFA pool's placement group ("Before you can delete a
placement group, it must contain no instances"), while every GPU instance kept running and billing.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.models.labels import TAG_CLUSTER
from gpu_autoscaler.wiring import APPLICATION_LOG_LEVEL
from tests.infrastructure.conftest import infrastructure_config_data, synthesize

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized

LAUNCHERS = ("AWS::Lambda::EventSourceMapping", "AWS::Events::Rule", "AWS::Scheduler::Schedule")
"""Besides the functions themselves: what triggers them, and so a launch."""


@pytest.fixture(scope="module")
def efa(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The example with an EFA pool: a cluster placement group per zone."""
    data = infrastructure_config_data()
    next(p for p in data["nodePools"] if p["name"] == "gpu-reserved")["efa"] = True
    return synthesize(data, tmp_path_factory.mktemp("efa"))


def hooks(synthesized: Synthesized) -> dict[str, dict[str, Any]]:
    return {key: value for key, value in synthesized.resources.items()
            if value["Type"].startswith("Custom::") or value["Type"] == "AWS::CloudFormation::CustomResource"}


def the_hook(synthesized: Synthesized) -> tuple[str, dict[str, Any]]:
    found = hooks(synthesized)
    assert len(found) == 1, f"no deletion hook (custom resource) in the template: {sorted(found)}"
    return next(iter(found.items()))


def references(value: Any) -> set[str]:
    """The logical ids a property value refers to (Ref, Fn::GetAtt, Fn::Sub's ${Id})."""
    if isinstance(value, dict):
        if "Ref" in value and isinstance(value["Ref"], str):
            return {value["Ref"]}
        if "Fn::GetAtt" in value:
            return {value["Fn::GetAtt"][0]}
        found: set[str] = set()
        for key, item in value.items():
            if key == "Fn::Sub":
                text = item if isinstance(item, str) else item[0]
                found |= {name.split(".")[0] for name in _sub_names(text)}
            found |= references(item)
        return found
    if isinstance(value, list):
        return set().union(*(references(item) for item in value)) if value else set()
    return set()


def _sub_names(text: str) -> list[str]:
    return re.findall(r"\$\{([A-Za-z0-9.]+)\}", text)


def depends_on(synthesized: Synthesized, logical_id: str) -> set[str]:
    """Every resource CloudFormation deletes after this one (what it depends on, directly or not)."""
    resources = synthesized.resources
    seen: set[str] = set()
    pending = [logical_id]
    while pending:
        resource = resources[pending.pop()]
        direct = set(resource.get("DependsOn", [])) | references(resource.get("Properties", {}))
        for name in direct & set(resources) - seen:
            seen.add(name)
            pending.append(name)
    return seen


def test_the_hook_is_deleted_before_the_instance_profile_launch_templates_and_placement_groups(
        efa: Synthesized) -> None:
    key, hook = the_hook(efa)
    nodes = efa.stack.nodes
    needed = {efa.logical_id(nodes.instance_profile),
              *(efa.logical_id(t) for t in nodes.templates.values()),
              *(efa.logical_id(g) for g in nodes.placement_groups.values())}
    assert efa.stack.nodes.placement_groups, "the EFA pool has placement groups"
    assert needed <= set(hook.get("DependsOn", [])), needed - set(hook.get("DependsOn", []))


def test_everything_that_can_launch_is_deleted_before_the_hook(efa: Synthesized) -> None:
    """Otherwise a launch can land while (or after) the hook ends the instances."""
    key, _ = the_hook(efa)
    launchers = [efa.logical_id(f) for f in efa.stack.functions.functions.values()]
    launchers += [k for kind in LAUNCHERS for k in efa.of_type(kind)]
    assert len(launchers) > 6
    late = [name for name in launchers if key not in depends_on(efa, name)]
    assert late == [], f"deleted after the hook, free to launch meanwhile: {late}"
    assert not set(launchers) & depends_on(efa, key)


def test_the_hook_waits_up_to_half_an_hour_and_is_the_provider_framework_s(synthesized: Synthesized) -> None:
    """CDK's Provider framework polls `is_complete` from a Step Functions waiter: its Retry is the total timeout
    (at most 1 hour, `ProviderProps.totalTimeout`); GPU instances are given 30 minutes to terminate."""
    key, hook = the_hook(synthesized)
    assert hook["Properties"]["ClusterName"] == synthesized.config.cluster_name
    [framework] = [k for k in synthesized.of_type("AWS::Lambda::Function") if "ProviderframeworkonEvent" in k]
    assert hook["Properties"]["ServiceToken"] == {"Fn::GetAtt": [framework, "Arn"]}
    [machine] = synthesized.of_type("AWS::StepFunctions::StateMachine").values()
    definition = json.loads("".join(p if isinstance(p, str) else "X"
                                    for p in machine["Properties"]["DefinitionString"]["Fn::Join"][1]))
    [retry] = definition["States"]["framework-isComplete-task"]["Retry"]
    assert 30 * 60 <= retry["IntervalSeconds"] * retry["MaxAttempts"] <= 60 * 60
    handlers = synthesized.stack.teardown.handlers
    for name, function in handlers.items():
        props = synthesized.resources[synthesized.logical_id(function)]["Properties"]
        assert props["Handler"] == f"handler.{name}"
        assert props["Runtime"].startswith("python")
        assert props["Layers"] == [{"Ref": synthesized.logical_id(synthesized.stack.layer.layer)}]
        assert props["LoggingConfig"]["ApplicationLogLevel"] == APPLICATION_LOG_LEVEL  # the root logger's level


def test_the_hook_may_terminate_only_this_cluster_s_instances(synthesized: Synthesized) -> None:
    role = synthesized.logical_id(synthesized.stack.teardown.role)
    statements = [s for policy in synthesized.of_type("AWS::IAM::Policy").values()
                  if {"Ref": role} in policy["Properties"]["Roles"]
                  for s in policy["Properties"]["PolicyDocument"]["Statement"]]
    by_action = {s["Action"]: s for s in statements if not str(s["Action"]).startswith(("logs:", "['logs:"))}
    assert set(by_action) == {"ec2:DescribeInstances", "ec2:TerminateInstances", "cloudformation:DescribeStacks"}
    assert by_action["ec2:TerminateInstances"]["Condition"] == {
        "StringEquals": {f"aws:ResourceTag/{TAG_CLUSTER}": synthesized.config.cluster_name}}
    assert by_action["ec2:DescribeInstances"]["Condition"] == {
        "StringEquals": {"aws:RequestedRegion": synthesized.config.region}}
    assert by_action["cloudformation:DescribeStacks"]["Resource"] == {"Ref": "AWS::StackId"}

from __future__ import annotations

import json
import logging
import types
import typing
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gpu_autoscaler.config import Config, ConfigError, load_config, parse_config
from tests.conftest import ROOT


def test_cdk_json_holds_the_full_example() -> None:
    config = load_config(ROOT / "cdk.json")
    assert config.cluster_name == "ml-prod"
    assert [p.name for p in config.node_pools] == ["gpu-reserved", "gpu-burst", "gpu-shared"]
    assert config.pool("gpu-shared").gpu_sharing.replicas == 4
    assert config.scaling_windows[0].duration == timedelta(hours=9)
    assert config.predictive.lead_time == timedelta(minutes=8)
    assert config.zones == ["us-east-1a", "us-east-1b", "us-east-1c"]


def test_round_trips_through_json(config_data: dict[str, Any]) -> None:
    config = parse_config(config_data)
    assert parse_config(json.loads(config.to_json())) == config


def test_keys_of_a_newer_version_are_ignored_with_one_warning_naming_them_when_asked(
        config_data: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """What the functions read from the SSM parameter: CloudFormation updates it before the functions that
    reference it, so during an upgrade the old code may read the JSON of a version that added fields
    (`Config.to_json` writes every field with its default). The user's cdk.json keeps refusing them (a typo)."""
    expected = parse_config(config_data)
    config_data["kubernetes"]["someFieldOfTheNextRelease"] = True
    config_data["nodePools"][1]["disruption"]["nextKnob"] = "5m"
    config_data["surprise"] = {"nested": 1}
    with pytest.raises(ConfigError, match=r"kubernetes\.someFieldOfTheNextRelease: Extra inputs are not permitted"):
        parse_config(config_data)
    with caplog.at_level(logging.WARNING):
        assert parse_config(config_data, unknown_keys="ignore") == expected
    [record] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.getMessage().endswith(
        "ignoring keys this version does not know: kubernetes.someFieldOfTheNextRelease, "
        "nodePools[1].disruption.nextKnob, surprise")


def test_ignoring_unknown_keys_still_refuses_invalid_values(config_data: dict[str, Any]) -> None:
    config_data["kubernetes"]["someFieldOfTheNextRelease"] = True
    config_data["scalingWindows"][0]["timezone"] = "Mars/Olympus"
    with pytest.raises(ConfigError) as caught:
        parse_config(config_data, unknown_keys="ignore")
    assert caught.value.problems == ["scalingWindows[0].timezone: 'Mars/Olympus' is not an IANA time zone"]


def test_the_stack_grants_cluster_access_through_the_eks_api_unless_told_not_to(config_data: dict[str, Any]) -> None:
    """On by default (an EKS cluster in authentication mode API or API_AND_CONFIG_MAP); off for a cluster still
    on the aws-auth ConfigMap, or a self-managed one."""
    assert parse_config(config_data).kubernetes.eks_access is True
    config_data["kubernetes"]["eksAccess"] = False
    config = parse_config(config_data)
    assert config.kubernetes.eks_access is False
    assert parse_config(json.loads(config.to_json())).kubernetes.eks_access is False


def test_a_pool_weighing_every_node_stays_so_through_the_published_json(config_data: dict[str, Any]) -> None:
    # `underutilizedBelow: null` is Karpenter's rule (every node weighed); its default is 0.5. The Lambdas read the
    # configuration from `to_json()` (the SSM parameter), so a null left out there would become 0.5 in the account.
    config_data["nodePools"][0].setdefault("disruption", {})["underutilizedBelow"] = None
    config = parse_config(config_data)
    assert config.node_pools[0].disruption.underutilized_below is None
    published = json.loads(config.to_json())
    assert published["nodePools"][0]["disruption"]["underutilizedBelow"] is None
    assert parse_config(published) == config
    assert {p["disruption"]["underutilizedBelow"] for p in published["nodePools"][1:]} <= {0.5}  # the others' default


def test_no_other_setting_has_a_null_that_is_not_its_default() -> None:
    # The published JSON leaves nulls out (`to_json`), which is right wherever null is the default;
    # `Disruption` writes its `underutilizedBelow` null anyway. A new setting like it would need the same.
    def may_be_null(annotation: Any) -> bool:
        return annotation is type(None) or (typing.get_origin(annotation) in (typing.Union, types.UnionType)
                                            and any(may_be_null(a) for a in typing.get_args(annotation)))

    def models(annotation: Any) -> list[type[BaseModel]]:
        found = [m for a in typing.get_args(annotation) for m in models(a)]
        return [*found, annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else found

    seen: set[type[BaseModel]] = set()
    odd: set[tuple[str, str]] = set()
    pending: list[type[BaseModel]] = [Config]
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            default_not_null = field.default_factory is not None or field.default not in (None, PydanticUndefined)
            if may_be_null(field.annotation) and default_not_null:
                odd.add((model.__name__, name))
            pending.extend(models(field.annotation))
    assert odd == {("Disruption", "underutilized_below")}


def test_a_pools_termination_grace_period_is_optional_and_a_duration(config_data: dict[str, Any]) -> None:
    assert parse_config(config_data).node_pools[0].termination_grace_period is None
    config_data["nodePools"][0]["terminationGracePeriod"] = "2h"
    assert parse_config(config_data).node_pools[0].termination_grace_period == timedelta(hours=2)
    config_data["nodePools"][0]["terminationGracePeriod"] = "whenever"
    with pytest.raises(ConfigError, match="nodePools.0..terminationGracePeriod: 'whenever' is not a duration"):
        parse_config(config_data)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["nodePools"][1]["requirements"].__setitem__(0, {"key": "k", "operator": "Gt", "values": ["x"]}),
         "nodePools[1].requirements[0].operator: 'Gt' needs exactly one integer value"),
        (lambda d: d["nodePools"][0]["requirements"].__setitem__(0, {"key": "k", "operator": "In"}),
         "nodePools[0].requirements[0].operator: 'In' needs at least one value"),
        (lambda d: d["scalingWindows"][0].__setitem__("timezone", "Mars/Olympus"),
         "scalingWindows[0].timezone: 'Mars/Olympus' is not an IANA time zone"),
        (lambda d: d["scalingWindows"][0].__setitem__("nodePool", "nope"),
         "scaling window 'weekday-inference-peak' names unknown node pool 'nope'"),
        (lambda d: d["nodePools"][1]["disruption"].__setitem__("consolidateAfter", "soon"),
         "nodePools[1].disruption.consolidateAfter: 'soon' is not a duration"),
        (lambda d: d["nodePools"][0].__setitem__("capacityTypes", ["reserved", "dedicated"]),
         "nodePools[0].capacityTypes[1]: Input should be 'reserved', 'spot' or 'on-demand'"),
        (lambda d: d.__setitem__("surprise", 1), "surprise: Extra inputs are not permitted"),
        (lambda d: d["nodePools"][2]["gpuSharing"].__setitem__("mode", "mig"),
         "nodePools[2].gpuSharing: replicas only applies to mode 'time-slicing'"),
        (lambda d: d["nodePools"][2]["gpuSharing"].pop("replicas"),
         "nodePools[2].gpuSharing: mode 'time-slicing' needs replicas, at least 2"),
        (lambda d: d["nodePools"][2]["gpuSharing"].__setitem__("replicas", 1),
         "nodePools[2].gpuSharing: mode 'time-slicing' needs replicas, at least 2"),
        (lambda d: d["nodePools"].append(dict(d["nodePools"][0])),
         "node pool names must be unique; repeated: gpu-reserved"),
        # EventBridge Scheduler refuses these at CreateSchedule (eb-cron-expressions: "You can't use * in both the
        # Day-of-month and Day-of-week fields"; hours 0-23; no step in a day-of-week range): refused here, not at
        # the deploy or at prewarm's first tick.
        (lambda d: d["scalingWindows"][0].__setitem__("schedule", "cron(0 9 * * MON-FRI *)"),
         "scalingWindows[0].schedule: 'cron(0 9 * * MON-FRI *)': exactly one of day-of-month and day-of-week must be "
         "'?'"),
        (lambda d: d["scalingWindows"][0].__setitem__("schedule", "cron(0 25 ? * MON-FRI *)"),
         "scalingWindows[0].schedule: hours: 25 is outside 0-23"),
        (lambda d: d["scalingWindows"].append(dict(d["scalingWindows"][0])),
         "scaling window names must be unique; repeated: weekday-inference-peak"),
    ],
)
def test_invalid_configuration_names_field_and_reason(config_data: dict[str, Any], mutate: Any, message: str) -> None:
    mutate(config_data)
    with pytest.raises(ConfigError) as caught:
        parse_config(config_data)
    assert message in str(caught.value)
    assert str(caught.value).startswith("invalid gpu-autoscaler configuration: ")


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:8443", "http://localhost:6443", "http://[::1]:6443"])
def test_plain_http_is_for_an_api_server_on_this_machine_only(config_data: dict[str, Any], endpoint: str) -> None:
    """The functions send their EKS bearer token on every request, a presigned sts:GetCallerIdentity anyone who reads
    it may replay for 15 minutes (aws-iam-authenticator pkg/token/token.go): over plain HTTP only to the emulator."""
    config_data["kubernetes"]["endpoint"] = endpoint
    assert parse_config(config_data).kubernetes.endpoint == endpoint
    config_data["kubernetes"]["endpoint"] = "http://api.ml-prod.internal.example.com"
    with pytest.raises(ConfigError) as caught:
        parse_config(config_data)
    assert ("kubernetes.endpoint: 'http://api.ml-prod.internal.example.com': plain http:// would send the cluster "
            "token in clear; use https://") in str(caught.value)


def test_missing_file_says_what_to_do(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="give --config FILE"):
        load_config(tmp_path / "cdk.json")


@pytest.mark.parametrize("key", ["node-role.kubernetes.io/gpu", "kubernetes.io/role", "example.k8s.io/tier",
                                 "karpenter.sh/nodepool", "karpenter.k8s.aws/instance-gpu-name"])
def test_pool_labels_the_kubelet_would_refuse_or_that_restate_well_known_labels_are_rejected(key: str) -> None:
    """Issue 15, fix 8: such a label stopped the node from joining (or was dropped) while the packer matched it."""
    from gpu_autoscaler.config import NodePool

    with pytest.raises(ValueError, match=key):
        NodePool.model_validate({"name": "gpu", "labels": {key: "x"}})
    assert NodePool.model_validate({"name": "gpu", "labels": {"node.kubernetes.io/lifecycle": "spot",
                                                               "example.com/team": "a"}}).labels


_KUBELET_REFUSES = [
    ({"labels": {"workload": "training job"}}, "label workload=training job: the value", "alphanumeric"),
    ({"labels": {"workload": "a" * 64}}, "label workload=a", "at most 63 characters"),
    ({"labels": {"team": "ml/vision"}}, "label team=ml/vision: the value", "alphanumeric"),
    ({"labels": {"team/a/b": "x"}}, "label team/a/b=x: the key", "an optional DNS subdomain prefix"),
    ({"labels": {"Example.com/team": "x"}}, "label Example.com/team=x: the key's prefix", "lowercase"),
    ({"labels": {"-team": "x"}}, "label -team=x: the key's name", "alphanumeric"),
    ({"taints": [{"key": "bad key", "value": "v", "effect": "NoSchedule"}]}, "taint bad key=v:NoSchedule: the key",
     "alphanumeric"),
    ({"taints": [{"key": "dedicated", "value": "gpu/a100", "effect": "NoSchedule"}]},
     "taint dedicated=gpu/a100:NoSchedule: the value", "alphanumeric"),
    ({"taints": [{"key": "dedicated", "value": "a" * 64, "effect": "NoSchedule"}]}, "taint dedicated=a",
     "at most 63 characters"),
    ({"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
                 {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
     "taints nvidia.com/gpu:NoSchedule", "one taint per key and effect"),
]


@pytest.mark.parametrize(("change", "names", "rule"), _KUBELET_REFUSES)
def test_pool_labels_and_taints_a_kubelet_would_refuse_are_refused_naming_pool_item_and_rule(
        config_data: dict[str, Any], change: dict[str, Any], names: str, rule: str) -> None:
    """They reach the node only through the kubelet's `--node-labels` / `--register-with-taints`
    (Bottlerocket's node-labels / node-taints), and a kubelet refuses to start on one that is not Kubernetes syntax
    (`ValidateKubeletFlags`: IsQualifiedName / IsValidLabelValue; `ParseTaints`, with one taint per key and
    effect): every instance of the pool would boot, never join, and be billed until the registration timeout."""
    config_data["nodePools"][1].update(change)
    with pytest.raises(ConfigError) as caught:
        parse_config(config_data)
    [problem] = caught.value.problems
    assert problem.startswith("nodePools[1]: node pool 'gpu-burst': " + names), problem
    assert rule in problem, problem


def test_pool_labels_and_taints_of_kubernetes_syntax_are_kept(config_data: dict[str, Any]) -> None:
    """The edges of the syntax a kubelet accepts: an empty value, 63 characters, a 253-character DNS prefix, the
    same key with two effects, and (the functions' reading of the SSM parameter) a key of a newer version beside."""
    prefix = ".".join(["a" * 63] * 3 + ["b" * 61])
    labels = {"empty": "", "team": "ML_vision-1.2", "x" * 63: "y" * 63, f"{prefix}/n": "v", "node.kubernetes.io/a": "b"}
    taints = [{"key": "dedicated", "effect": "NoSchedule"}, {"key": "dedicated", "value": "a.b", "effect": "NoExecute"}]
    config_data["nodePools"][1].update(labels=labels, taints=taints, nextKnob=1)
    config = parse_config(config_data, unknown_keys="ignore")
    assert len(prefix) == 253
    assert config.node_pools[1].labels == labels
    assert [t.effect for t in config.node_pools[1].taints] == ["NoSchedule", "NoExecute"]


@pytest.mark.parametrize("requirement", [
    {"key": "karpenter.k8s.aws/instance-hypervisor", "operator": "In", "values": ["nitro"]},
    {"key": "karpenter.k8s.aws/instance-local-nvme", "operator": "Gt", "values": ["100"]},
    {"key": "example.com/team", "operator": "In", "values": ["ml"]},
    {"key": "example.com/team", "operator": "Exists"},
])
def test_a_requirement_no_node_of_the_pool_could_meet_is_refused(requirement: dict[str, Any]) -> None:
    """A requirement on a label no node of the pool carries holds for no instance type: the pool could never launch,
    and the packer would say so only once pods wait. Karpenter labels nodes with more of its keys than this
    project does, and with a value for each custom key a requirement names; here a custom key must be one of the
    pool's labels."""
    from gpu_autoscaler.config import NodePool

    with pytest.raises(ValueError, match=f"requirement {requirement['key']}: no node of pool gpu carries"):
        NodePool.model_validate({"name": "gpu", "requirements": [requirement]})
    labelled = {"name": "gpu", "labels": {"example.com/team": "ml"}, "requirements": [requirement]}
    if requirement["key"] == "example.com/team":
        assert NodePool.model_validate(labelled).requirements
    for harmless in ({**requirement, "operator": "NotIn", "values": ["x"]},
                     {"key": requirement["key"], "operator": "DoesNotExist"}):
        assert NodePool.model_validate({"name": "gpu", "requirements": [harmless]}).requirements
    usual = [{"key": k, "operator": "Exists"} for k in ("kubernetes.io/os", "kubernetes.io/arch",
             "karpenter.sh/capacity-type", "topology.kubernetes.io/zone", "karpenter.sh/nodepool",
             "node.kubernetes.io/instance-type", "karpenter.k8s.aws/instance-cpu", "karpenter.k8s.aws/instance-memory",
             "karpenter.k8s.aws/instance-gpu-count", "gpu-autoscaler/gpu-fraction")]
    assert len(NodePool.model_validate({"name": "gpu", "requirements": usual}).requirements) == len(usual)

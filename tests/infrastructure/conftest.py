"""One synth per test session (synth takes seconds): the template, the stack and cdk-nag's annotations.

The layer is built from the package alone (`gpu-autoscaler:layerDependencies=false`): no pip, no network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from gpu_autoscaler.config import CONTEXT_KEY, Config, parse_config
from infra.application import build
from infra.layer import LAYER_DEPENDENCIES_CONTEXT
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from pathlib import Path

    from infra.stack import GpuAutoscalerStack

SECURITY_GROUP = "sg-0123456789abcdef0"
"""A well-formed id: CloudFormation's pattern for security group ids wants 8 or 17 hex digits."""

SECOND_WINDOW = {
    "name": "tokyo-batch",
    "schedule": "cron(30 1 * * ? *)",
    "timezone": "Asia/Tokyo",
    "duration": "2h",
    "nodePool": "gpu-shared",
    "warm": {"instanceTypes": {"g6.xlarge": 2}},
}

KUBERNETES_CLIENTS = ["packer", "interruption", "drain", "consolidate"]
"""The functions that make Kubernetes requests (packer: pod Events). prewarm makes none: it plans warm claims
and sends launch requests (`aws_prewarm_service`), and its handler test runs with the Kubernetes client refused."""


def infrastructure_config_data() -> dict[str, Any]:
    """The cdk.json example, with a second scaling window in another time zone."""
    data = example_config_data()
    data["network"]["securityGroups"] = [SECURITY_GROUP]
    data["scalingWindows"].append(SECOND_WINDOW)
    return data


@dataclass(frozen=True)
class Synthesized:
    config: Config
    stack: GpuAutoscalerStack
    template: Template
    resources: dict[str, Any]
    outputs: dict[str, Any]
    messages: list[dict[str, Any]]
    """Every error/warning/info annotation in the assembly: level, path, text."""
    outdir: Path

    def of_type(self, cfn_type: str) -> dict[str, dict[str, Any]]:
        return {key: value for key, value in self.resources.items() if value["Type"] == cfn_type}

    def logical_id(self, construct: Any) -> str:
        element = construct if isinstance(construct, cdk.CfnElement) else construct.node.default_child
        return str(self.stack.get_logical_id(element))


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    return synthesize(infrastructure_config_data(), tmp_path_factory.mktemp("cdk.out"))


def synthesize(data: dict[str, Any], outdir: Path, extra_context: dict[str, str] | None = None) -> Synthesized:
    """The app as `app.py` builds it, for this configuration (and any other context), with the package-only layer."""
    context = {CONTEXT_KEY: data, LAYER_DEPENDENCIES_CONTEXT: "false", **(extra_context or {})}
    app = cdk.App(outdir=str(outdir), context=context)
    stack = build(app)
    assembly = app.synth()
    artifact = assembly.get_stack_artifact(stack.artifact_id)
    template_json: dict[str, Any] = artifact.template
    manifest = json.loads((outdir / "manifest.json").read_text())
    messages = [
        {"level": entry["type"].removeprefix("aws:cdk:"), "path": path, "text": str(entry["data"])}
        for value in manifest["artifacts"].values()
        for path, entries in (value.get("metadata") or {}).items()
        for entry in entries
        if entry["type"] in ("aws:cdk:error", "aws:cdk:warning", "aws:cdk:info")
    ]
    return Synthesized(
        config=parse_config(data),
        stack=stack,
        template=Template.from_json(template_json),
        resources=template_json["Resources"],
        outputs=template_json.get("Outputs", {}),
        messages=messages,
        outdir=outdir,
    )

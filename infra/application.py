"""From a CDK app's context to the checked stack: the path `app.py` and the infrastructure tests share."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aws_cdk import Aspects
from cdk_nag import AwsSolutionsChecks

from gpu_autoscaler.config import CONTEXT_KEY, ConfigError, load_config, parse_config
from infra.checkov import CheckovSkips
from infra.stack import GpuAutoscalerStack, stack_id

if TYPE_CHECKING:
    from aws_cdk import App

    from gpu_autoscaler.config import Config

__all__ = ["build", "config_from_context"]

CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"


def config_from_context(app: App) -> Config:
    """The `gpu-autoscaler` context (cdk.json, as the CDK CLI passes it), or cdk.json itself when the app runs
    without the CLI. Raises ConfigError naming each invalid field."""
    raw: Any = _cli_context().get(CONTEXT_KEY)
    if raw is None:
        raw = app.node.try_get_context(CONTEXT_KEY)
    if raw is None:
        return load_config(CDK_JSON)
    if isinstance(raw, str):  # `cdk synth -c gpu-autoscaler='{...}'` passes a string
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError([f"context {CONTEXT_KEY}: not valid JSON ({exc})"]) from None
    return parse_config(raw)


def _cli_context() -> dict[str, Any]:
    """The context as the CDK CLI hands it to the app, read here as JSON: through jsii (`try_get_context`) a null in
    the context's objects arrives as a missing key, and `underutilizedBelow: null` (every node weighed) would read as
    its default, 0.5. The two sources aws-cdk-lib's `App` reads, in its order: the JSON in CDK_CONTEXT_JSON
    (cx-api's CONTEXT_ENV), then the file CONTEXT_OVERFLOW_LOCATION_ENV names when the context is too large for the
    environment (core/lib/app.js, `loadContext`)."""
    context: dict[str, Any] = {}
    inline = os.environ.get("CDK_CONTEXT_JSON")
    if inline:
        context.update(json.loads(inline))
    overflow = os.environ.get("CONTEXT_OVERFLOW_LOCATION_ENV")
    if overflow:
        context.update(json.loads(Path(overflow).read_text()))
    return context


def build(app: App, *, layer_dependencies: bool | None = None) -> GpuAutoscalerStack:
    """One stack for the configured cluster, with cdk-nag's AwsSolutions checks on everything in the app and
    checkov's accepted findings written into the template with their reasons."""
    config = config_from_context(app)
    stack = GpuAutoscalerStack(app, stack_id(config.cluster_name), config=config, layer_dependencies=layer_dependencies)
    Aspects.of(app).add(AwsSolutionsChecks(verbose=True))
    Aspects.of(app).add(CheckovSkips())
    return stack

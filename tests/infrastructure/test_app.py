"""app.py: configuration errors stop synth with the field named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import pytest

from gpu_autoscaler.config import CONTEXT_KEY, ConfigError, parse_config
from infra.application import build
from tests.infrastructure.conftest import infrastructure_config_data

ROOT = Path(__file__).resolve().parents[2]


def _invalid() -> dict:
    data = infrastructure_config_data()
    data["nodePools"][1]["requirements"][1]["values"] = ["4", "5"]
    return data


def test_invalid_configuration_fails_build_naming_the_field() -> None:
    app = cdk.App(context={CONTEXT_KEY: _invalid()})
    with pytest.raises(ConfigError, match=r"nodePools\[1\]\.requirements\[1\]\.operator: 'Gt' needs exactly one"):
        build(app)


def test_app_py_exits_with_the_message_on_invalid_configuration(tmp_path: Path) -> None:
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps({CONTEXT_KEY: _invalid()}), "CDK_OUTDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 1
    assert "nodePools[1].requirements[1].operator: 'Gt' needs exactly one integer value" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.template.json"))


def test_a_null_in_cdk_json_reaches_the_lambdas_configuration(tmp_path: Path) -> None:
    # `underutilizedBelow: null` weighs every node (Karpenter's rule); its default is 0.5. The CLI hands cdk.json's
    # context to app.py as JSON, and the Lambdas read the SSM parameter: a null lost on either way would deploy 0.5.
    data = infrastructure_config_data()
    data["nodePools"][1].setdefault("disruption", {})["underutilizedBelow"] = None
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps({CONTEXT_KEY: data}), "CDK_OUTDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [template] = tmp_path.glob("*.template.json")
    [value] = [r["Properties"]["Value"] for r in json.loads(template.read_text())["Resources"].values()
               if r["Type"] == "AWS::SSM::Parameter"]
    published = parse_config(json.loads(value))
    assert [p.disruption.underutilized_below for p in published.node_pools] == [0.5, None, 0.5]


def test_context_may_be_a_json_string() -> None:
    app = cdk.App(context={CONTEXT_KEY: json.dumps({"clusterName": "x"})})
    with pytest.raises(ConfigError, match="region"):
        build(app)

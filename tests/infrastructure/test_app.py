"""app.py: configuration errors stop synth with the field named; the layer's bundling switch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import aws_cdk as cdk
import pytest

from gpu_autoscaler.config import CONTEXT_KEY, ConfigError
from infra.application import build
from infra.layer import (
    LAYER_DEPENDENCIES_CONTEXT,
    PipLayerBundling,
    layer_dependencies_enabled,
    runtime_requirements,
)
from tests.infrastructure.conftest import infrastructure_config_data

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized

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


def test_context_may_be_a_json_string() -> None:
    app = cdk.App(context={CONTEXT_KEY: json.dumps({"clusterName": "x"})})
    with pytest.raises(ConfigError, match="region"):
        build(app)


def test_layer_dependencies_switch_reads_the_context() -> None:
    for value, expected in ((None, True), ("false", False), (False, False), ("true", True), ("0", False)):
        app = cdk.App(context={} if value is None else {LAYER_DEPENDENCIES_CONTEXT: value})
        assert layer_dependencies_enabled(app) is expected, value


def test_layer_in_tests_holds_the_package_and_no_dependencies(synthesized: Synthesized) -> None:
    assert synthesized.stack.layer.install_dependencies is False
    [asset] = [p for p in synthesized.outdir.glob("asset.*") if (p / "python").is_dir()]
    assert (asset / "python" / "gpu_autoscaler" / "config.py").is_file()
    assert (asset / "python" / "gpu_autoscaler" / "data").is_dir()
    assert sorted(p.name for p in (asset / "python").iterdir()) == ["gpu_autoscaler"]
    assert not list(asset.rglob("__pycache__"))


def test_pip_installs_manylinux_wheels_for_the_lambda_platform() -> None:
    bundling = PipLayerBundling(
        package_dir=ROOT / "layers" / "core" / "gpu_autoscaler",
        requirements=runtime_requirements(),
        architecture="arm64",
        python_version="3.14",
        install_dependencies=True,
    )
    command = bundling.pip_command(Path("/out/python"))
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    for flag, value in (("--platform", "manylinux2014_aarch64"), ("--python-version", "3.14"),
                        ("--target", "/out/python"), ("--implementation", "cp")):  # fmt: skip
        assert command[command.index(flag) + 1] == value
    assert "--only-binary=:all:" in command


def test_runtime_requirements_leave_out_the_cli_and_the_sdk() -> None:
    requirements = runtime_requirements()
    names = {r.split(">")[0].split("[")[0].split("=")[0].split("<")[0] for r in requirements}
    assert {"pydantic", "aws-lambda-powertools", "kubernetes"} <= names
    assert not names & {"typer", "rich", "boto3"}

"""The command line as a new user meets it: one-line errors, exit codes, `-o`, the shared flags (issue 18 part 5)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from typer.testing import CliRunner

from gpu_autoscaler.cli.main import app

if TYPE_CHECKING:
    from pathlib import Path

runner = CliRunner()
TOLERATE = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


@pytest.fixture
def config_file(tmp_path: Path, config_data: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_data))
    return path


def _pods(tmp_path: Path, *requests: dict[str, str]) -> Path:
    path = tmp_path / "pods.json"
    path.write_text(json.dumps([{"uid": f"u{i}", "namespace": "team-a", "name": f"p{i}", "tolerations": TOLERATE,
                                 "requests": r} for i, r in enumerate(requests)]))
    return path


def _one_error_line(result: Any) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_an_unknown_region_is_one_line_naming_what_the_emulator_covers(config_file: Path) -> None:
    result = runner.invoke(app, ["catalog", "--region", "xx-nowhere-9", "--config", str(config_file)])
    assert result.exit_code == 2
    assert "covers us-east-1" in _one_error_line(result) and "xx-nowhere-9" in result.stderr


def test_aws_region_from_the_environment_is_the_default(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    result = runner.invoke(app, ["catalog", "--config", str(config_file)])
    assert result.exit_code == 2 and "not eu-west-1" in _one_error_line(result)
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    assert "not ap-south-1" in runner.invoke(app, ["catalog", "--config", str(config_file)]).stderr


def test_a_missing_profile_is_one_line(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "nope")
    result = runner.invoke(app, ["catalog", "--aws", "--config", str(config_file)])
    assert result.exit_code == 1 and "profile (nope) could not be found" in _one_error_line(result)


def test_catalog_is_smallest_first_filtered_and_speaks_yaml(config_file: Path) -> None:
    result = runner.invoke(app, ["catalog", "-o", "yaml", "--family", "g6", "--capacity-type", "spot",
                                 "--zone", "us-east-1b", "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # no warnings a user cannot act on
    rows = yaml.safe_load(result.stdout)
    assert rows and {(r["capacityType"], r["zone"], r["instanceType"].split(".")[0]) for r in rows} == {
        ("spot", "us-east-1b", "g6")}
    sizes = [(r["gpus"], r["gpuMemoryMiB"], r["vcpu"]) for r in rows]
    assert sizes == sorted(sizes) and rows[0]["instanceType"] == "g6.xlarge"
    h100 = json.loads(runner.invoke(app, ["catalog", "-o", "json", "--gpu", "H100", "--config",
                                          str(config_file)]).stdout)
    assert h100 and {r["gpuModel"] for r in h100} == {"H100"}


def test_format_json_still_works_and_says_it_is_deprecated(config_file: Path) -> None:
    result = runner.invoke(app, ["catalog", "--format", "json", "--family", "g6", "--config", str(config_file)])
    assert result.exit_code == 0 and json.loads(result.stdout)
    assert "--format is deprecated" in result.stderr


def test_a_bad_quantity_is_one_line_with_its_path(tmp_path: Path, config_file: Path) -> None:
    pods = _pods(tmp_path, {"cpu": "1", "nvidia.com/gpu": "1"}, {"cpu": "lots", "nvidia.com/gpu": "1"})
    result = runner.invoke(app, ["plan", "--pods", str(pods), "--config", str(config_file)])
    assert result.exit_code == 2
    assert _one_error_line(result) == (
        f"error: {pods}: not a pending-pods document: pods[1].requests.cpu: 'lots' is not a Kubernetes quantity")
    negative = _pods(tmp_path, {"cpu": "1", "nvidia.com/gpu": "-1"})
    result = runner.invoke(app, ["plan", "--pods", str(negative), "--config", str(config_file)])
    assert _one_error_line(result).endswith(
        """pods[0].requests["nvidia.com/gpu"]: '-1' is not a non-negative Kubernetes quantity""")


def test_plan_exits_3_when_a_pod_cannot_be_placed(tmp_path: Path, config_file: Path) -> None:
    placeable = _pods(tmp_path, {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"})
    assert runner.invoke(app, ["plan", "--pods", str(placeable), "--config", str(config_file)]).exit_code == 0
    too_big = _pods(tmp_path, {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "64"})
    result = runner.invoke(app, ["plan", "--pods", str(too_big), "-o", "json", "--config", str(config_file)])
    assert result.exit_code == 3
    assert json.loads(result.stdout)["unschedulable"][0]["pod"] == "u0"


def test_version_short_help_and_completion() -> None:
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout.startswith("gpu-autoscaler ")
    short = runner.invoke(app, ["-h"], terminal_width=80)
    assert short.exit_code == 0 and "--install-completion" in short.stdout and "--quiet" in short.stdout
    assert all(len(line) <= 80 for line in short.stdout.splitlines())
    for command in ("catalog", "plan", "invoke", "demo", "simulate", "emulator", "status", "doctor"):
        page = runner.invoke(app, [command, "--help"], terminal_width=80)
        assert page.exit_code == 0 and "--output" in page.stdout, command
        assert all(len(line) <= 80 for line in page.stdout.splitlines()), command

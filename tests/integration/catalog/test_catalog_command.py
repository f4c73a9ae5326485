"""`gpu-autoscaler catalog` end to end on moto in-process, through Typer's runner."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from gpu_autoscaler.cli.catalog import JSON_KEYS
from gpu_autoscaler.cli.main import app

if TYPE_CHECKING:
    from pathlib import Path

runner = CliRunner()


@pytest.fixture
def config_file(tmp_path: Path, config_data: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_data))
    return path


def test_json_lists_every_gpu_offering_with_exactly_the_documented_keys(config_file: Path) -> None:
    result = runner.invoke(app, ["catalog", "--region", "us-east-1", "--format", "json", "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows and all(tuple(row) == JSON_KEYS for row in rows)
    assert set(JSON_KEYS) == {"instanceType", "zone", "capacityType", "pricePerHour", "gpus", "gpuModel",
                              "gpuMemoryMiB", "vcpu", "memoryMiB", "maxPods"}
    g6f = [row for row in rows if row["instanceType"] == "g6f.large"]
    assert {row["zone"] for row in g6f} == {"us-east-1a", "us-east-1b", "us-east-1c"}
    assert all(row["gpus"] == 0.125 and row["gpuModel"] == "L4" and row["gpuMemoryMiB"] == 2861 for row in g6f)
    assert {(row["capacityType"], row["pricePerHour"]) for row in g6f} == {("on-demand", 0.202)}
    p5 = next(row for row in rows if row["instanceType"] == "p5.4xlarge")
    assert (p5["gpus"], p5["gpuModel"], p5["vcpu"], p5["memoryMiB"]) == (1, "H100", 16, 262144)
    assert all(row["gpus"] > 0 and row["maxPods"] > 0 for row in rows)
    assert {row["capacityType"] for row in rows} == {"spot", "on-demand"}


def test_table_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no cdk.json here: the whole region, every zone
    result = runner.invoke(app, ["catalog", "--format", "table"])
    assert result.exit_code == 0, result.output
    assert "GPU offerings in us-east-1" in result.stdout
    assert "us-east-1f" in result.stdout and "g6f.large" in result.stdout
    assert "snapshot 2026-07-20" in result.stdout


def test_a_region_without_prices_is_refused_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["catalog", "--region", "eu-west-1", "--format", "json"])
    assert result.exit_code == 2  # refused before anything runs: the emulator covers its snapshot's regions
    assert "covers us-east-1" in result.output and "not eu-west-1" in result.output
    assert result.stdout == ""


def test_an_invalid_configuration_is_named(tmp_path: Path, config_data: dict[str, Any]) -> None:
    config_data["nodePools"][0]["capacityTypes"] = ["reserved", "sometimes"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config_data))
    result = runner.invoke(app, ["catalog", "--config", str(path)])
    assert result.exit_code == 2
    assert "nodePools[0].capacityTypes[1]" in result.output

"""`gpu-autoscaler simulate` on a short stretch of the real Alibaba trace, end to end."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from benchmarks.simulation import goals
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.simulation.policies import POLICY_NAMES
from tests.conftest import ROOT, SHARED_DATA

if TYPE_CHECKING:
    from pathlib import Path

TRACE = SHARED_DATA / "traces" / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
CONFIG = ROOT / "benchmarks" / "simulation" / "config.json"
KEYS = {"name", "cost", "lowerBound", "gpuAllocation", "waitP50", "waitP95", "waitP99", "interruptions", "neverRan"}


@pytest.mark.skipif(not TRACE.exists(), reason="the shared Alibaba trace is not here")
def test_simulate_writes_the_report_the_plots_and_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    result = CliRunner().invoke(app, [
        "simulate", "--trace", str(TRACE), "--config", str(CONFIG), "--from-day", "140", "--to-day", "140.05",
        "--seed", "1", "--workers", "2", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    # The configuration time-slices GPUs and the trace has pods asking for part of one: Karpenter with a NodeOverlay
    # is in the default set, and the goals are judged against it.
    assert [p["name"] for p in report["policies"]] == [*POLICY_NAMES, "karpenter-overlay"]
    for policy in report["policies"]:
        assert KEYS <= set(policy)
        assert policy["lowerBound"] <= policy["cost"]
        assert policy["neverRan"]["count"] == sum(policy["neverRan"]["reasons"].values())
    assert report["trace"]["gpuPods"] == 16  # the GPU pods arriving in those 72 minutes
    assert report["gpuMapping"]["T4"]["instanceTypes"][0].startswith("g4dn.")
    assert report["settings"]["seed"] == 1
    assert report["settings"]["zones"] == ["us-east-1a", "us-east-1b", "us-east-1c"]
    for name in ("gpus.png", "cost.png", "waits.png", "costs.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fixed-node-group" in result.output and "÷ bound" in result.output
    # Where each pool's dollars go: on the terminal and in the report, adding up to each policy's cost.
    assert "where the cost goes by node pool" in result.output
    for policy in report["policies"]:
        pools = policy["costByPool"]
        assert sum(p["cost"] for p in pools.values()) == pytest.approx(policy["cost"], abs=0.01 * len(pools))
        assert sum(p["nodesLaunched"] for p in pools.values()) == policy["nodesLaunched"]
    assert set(report["policies"][0]["costByPool"]) <= {"gpu", "gpu-shared"}
    goals.main([str(out / "report.json")])  # the goals read the report as the CLI writes it
    judged = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("  met", "  MISSED"))]
    assert len(judged) == 4 and "karpenter-overlay" in judged[0], judged


def test_simulate_names_a_bad_policy_and_a_bad_trace(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.csv"
    bad.write_text("name,arrival\nx,1\n")
    result = runner.invoke(app, ["simulate", "--trace", str(bad), "--format", "csv", "--config", str(CONFIG),
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "missing column(s) duration, gpus, cpu, memory" in result.output
    result = runner.invoke(app, ["simulate", "--trace", str(bad), "--config", str(CONFIG), "--policy", "magic",
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code != 0
    assert "unknown policy magic" in result.output

"""The simulator takes boot times per instance type from a file of measured boots (the state store's shape), and
its reconcile step records the boots it sees, as the Lambda's does."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from gpu_autoscaler.cli.main import app
from gpu_autoscaler.simulation.engine import PolicyRun
from gpu_autoscaler.simulation.policies import build_policy
from gpu_autoscaler.simulation.settings import BootTimesError, read_boot_times
from tests.conftest import ROOT
from tests.unit.simulation.builders import make_catalog, make_config, make_pod, make_trace, settings

if TYPE_CHECKING:
    from pathlib import Path

EXAMPLE = ROOT / "benchmarks" / "simulation" / "boot-times.example.json"
PACK, QUEUE = 10.0, 2.0


def _sample(instance_type: str, seconds: float, claim: str) -> dict[str, object]:
    return {"pool": "gpu", "instanceType": instance_type, "claimId": claim, "launchedAt": "2026-11-20T08:00:00Z",
            "readyAt": "2026-11-20T08:01:00Z", "gpusAllocatableAt": f"2026-11-20T08:{int(seconds // 60):02d}:"
            f"{int(seconds % 60):02d}Z"}


def test_the_example_file_reads_as_boots_per_instance_type() -> None:
    boots = read_boot_times(EXAMPLE)
    assert {"g4dn.xlarge", "p5.48xlarge"} <= set(boots)
    assert all(len(seconds) >= 5 and all(s > 0 for s in seconds) for seconds in boots.values())


def test_a_launch_waits_its_types_measured_boot(tmp_path: Path) -> None:
    path = tmp_path / "boots.json"
    path.write_text(json.dumps([_sample("g4dn.xlarge", 900, "a")]))
    catalog = make_catalog(spot=False)
    trace = make_trace(make_pod(arrival=100.0, duration=600.0))
    config = make_config()
    run = PolicyRun(build_policy("ours", config, catalog, trace.pods), trace, catalog,
                    settings(boot_times=read_boot_times(path)))
    result = run.run()
    assert result.waits == [pytest.approx(PACK + QUEUE + 900.0)]
    # Reconcile saw the node Ready with its GPU on the first minute after it joined, and recorded the boot.
    [boot] = run.store.boot_times("gpu", run.clock.now().replace(year=2000))
    assert boot.instance_type == "g4dn.xlarge"
    assert 900.0 <= boot.to_gpus.total_seconds() <= 960.0


def test_a_bad_boot_times_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "boots.json"
    path.write_text(json.dumps([{"pool": "gpu"}]))
    with pytest.raises(BootTimesError, match="not a list of boot samples"):
        read_boot_times(path)
    trace = tmp_path / "t.csv"
    trace.write_text("name,arrival,duration,gpus,cpu,memory\np,0,60,1,1000,1024\n")
    result = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--format", "csv", "--boot-times", str(path),
                                      "--config", str(ROOT / "benchmarks" / "simulation" / "config.json"),
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "not a list of boot samples" in result.output

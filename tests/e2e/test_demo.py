"""`gpu-autoscaler demo --json`, end to end: the whole story on the emulator, checked from its summary.

One run (about half a minute); every assertion is on what the story observed through the Kubernetes API, EC2,
the functions' invocations and the dead-letter queues.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from gpu_autoscaler.cli.main import app
from tests.conftest import ROOT

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    log_dir: Path = tmp_path_factory.mktemp("demo")
    result = CliRunner().invoke(app, ["demo", "--json", "--config", str(_config_file(log_dir)), "--log-dir",
                                      str(log_dir)])
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _config_file(directory: Path) -> Path:
    path = directory / "config.json"
    path.write_text(json.dumps(json.loads((ROOT / "cdk.json").read_text())["context"]["gpu-autoscaler"]))
    return path


def test_the_summary_holds_the_contract_keys(demo: dict[str, Any]) -> None:
    assert {"podsPlaced", "instancesLaunched", "interruptionsHandled", "deadLetters"} <= set(demo["summary"])


def _story(demo: dict[str, Any]) -> str:
    """The narration and the function calls, for a failure message."""
    return "\n".join(f"{e['t']:6.1f} {e['text']}" for e in demo["timeline"] if e["kind"] != "pods")


def test_the_burst_is_placed_on_launched_instances(demo: dict[str, Any]) -> None:
    summary = demo["summary"]
    assert summary["podsPlaced"] > 0
    assert summary["podsPlaced"] == summary["podsCreated"], _story(demo)
    assert summary["instancesLaunched"] > 0
    assert summary["timeToCapacitySeconds"] is not None
    assert summary["gpuAllocation"]["peakAllocated"] >= 18  # 4 inference + 6 notebook slots + 8 gang GPUs


def test_the_spot_interruption_is_handled(demo: dict[str, Any]) -> None:
    summary = demo["summary"]
    assert summary["interruptionsHandled"] >= 1
    spot = summary["spotWarning"]
    assert spot["cordoned"] and spot["terminated"], _story(demo)


def test_nothing_lands_in_a_dead_letter_queue(demo: dict[str, Any]) -> None:
    assert demo["summary"]["deadLetters"] == 0, demo["summary"]["deadLetterMessages"]


def test_capacity_costs_less_at_the_end_than_at_the_peak(demo: dict[str, Any]) -> None:
    usd = demo["summary"]["usdPerHour"]
    assert usd["peak"] > 0
    if "consolidate" not in demo["summary"]["functionsMissing"]:
        assert usd["end"] < usd["peak"]


def test_the_timeline_tells_every_step(demo: dict[str, Any]) -> None:
    story = [e["text"] for e in demo["timeline"] if e["kind"] == "story"]
    for step in ("1.", "2.", "3.", "4.", "5."):
        assert any(text.startswith(step) for text in story), step
    kinds = {e["kind"] for e in demo["timeline"]}
    assert {"lambda", "ec2", "node", "pods"} <= kinds


def test_the_summary_counts_gpus_and_events_apart_and_the_headings_come_in_order(demo: dict[str, Any]) -> None:
    summary = demo["summary"]
    assert summary["speed"] > 1  # the summary says node boots ran this many times faster than on EC2
    physical = summary["physicalGpus"]
    assert 0 < physical["launched"] < physical["peakSlots"]  # time-sliced GPUs advertise several slots each
    assert summary["interruptionEvents"]["EC2 Spot Instance Interruption Warning"] == 1
    assert summary["interruptionEvents"]["EC2 Instance State-change Notification"] >= 1
    headings = [e["text"][:2] for e in demo["timeline"] if e["kind"] == "story" and e["text"][:1].isdigit()]
    assert headings == sorted(headings) and headings[:2] == ["1.", "2."]

"""`-o json` output: indented, read back as the data, and readable where the data is not ASCII."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gpu_autoscaler.cli.common import Output, emit

if TYPE_CHECKING:
    import pytest


def _no_table() -> None:
    raise AssertionError("the table is not asked for")


def test_json_output_reads_back_as_the_data_with_its_text_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """A reason such as "needs ≥ 2 GPUs" is printed as a person wrote it, not as `\\u2265`: JSON is UTF-8
    (RFC 8259 §8.1), and `jq`, Python and every SDK read it so."""
    data = {"unschedulable": [{"pod": "team-a/p0", "reason": "needs ≥ 2 GPUs × 80 GiB"}],
            "totalPricePerHour": 12.5, "claims": [{"id": "c-1", "pods": ["u0", "u1"]}], "empty": {}}
    emit(data, Output.json, _no_table)
    printed = capsys.readouterr().out
    assert json.loads(printed) == data
    assert "needs ≥ 2 GPUs × 80 GiB" in printed
    assert printed.startswith('{\n  "unschedulable": [\n    {\n      "pod": "team-a/p0",')


def test_json_output_writes_what_json_does_not_know_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    emit({"at": datetime(2026, 11, 22, 10, 0, tzinfo=UTC)}, Output.json, _no_table)
    assert json.loads(capsys.readouterr().out)["at"].startswith("2026-11-22")


def test_yaml_output_writes_times_as_json_output_does(capsys: pytest.CaptureFixture[str]) -> None:
    """A script that switches `-o json` for `-o yaml` reads the same text for a time (RFC 3339, as the
    Kubernetes API writes it), not Python's `str()` of it."""
    import yaml

    data = {"claims": [{"launchedAt": datetime(2026, 11, 22, 10, 0, 5, tzinfo=UTC), "id": "c-1"}]}
    emit(data, Output.json, _no_table)
    as_json = json.loads(capsys.readouterr().out)
    emit(data, Output.yaml, _no_table)
    assert yaml.safe_load(capsys.readouterr().out) == as_json == {
        "claims": [{"launchedAt": "2026-11-22T10:00:05Z", "id": "c-1"}]}



def test_every_command_takes_the_shared_output_option() -> None:
    """The README's Commands section: "`-o/--output json|yaml|table` on every command" (`snapshot` had `--json`
    alone: "No such option: -o")."""
    import importlib

    from typer.testing import CliRunner

    from gpu_autoscaler.cli.main import COMMANDS, app

    for name in COMMANDS:
        importlib.import_module(f"gpu_autoscaler.cli.{name}")
    failed = {}
    for name in COMMANDS:
        result = CliRunner().invoke(app, [name, "-o", "json", "--help"])
        if result.exit_code != 0:
            failed[name] = result.output[-200:]
    assert not failed, failed

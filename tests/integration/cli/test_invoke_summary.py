"""`invoke` on a fresh embedded AWS, as a first user runs it: a summary, the response, no tracebacks (issue 18)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import load_config
from gpu_autoscaler.emulator.aws import EmbeddedAws

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


def test_the_packer_sample_prints_what_it_did_and_no_logs() -> None:
    result = runner.invoke(app, ["invoke", "packer", str(ROOT / "events/packer-pending-pods.json"),
                                 "--config", str(ROOT / "cdk.json")])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"batchItemFailures": []}
    assert "Traceback" not in result.stderr and '"level"' not in result.stderr
    assert "packer: done" in result.stderr and "claims created: 3" in result.stderr
    assert "queue messages: launch +3" in result.stderr
    assert len(result.stderr.splitlines()) < 10


def test_the_spot_warning_sample_acts_on_capacity_launched_first() -> None:
    result = runner.invoke(app, ["invoke", "interruption", str(ROOT / "events/interruption-spot-warning.json"),
                                 "--launch-first", "--config", str(ROOT / "cdk.json")])
    assert result.exit_code == 0, result.stderr
    assert "the event's i-0f3a9c1e5b7d24680 is now i-" in result.stderr
    assert "claims moved: 1× Registered→" in result.stderr  # Draining (Terminated if the drain was that quick)
    assert "Traceback" not in result.stderr


def test_launch_first_says_so_when_the_capacity_does_not_register_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Going on with capacity still launching acted on other claims than the sample's warning is about (a flaky
    "claims moved" under load): when the wait runs out, the command stops with what it saw."""
    from gpu_autoscaler.cli import invoke

    monkeypatch.setattr(invoke, "LAUNCH_FIRST_WAIT_SECONDS", 0.0)
    result = runner.invoke(app, ["invoke", "interruption", str(ROOT / "events/interruption-spot-warning.json"),
                                 "--launch-first", "--config", str(ROOT / "cdk.json")])
    assert result.exit_code == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: --launch-first: the sample pods' capacity did not register within 0 s"), line
    assert "invoking" not in result.stderr and "Traceback" not in result.stderr


def test_what_moto_lacks_is_an_aws_error_not_a_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    with EmbeddedAws(load_config(ROOT / "cdk.json")) as aws:
        with pytest.raises(ClientError) as missing_service:
            aws.clients.for_region("us-east-1").client("pricing").get_products(ServiceCode="AmazonEC2")
        with pytest.raises(ClientError) as missing_action:
            aws.clients.client("ec2").describe_capacity_block_offerings(CapacityDurationHours=24,
                                                                         InstanceType="p5.48xlarge", InstanceCount=1)
    assert missing_service.value.response["Error"]["Code"] == "UnknownOperationException"
    assert missing_action.value.response["Error"]["Code"] == "InvalidAction"
    assert "Traceback" not in capfd.readouterr().err

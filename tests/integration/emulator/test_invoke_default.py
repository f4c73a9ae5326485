"""`gpu-autoscaler invoke` without --endpoint-url: each call starts its own embedded AWS.

No module emulator here: only one embedded server may run in a process at a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.naming import ResourceNames
from tests.conftest import example_config_data

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[3]


def test_default_runs_the_handler_on_a_fresh_embedded_aws_and_prints_its_response(
    functions_dir: Path, config_file: Path, event_file: Path
) -> None:
    result = runner.invoke(
        app, ["invoke", "echo", str(event_file), "--config", str(config_file), "--functions-dir", str(functions_dir)]
    )
    assert result.exit_code == 0, result.output
    response = json.loads(result.stdout)
    names = ResourceNames("ml-prod")
    assert response["settings"]["TABLE_NAME"] == names.table
    assert response["settings"]["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert response["settings"]["LAUNCH_TEMPLATE_ID"].startswith("lt-")
    assert response["tables"] == [names.table]
    assert response["messageId"]
    assert "fresh embedded AWS" in result.stderr


def test_without_config_the_working_directorys_cdk_json_is_read(
    functions_dir: Path, event_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    result = runner.invoke(app, ["invoke", "echo", str(event_file), "--functions-dir", str(functions_dir)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["functionName"] == ResourceNames("ml-prod").function("echo")


SERVE = """
import sys
from gpu_autoscaler.config import load_config
from gpu_autoscaler.emulator.aws import EmbeddedAws

with EmbeddedAws(load_config(sys.argv[1])) as aws:
    print(aws.endpoint_url, flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


def test_endpoint_url_reaches_an_emulator_in_another_process(
    functions_dir: Path, config_file: Path, event_file: Path
) -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(config_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdin is not None
        endpoint = server.stdout.readline().strip()
        assert endpoint.startswith("http://127.0.0.1:"), endpoint
        result = runner.invoke(app, [
            "invoke", "echo", str(event_file), "--config", str(config_file), "--functions-dir", str(functions_dir),
            "--endpoint-url", endpoint,
        ])
        assert result.exit_code == 0, result.output
        response = json.loads(result.stdout)
        assert response["settings"]["AWS_ENDPOINT_URL"] == endpoint
        assert response["tables"] == [ResourceNames("ml-prod").table]
        server.stdin.close()
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


@pytest.mark.skipif(
    not (ROOT / "functions" / "packer" / "handler.py").exists(), reason="functions/packer/handler.py not written yet"
)
def test_the_packer_handles_the_sample_pending_pods_event(config_file: Path) -> None:
    with EmbeddedAws(parse_config(example_config_data())) as emulator:
        result = runner.invoke(app, [
            "invoke", "packer", str(ROOT / "events" / "packer-pending-pods.json"), "--config", str(config_file),
            "--endpoint-url", emulator.endpoint_url,
        ])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"batchItemFailures": []}
        sqs = emulator.clients.client("sqs")
        messages = sqs.receive_message(QueueUrl=emulator.queue_url("launch"), MaxNumberOfMessages=10)["Messages"]
    requests = [LaunchRequest.model_validate_json(m["Body"]) for m in messages]
    assert requests and all(r.cluster == "ml-prod" for r in requests)

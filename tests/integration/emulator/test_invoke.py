"""`gpu-autoscaler invoke --endpoint-url` through Typer's runner, on this module's emulator.

The handlers (conftest) do real boto3 work from the environment they are given, as a deployed function
would, so each test shows where an invocation pointed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typer.testing import CliRunner

from gpu_autoscaler.cli.invoke import default_functions_dir
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.naming import ResourceNames

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[3]

def _invoke(*args: str, verbose: bool = False) -> Any:
    """`invoke`; the handler's own logs and metrics reach stderr only with `--verbose`."""
    return runner.invoke(app, [*(["--verbose"] if verbose else []), "invoke", *args])


def test_endpoint_url_runs_against_the_running_emulator(
    functions_dir: Path, config_file: Path, event_file: Path, aws: EmbeddedAws
) -> None:
    result = _invoke(
        "echo", str(event_file), "--config", str(config_file), "--functions-dir", str(functions_dir),
        "--endpoint-url", aws.endpoint_url, "--timeout", "5",
    )
    assert result.exit_code == 0, result.output
    response = json.loads(result.stdout)  # only the response: the handler's own prints went to stderr
    sqs = aws.clients.client("sqs")
    [message] = sqs.receive_message(QueueUrl=aws.queue_url("launch"))["Messages"]
    sqs.delete_message(QueueUrl=aws.queue_url("launch"), ReceiptHandle=message["ReceiptHandle"])
    assert message["MessageId"] == response["messageId"]
    assert json.loads(message["Body"]) == {"pod": "train-0", "gpus": 8}
    names = ResourceNames("ml-prod")
    assert response["shape"] == ["gpus", "pod"]
    assert response["settings"] == {
        "TABLE_NAME": names.table, "AWS_ENDPOINT_URL": aws.endpoint_url, "LAUNCH_TEMPLATE_ID": aws.launch_template_id,
    }
    assert response["tables"] == [names.table]
    assert response["functionName"] == names.function("echo")
    assert 0 < response["remainingMs"] <= 5_000
    assert "a log line on stdout" not in result.stderr and '"handled"' not in result.stderr
    assert f"the emulator at {aws.endpoint_url}" in result.stderr
    assert "echo: done" in result.stderr and "queue messages: launch +1" in result.stderr
    verbose = _invoke("echo", str(event_file), "--config", str(config_file), "--functions-dir", str(functions_dir),
                      "--endpoint-url", aws.endpoint_url, "--timeout", "5", verbose=True)
    assert "a log line on stdout" in verbose.stderr and '"handled"' in verbose.stderr
    for message in sqs.receive_message(QueueUrl=aws.queue_url("launch"), MaxNumberOfMessages=10)["Messages"]:
        sqs.delete_message(QueueUrl=aws.queue_url("launch"), ReceiptHandle=message["ReceiptHandle"])


def test_each_invocation_is_a_cold_start(
    functions_dir: Path, config_file: Path, event_file: Path, aws: EmbeddedAws
) -> None:
    args = ("echo", str(event_file), "--config", str(config_file), "--functions-dir", str(functions_dir),
            "--endpoint-url", aws.endpoint_url)
    environment = dict(os.environ)
    first, second = json.loads(_invoke(*args).stdout), json.loads(_invoke(*args).stdout)
    assert first["callsSinceImport"] == second["callsSinceImport"] == 1
    assert dict(os.environ) == environment  # the function's variables were for the call only
    assert "helper" not in sys.modules and not {m for m in sys.modules if m.startswith("_gpu_autoscaler_function")}
    assert first["requestId"] != second["requestId"]
    aws.clients.client("sqs").purge_queue(QueueUrl=aws.queue_url("launch"))


def test_powertools_logs_and_metrics_go_to_stderr_on_every_invocation(
    functions_dir: Path, config_file: Path, event_file: Path, aws: EmbeddedAws
) -> None:
    args = ("powertools", str(event_file), "--config", str(config_file), "--functions-dir", str(functions_dir),
            "--endpoint-url", aws.endpoint_url)
    for _ in range(2):  # the second import must configure its Logger afresh, not find the first one's
        result = _invoke(*args, verbose=True)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"placed": 8}
        log = next(json.loads(line) for line in result.stderr.splitlines() if '"placing pods"' in line)
        assert log["service"] == "powertools"
        assert log["function_name"] == ResourceNames("ml-prod").function("powertools")
        assert log["pods"] == 8
        emf = next(json.loads(line) for line in result.stderr.splitlines() if '"PodsPlaced"' in line)
        assert emf["_aws"]["CloudWatchMetrics"][0]["Namespace"] == ResourceNames("ml-prod").metrics_namespace


def test_a_handler_exception_is_a_clear_error_and_a_failing_exit(
    functions_dir: Path, config_file: Path, event_file: Path, aws: EmbeddedAws
) -> None:
    result = _invoke("boom", str(event_file), "--config", str(config_file), "--functions-dir", str(functions_dir),
                     "--endpoint-url", aws.endpoint_url)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "boom handler raised ValueError: pod train-0 requests 'lots' of nvidia.com/gpu" in result.stderr
    assert "Traceback" not in result.stderr
    verbose = _invoke("boom", str(event_file), "--config", str(config_file), "--functions-dir", str(functions_dir),
                      "--endpoint-url", aws.endpoint_url, "--traceback")
    assert verbose.exit_code == 1 and "Traceback" in verbose.stderr


def test_an_unknown_function_lists_the_ones_there_are(functions_dir: Path, config_file: Path, event_file: Path) -> None:
    result = _invoke("packr", str(event_file), "--config", str(config_file), "--functions-dir", str(functions_dir))
    assert result.exit_code == 2
    assert "functions present: boom, echo" in result.stderr
    assert "packer" in result.stderr


def test_an_event_that_is_not_json_is_refused_before_anything_starts(
    functions_dir: Path, config_file: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{'Records': ")
    result = _invoke("echo", str(broken), "--config", str(config_file), "--functions-dir", str(functions_dir))
    assert result.exit_code == 2
    assert "not valid JSON" in result.stderr


def test_an_invalid_configuration_names_the_field(
    functions_dir: Path, event_file: Path, tmp_path: Path, config_data: dict[str, Any]
) -> None:
    config_data["nodePools"][0]["requirements"][0]["operator"] = "Gt"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config_data))
    result = _invoke("echo", str(event_file), "--config", str(path), "--functions-dir", str(functions_dir))
    assert result.exit_code == 2
    assert "nodePools[0].requirements[0]" in result.stderr


def test_an_endpoint_without_the_stack_is_reported(
    functions_dir: Path, event_file: Path, tmp_path: Path, config_data: dict[str, Any], aws: EmbeddedAws
) -> None:
    config_data["clusterName"] = "ml-staging"
    path = tmp_path / "staging.json"
    path.write_text(json.dumps(config_data))
    result = _invoke("echo", str(event_file), "--config", str(path), "--functions-dir", str(functions_dir),
                     "--endpoint-url", aws.endpoint_url)
    assert result.exit_code == 1
    assert "ml-staging-gpu-autoscaler" in result.stderr and "not found" in result.stderr


def test_aws_and_endpoint_url_together_are_refused(functions_dir: Path, event_file: Path) -> None:
    result = _invoke("echo", str(event_file), "--aws", "--endpoint-url", "http://127.0.0.1:1")
    assert result.exit_code == 2
    assert "not both" in result.output


def test_the_default_functions_directory_is_the_projects() -> None:
    assert default_functions_dir() == ROOT / "functions"

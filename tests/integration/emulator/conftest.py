"""One embedded AWS per test module (starting moto and creating the stack takes about a second), and
handlers written for the `invoke` tests in a temporary functions directory."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture(scope="module")
def example_config() -> Config:
    return parse_config(example_config_data())


@pytest.fixture(scope="module")
def aws(example_config: Config) -> Iterator[EmbeddedAws]:
    with EmbeddedAws(example_config) as embedded:
        yield embedded


ECHO = '''
import json
import os
import sys

import boto3

from helper import shape  # a sibling module, importable as in Lambda

SETTINGS_AT_IMPORT = {k: os.environ.get(k) for k in ("TABLE_NAME", "AWS_ENDPOINT_URL", "LAUNCH_TEMPLATE_ID")}
CALLS = []
print("a log line on stdout", file=sys.stdout)


def handler(event, context):
    sqs = boto3.client("sqs")
    sent = sqs.send_message(QueueUrl=os.environ["LAUNCH_QUEUE_URL"], MessageBody=json.dumps(event))
    tables = boto3.client("dynamodb").list_tables()["TableNames"]
    print(json.dumps({"level": "INFO", "message": "handled"}))
    CALLS.append(context.aws_request_id)
    return {
        "callsSinceImport": len(CALLS),
        "shape": shape(event),
        "settings": SETTINGS_AT_IMPORT,
        "tables": tables,
        "messageId": sent["MessageId"],
        "functionName": context.function_name,
        "remainingMs": context.get_remaining_time_in_millis(),
        "requestId": context.aws_request_id,
    }
'''

POWERTOOLS = '''
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

logger = Logger()
metrics = Metrics()


@metrics.log_metrics
@logger.inject_lambda_context
def handler(event, context):
    logger.info("placing pods", extra={"pods": event["gpus"]})
    metrics.add_metric(name="PodsPlaced", unit=MetricUnit.Count, value=event["gpus"])
    return {"placed": event["gpus"]}
'''

BOOM = '''
def handler(event, context):
    raise ValueError(f"pod {event['pod']} requests 'lots' of nvidia.com/gpu")
'''


@pytest.fixture
def functions_dir(tmp_path: Path) -> Path:
    root = tmp_path / "functions"
    (root / "echo").mkdir(parents=True)
    (root / "echo" / "handler.py").write_text(textwrap.dedent(ECHO))
    (root / "echo" / "helper.py").write_text("def shape(event):\n    return sorted(event)\n")
    (root / "powertools").mkdir()
    (root / "powertools" / "handler.py").write_text(textwrap.dedent(POWERTOOLS))
    (root / "boom").mkdir()
    (root / "boom" / "handler.py").write_text(textwrap.dedent(BOOM))
    return root


@pytest.fixture
def config_file(tmp_path: Path, config_data: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_data))
    return path


@pytest.fixture
def event_file(tmp_path: Path) -> Path:
    path = tmp_path / "event.json"
    path.write_text(json.dumps({"pod": "train-0", "gpus": 8}))
    return path

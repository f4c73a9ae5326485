"""`gpu-autoscaler status` against a running embedded AWS, through Typer's runner (issue 18 part 2)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from typer.testing import CliRunner

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import load_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.models.claims import NodeClaim

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


def test_status_reads_the_table_and_queues_and_says_what_it_cannot_see() -> None:
    config_file = ROOT / "cdk.json"
    with EmbeddedAws(load_config(config_file)) as aws:
        store = DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, "ml-prod")
        store.create_claim(NodeClaim(cluster="ml-prod", id="nc-1", pool="gpu-burst", capacity_type="spot",
                                     zones=("us-east-1a",), instance_types=("g6.xlarge",), price_per_hour=0.4,
                                     created_at=datetime.now(UTC), warm="forecast"))
        aws.clients.client("sqs").send_message(QueueUrl=aws.queue_url("drain-dlq"), MessageBody="{}")
        result = runner.invoke(app, ["status", "--endpoint-url", aws.endpoint_url, "--config", str(config_file),
                                     "--json"])
        table = runner.invoke(app, ["status", "--endpoint-url", aws.endpoint_url, "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    burst = report["pools"]["gpu-burst"]
    assert burst["claims"] == {"Pending": 1} and burst["inFlight"][0]["claim"] == "nc-1"
    assert burst["warm"] == [{"claim": "nc-1", "why": "forecast", "state": "Pending"}]
    assert report["deadLetters"]["drain-dlq"] == 1 and report["pendingGpuPods"] is None
    assert table.exit_code == 0 and "gpu-burst" in table.stdout and "give --kubeconfig" in table.stdout


def test_status_needs_a_deployment_and_cost_needs_kubernetes() -> None:
    alone = runner.invoke(app, ["status"])
    assert alone.exit_code == 2 and "--endpoint-url" in alone.stderr and "Traceback" not in alone.stderr
    label = runner.invoke(app, ["status", "--aws", "--cost", "--by", "label"])
    assert label.exit_code == 2 and "label KEY" in label.stderr

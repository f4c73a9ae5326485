"""The prewarm handler on the embedded AWS (moto server): configuration from SSM, catalog from EC2, claims in
DynamoDB, launch requests on SQS — a window's warm capacity launched, held, and released when it closes."""

from __future__ import annotations

import json
import logging
import warnings
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.aws import eks_token
from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.adapters.aws.tick_leases import DynamoTickLeases
from gpu_autoscaler.cli.invoke import default_functions_dir, handler_path, run_handler
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.forecast import bucket_start
from gpu_autoscaler.domain.prewarm import WARM_GPUS_ATTRIBUTE, window_warm
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.models.leases import Lease
from gpu_autoscaler.services import tick_lease
from gpu_autoscaler.services.prewarm import RELEASED_ATTRIBUTE, InvalidTick
from tests.conftest import ROOT, example_config_data
from tests.emf import metric_values

if TYPE_CHECKING:
    from collections.abc import Iterator


WINDOW = "weekday-inference-peak"
WARM = window_warm(WINDOW)


def with_window(schedule: str, duration: str = "2h") -> Config:
    """The example configuration, its window's schedule replaced (the handler reads the real clock)."""
    data = example_config_data()
    data["scalingWindows"][0].update(schedule=schedule, duration=duration)
    return parse_config(data)


ALWAYS_OPEN = with_window("cron(0 * * * ? *)")  # hourly openings lasting 2 h: open whenever the test runs
NEVER_OPEN = with_window("cron(0 0 1 1 ? 2199)")


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    with EmbeddedAws(ALWAYS_OPEN) as embedded:
        yield embedded


@pytest.fixture(autouse=True)
def no_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    """prewarm is no Kubernetes client (the stack gives its role no cluster access): every test here runs with
    the one way the functions reach the Kubernetes API (`eks_token.eks_api_client`, the pod Events' and the
    cluster's) refused."""

    def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("prewarm reached for the Kubernetes API, which its role has no access to")

    monkeypatch.setattr(eks_token, "eks_api_client", refused)


def set_config(aws: EmbeddedAws, config: Config) -> None:
    aws.clients.client("ssm").put_parameter(Name=aws.config_parameter, Value=config.to_json(), Type="String",
                                            Tier="Advanced", Overwrite=True)


def invoke(aws: EmbeddedAws, event: Any) -> Any:
    path = handler_path(default_functions_dir(), "prewarm")
    return run_handler(path, "prewarm", event, aws.function_environment("prewarm"), region=aws.config.region)


def store(aws: EmbeddedAws) -> Any:
    return DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, aws.config.cluster_name)


def launch_requests(aws: EmbeddedAws) -> list[dict[str, Any]]:
    sqs = aws.clients.client("sqs")
    out: list[dict[str, Any]] = []
    while True:
        batch = sqs.receive_message(QueueUrl=aws.queue_url("launch"), MaxNumberOfMessages=10).get("Messages", [])
        if not batch:
            return out
        for message in batch:
            out.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=aws.queue_url("launch"), ReceiptHandle=message["ReceiptHandle"])


def test_a_window_warms_its_pool_holds_it_and_releases_it_when_closed(aws: EmbeddedAws) -> None:
    event = json.loads((ROOT / "events" / "prewarm-window.json").read_text())
    summary = invoke(aws, event)
    assert summary["trigger"] == "window" and summary["window"] == WINDOW
    assert summary["pools"]["gpu-burst"]["windows"] == {WINDOW: 8}
    launched = {item["claim"] for item in summary["launched"]}
    assert launched and {item["warm"] for item in summary["launched"]} == {WARM}
    claims = [c for c in store(aws).list_claims() if c.warm == WARM]
    assert {c.id for c in claims} == launched
    assert sum(float(c.attributes[WARM_GPUS_ATTRIBUTE]) for c in claims) >= 8
    assert all(c.pool == "gpu-burst" and c.pods == () for c in claims)
    assert sorted(i for r in launch_requests(aws) for i in r["claimIds"]) == sorted(launched)
    # Prediction is on in the example, but the table holds no demand history yet.
    assert summary["forecastStatus"] == "insufficient-history"

    again = invoke(aws, {"trigger": "rate"})
    assert again["launched"] == [] and again["pools"]["gpu-burst"]["heldGpus"][WARM] >= 8

    set_config(aws, NEVER_OPEN)
    try:
        closed = invoke(aws, {"trigger": "rate"})
    finally:
        set_config(aws, ALWAYS_OPEN)
    assert {item["claim"] for item in closed["released"]} == launched
    for claim in store(aws).list_claims():
        if claim.id in launched:
            assert claim.warm is None and claim.attributes[RELEASED_ATTRIBUTE] == WARM


def test_a_pool_with_a_day_of_demand_history_is_forecast(aws: EmbeddedAws) -> None:
    state = store(aws)
    now = bucket_start(datetime.now(UTC))
    # 26 hours of 3 GPUs in the shared pool, and the bucket under way: the handler forecasts from the buckets
    # complete at its own now, which is the next bucket's when the records take it past a 5-minute boundary
    # (the current one then counts, empty, and the level falls to 2.5).
    for i in range(26 * 12 + 1):
        state.record_demand("gpu-shared", now - i * timedelta(minutes=5), 3.0, timedelta(days=14))
    summary = invoke(aws, {"trigger": "rate"})
    assert summary["forecastStatus"] == "partial"
    assert summary["pools"]["gpu-shared"]["forecast"]["status"] == "ok"
    assert summary["pools"]["gpu-shared"]["forecast"]["gpus"] == pytest.approx(3.0)
    assert summary["pools"]["gpu-burst"]["forecast"]["status"] == "insufficient-history"


def test_a_malformed_tick_is_a_clear_error(aws: EmbeddedAws, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No application metrics")
        with pytest.raises(InvalidTick, match="must name its window"):
            invoke(aws, {"trigger": "window"})
    assert metric_values(capsys.readouterr().err, "TicksRejected") == [1]


def test_a_tick_that_finds_another_holding_the_lease_skips_and_returns_normally(
        aws: EmbeddedAws, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """Nothing but the lease keeps two ticks apart (the function reserves no concurrency): the one that finds it
    held buys nothing, logs and counts that it skipped, and returns normally (an error would be retried)."""
    leases = DynamoTickLeases(aws.clients.client("dynamodb"), aws.table_name, aws.config.cluster_name)
    now = datetime.now(UTC)
    running = Lease(name="prewarm", holder="another-request", expires_at=now + timedelta(minutes=2))
    assert leases.take(running, now) is None
    before = {c.id for c in store(aws).list_claims()}
    launch_requests(aws)
    capsys.readouterr()
    # The service's logger, imported with this module: one made by an invocation is forgotten after it
    # (`emulator.handlers.cold_start`), and a new one of its name would not be the one the service logs to.
    caplog.set_level(logging.INFO, logger=tick_lease.logger.name)
    try:
        summary = invoke(aws, {"trigger": "window", "window": WINDOW})
    finally:
        assert leases.release(running)
    assert summary["skipped"] is True and summary["leaseHolder"] == "another-request"
    assert {c.id for c in store(aws).list_claims()} == before and launch_requests(aws) == []
    assert metric_values(capsys.readouterr().err, "TicksSkipped") == [1]
    assert any("another-request" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_a_tick_gives_its_lease_back(aws: EmbeddedAws) -> None:
    leases = DynamoTickLeases(aws.clients.client("dynamodb"), aws.table_name, aws.config.cluster_name)
    invoke(aws, {"trigger": "rate"})
    now = datetime.now(UTC)
    mine = Lease(name="prewarm", holder="test", expires_at=now + timedelta(minutes=2))
    assert leases.take(mine, now) is None
    assert leases.release(mine)

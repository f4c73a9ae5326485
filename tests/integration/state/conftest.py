"""The state-store contract tests' fixtures: each store in turn, the DynamoDB one on moto, each test in a
partition of its own (the table is shared by the module)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.config import parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.ports import StateStore

START = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    with EmbeddedAws(parse_config(example_config_data())) as embedded:
        yield embedded


@pytest.fixture(params=["memory", "dynamodb"])
def clock_and_store(request: pytest.FixtureRequest, aws: EmbeddedAws) -> tuple[FixedClock, StateStore]:
    clock = FixedClock(START)
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    if request.param == "memory":
        return clock, MemoryStateStore(cluster, clock)
    return clock, DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, cluster, clock=clock)

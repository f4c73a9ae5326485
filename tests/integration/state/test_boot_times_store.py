"""Measured boot times in the state store: the DynamoDB store on moto and the in-memory one answer alike."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.models.boot import BootSample
from gpu_autoscaler.simulation.settings import read_boot_times
from tests.conftest import ROOT
from tests.integration.state.conftest import START

if TYPE_CHECKING:
    from pathlib import Path

    from gpu_autoscaler.clock import FixedClock
    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.ports import StateStore

def sample(claim_id: str, launched: datetime, seconds: float = 300, pool: str = "gpu") -> BootSample:
    return BootSample(pool=pool, instance_type="g6.xlarge", claim_id=claim_id, instance_id=f"i-{claim_id}",
                      capacity_type="spot", zone="us-east-1a", launched_at=launched,
                      ready_at=launched + timedelta(seconds=seconds - 30),
                      gpus_allocatable_at=launched + timedelta(seconds=seconds))


def test_boot_samples_are_kept_per_pool_the_first_per_claim_until_their_ttl(
        clock_and_store: tuple[FixedClock, StateStore]) -> None:
    clock, store = clock_and_store
    ttl = timedelta(days=14)
    early = sample("a", START - timedelta(days=3))
    store.record_boot_time(early, ttl)
    store.record_boot_time(sample("b", START - timedelta(days=1)), ttl)
    store.record_boot_time(sample("b", START - timedelta(days=1), seconds=420), ttl)  # the first one stays
    store.record_boot_time(sample("c", START, pool="other"), ttl)
    found = store.boot_times("gpu", START - timedelta(days=14))
    assert [(s.claim_id, s.to_gpus.total_seconds()) for s in found] == [("a", 300.0), ("b", 300.0)]
    assert found[0] == early
    assert [s.claim_id for s in store.boot_times("gpu", START - timedelta(days=2))] == ["b"]
    assert [s.claim_id for s in store.boot_times("other", START - timedelta(days=14))] == ["c"]
    clock.advance(ttl + timedelta(seconds=1))
    assert store.boot_times("gpu", START - timedelta(days=30)) == []


def test_exported_boots_are_a_file_the_simulator_reads(aws: EmbeddedAws, tmp_path: Path) -> None:
    """scripts/export_boot_times.py reads every pool's samples from the table into the simulator's file shape."""
    config = aws.config
    store = DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, config.cluster_name)
    now = datetime.now(UTC)
    for i, pool in enumerate(p.name for p in config.node_pools):
        store.record_boot_time(sample(f"x{i}", now - timedelta(hours=1), seconds=200 + 100 * i, pool=pool),
                               timedelta(days=1))
    config_file = tmp_path / "config.json"
    config_file.write_text(config.to_json())
    out = tmp_path / "boots.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "export_boot_times.py"), "--config", str(config_file),
         "--out", str(out), "--days", "1"],
        env={**os.environ, **aws.function_environment()}, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert read_boot_times(out) == {"g6.xlarge": tuple(200.0 + 100 * i for i in range(len(config.node_pools)))}

"""The simulator's state store answers boot-time reads exactly as the in-memory store does."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.models.boot import BootSample
from gpu_autoscaler.simulation.store import SimulationStateStore

START = datetime(2026, 1, 1, tzinfo=UTC)


def _sample(pool: str, claim: str, launched: datetime) -> BootSample:
    return BootSample(pool=pool, instance_type="g6.xlarge", claim_id=claim, launched_at=launched,
                      ready_at=launched + timedelta(seconds=200), gpus_allocatable_at=launched + timedelta(seconds=260))


def test_boot_times_match_the_memory_store_through_records_and_expiry() -> None:
    rng = random.Random(3)
    clock = FixedClock(START)
    memory = MemoryStateStore("c", clock)
    simulated = SimulationStateStore("c", clock, history_from=START, buckets=10)
    now = START
    for step in range(400):
        now += timedelta(minutes=rng.randint(0, 90))
        clock.set(now)
        if rng.random() < 0.6:
            launched = now - timedelta(minutes=rng.randint(5, 30))
            sample = _sample(rng.choice(["a", "b"]), f"c{rng.randint(0, 300)}", launched)  # repeats: first stays
            ttl = timedelta(hours=rng.choice([6, 24]))
            memory.record_boot_time(sample, ttl)
            simulated.record_boot_time(sample, ttl)
        since = now - timedelta(hours=rng.choice([1, 12, 48]))
        for pool in ("a", "b", "z"):
            before = simulated.boot_window(pool, since)
            assert simulated.boot_times(pool, since) == memory.boot_times(pool, since), step
            assert simulated.boot_window(pool, since) == before


def test_the_boot_window_changes_when_a_sample_comes_or_goes() -> None:
    clock = FixedClock(START)
    store = SimulationStateStore("c", clock, history_from=START, buckets=10)
    since = START - timedelta(days=1)
    empty = store.boot_window("a", since)
    store.record_boot_time(_sample("a", "c1", START), timedelta(hours=1))
    recorded = store.boot_window("a", since)
    assert recorded != empty
    clock.set(START + timedelta(hours=2))
    assert store.boot_window("a", since) != recorded
    assert store.boot_times("a", since) == []

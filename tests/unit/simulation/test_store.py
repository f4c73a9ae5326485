"""The simulator's state store answers boot-time reads exactly as the in-memory store does, and the simulated
prewarm reads demand series exactly as the service's window would."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.config import MeasuredLeadTime
from gpu_autoscaler.domain.boot_times import lead_time, lead_time_of
from gpu_autoscaler.domain.forecast import BUCKET, DemandSeries, Forecaster
from gpu_autoscaler.models.boot import BootSample
from gpu_autoscaler.services.prewarm import PrewarmService
from gpu_autoscaler.simulation.services import EventQueue, SimulatedPrewarm
from gpu_autoscaler.simulation.sparse_forecast import SparseForecaster, SparseSeries
from gpu_autoscaler.simulation.store import SimulationStateStore
from tests.unit.simulation.builders import make_catalog, make_config, make_pool

START = datetime(2026, 1, 1, tzinfo=UTC)


def _sample(pool: str, claim: str, launched: datetime, gpus_after: float = 260.0) -> BootSample:
    return BootSample(pool=pool, instance_type="g6.xlarge", claim_id=claim, launched_at=launched,
                      ready_at=launched + timedelta(seconds=200),
                      gpus_allocatable_at=launched + timedelta(seconds=max(200.0, gpus_after)))


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
            sample = _sample(rng.choice(["a", "b"]), f"c{rng.randint(0, 300)}", launched,  # repeats: first stays
                             rng.uniform(200, 900))
            ttl = timedelta(hours=rng.choice([6, 24]))
            memory.record_boot_time(sample, ttl)
            simulated.record_boot_time(sample, ttl)
        since = now - timedelta(hours=rng.choice([1, 12, 48]))
        for pool in ("a", "b", "z"):
            before = simulated.boot_window(pool, since)
            expected = memory.boot_times(pool, since)
            assert simulated.boot_times(pool, since) == expected, step
            assert simulated.boot_seconds(pool, since) == [s.to_gpus.total_seconds() for s in expected], step
            assert simulated.boot_window(pool, since) == before
            pool_config = make_config(make_pool(pool)).node_pools[0]
            settings = MeasuredLeadTime(min_samples=3)
            assert lead_time_of(pool_config, simulated.boot_seconds(pool, since), settings) == \
                lead_time(pool_config, expected, settings)


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


def test_the_simulated_prewarm_reads_each_series_as_its_window_through_ticks_and_growth() -> None:
    """The tick's bucket indices, found once per (since, now), give every series what `window` gives — also
    after a series grew past the buckets it was made with (a new array, the same start)."""
    rng = random.Random(5)
    clock = FixedClock(START)
    store = SimulationStateStore("c", clock, history_from=START, buckets=20)
    config = make_config(make_pool("gpu"))
    prewarm = SimulatedPrewarm(store.series, config, store, EventQueue(lambda *_: None, 0.0),
                               make_catalog().instance_types, plan_capacity=lambda pods: [], clock=clock)
    keys = ["gpu", "gpu/1", "gpu/2", "never"]
    now = START
    for step in range(300):
        now += BUCKET * rng.randint(0, 3) + timedelta(seconds=rng.randint(0, 299))
        clock.set(now)
        for key in keys[:3]:
            if rng.random() < 0.5:
                store.record_demand(key, now - BUCKET * rng.randint(0, 4), rng.choice([0.0, 1.0, 2.5]), BUCKET)
        since = rng.choice([now - timedelta(hours=1), now - timedelta(hours=48), START])  # moving, or fixed
        for key in keys:
            got = prewarm._history(key, since, now)
            want = store.series(key).window(since, now)
            assert (got.start, got.first_record, got.values.tolist()) == \
                (want.start, want.first_record, want.values.tolist()), (step, key)


def test_the_sparse_forecaster_gives_the_domain_forecasters_numbers_on_sparse_series() -> None:
    """`SparseForecaster` reads a shape class's series from its non-zero buckets: every field of every forecast
    equals the domain forecaster's on the same window — sparse and busier series, records starting late,
    windows clipped at the series' start, quantiles whose sample falls among the zeros or past them, and a level
    weight below zero (where a quiet profile and a quiet recent level no longer mean no forecast)."""
    rng = random.Random(11)
    clock = FixedClock(START)
    store = SimulationStateStore("c", clock, history_from=START, buckets=50)
    config = make_config(make_pool("gpu"))
    prewarm = SimulatedPrewarm(store.series, config, store, EventQueue(lambda *_: None, 0.0),
                               make_catalog().instance_types, plan_capacity=lambda pods: [], clock=clock)
    density = {"gpu/1d-t0": 0.02, "gpu/2d-t1": 0.3, "gpu/4d-t0": 0.9}
    late = START + timedelta(days=2, minutes=35)
    for i in range(int(timedelta(days=24) / BUCKET)):
        moment = START + i * BUCKET
        for key, chance in density.items():
            if (key != "gpu/4d-t0" or moment >= late) and rng.random() < chance:
                store.record_demand(key, moment, rng.choice([0.0, 1.0, 2.0, 4.0, 2.5]), BUCKET)
    compared = 0
    for quantile, tolerance, weight in ((0.9, timedelta(minutes=10), 0.5), (0.5, timedelta(minutes=5), 0.5),
                                        (0.97, BUCKET * 0, 0.5), (0.9, timedelta(minutes=10), -0.5)):
        domain = Forecaster(quantile, tolerance=tolerance, level_weight=weight)
        sparse = SparseForecaster.like(domain)
        for _ in range(150):
            now = START + timedelta(days=rng.uniform(0.5, 24))
            since = now - rng.choice([timedelta(days=14), timedelta(days=3), timedelta(days=30)])
            target = now + timedelta(minutes=rng.choice([5, 8, 13, 60]))
            for key in density:
                window = prewarm._history(key, since, now)
                assert isinstance(window, SparseSeries)
                plain = DemandSeries(window.start, window.values, window.first_record)
                assert sparse.forecast(window, now, target, "gpu") == domain.forecast(plain, now, target, "gpu")
                compared += 1
    assert compared == 4 * 150 * 3


def test_the_sparse_forecaster_gives_the_domain_forecasters_numbers_across_a_clock_change() -> None:
    """With a time zone, a history holding one of its clock changes is read by local time (the domain forecaster);
    one without is read sparsely: the same numbers either way."""
    rng = random.Random(5)
    start = datetime(2026, 2, 20, tzinfo=UTC)  # New York springs forward on 8 March
    clock = FixedClock(start)
    store = SimulationStateStore("c", clock, history_from=start, buckets=50)
    config = make_config(make_pool("gpu"))
    prewarm = SimulatedPrewarm(store.series, config, store, EventQueue(lambda *_: None, 0.0),
                               make_catalog().instance_types, plan_capacity=lambda pods: [], clock=clock)
    for i in range(int(timedelta(days=30) / BUCKET)):
        if rng.random() < 0.3:
            store.record_demand("gpu/2d-t1", start + i * BUCKET, rng.choice([1.0, 2.0, 4.0]), BUCKET)
    domain = Forecaster(0.9, zone=ZoneInfo("America/New_York"))
    sparse = SparseForecaster.like(domain)
    for _ in range(200):
        now = start + timedelta(days=rng.uniform(2, 30))
        target = now + timedelta(minutes=rng.choice([5, 8, 60]))
        window = prewarm._history("gpu/2d-t1", now - timedelta(days=14), now)
        plain = DemandSeries(window.start, window.values, window.first_record)
        assert sparse.forecast(window, now, target, "gpu") == domain.forecast(plain, now, target, "gpu")


def test_the_simulated_prewarm_reads_the_shape_classes_with_demand_as_the_service_does() -> None:
    """`SimulatedPrewarm._shape_histories` yields what the service's does (the classes, in order, whose window
    has a record and some demand, with that window) from the store's bookkeeping, through ticks that move the
    window past old demand, zeros recorded (a record, no demand), classes never recorded or first recorded late
    (the list of recorded classes must not go stale) and series grown past their buckets; and `holds_demand` is
    the series' `values[lo:hi].any()` for any bounds."""
    rng = random.Random(8)
    clock = FixedClock(START)
    store = SimulationStateStore("c", clock, history_from=START, buckets=20)
    config = make_config(make_pool("gpu"))
    pool = config.node_pools[0]
    prewarm = SimulatedPrewarm(store.series, config, store, EventQueue(lambda *_: None, 0.0),
                               make_catalog().instance_types, plan_capacity=lambda pods: [], clock=clock)
    recorders = (("gpu/1d-t0", 0.1, [1.0, 2.5], 0), ("gpu/2d-t1", 0.4, [0.0, 4.0], 0), ("gpu/4d-t2", 0.5, [0.0], 0),
                 ("gpu/8d-t0", 0.2, [3.0], 150), ("gpu/1d-t3", 0.3, [0.0, 1.0], 250))
    now = START
    yielded: set[str] = set()
    for step in range(400):
        now += BUCKET * rng.randint(0, 6) + timedelta(seconds=rng.randint(0, 299))
        clock.set(now)
        for key, chance, values, first_step in recorders:
            if step >= first_step and rng.random() < chance:
                store.record_demand(key, now - BUCKET * rng.randint(0, 4), rng.choice(values), BUCKET)
        since = rng.choice([now - timedelta(hours=1), now - timedelta(hours=6), START])
        got = [(cls, (h.start, h.first_record, h.values.tolist())) for cls, h in
               prewarm._shape_histories(pool, since, now)]
        want = [(cls, (h.start, h.first_record, h.values.tolist())) for cls, h in
                PrewarmService._shape_histories(prewarm, pool, since, now)]
        assert got == want, step
        for cls, _ in got:
            window = store.series(f"gpu/{cls}").window(since, now)
            assert window.first_record is not None and window.values.any()
        yielded.update(cls for cls, _ in got)
        for key, *_ in recorders:
            held = store.series(key).values
            lo = rng.randint(0, held.size + 3)
            hi = rng.randint(lo - 2, held.size + 5)
            assert store.holds_demand(key, lo, hi) == bool(held[lo:max(lo, hi)].any()), (step, key, lo, hi)
    assert yielded == {"1d-t0", "2d-t1", "8d-t0", "1d-t3"}


def test_the_sparse_forecaster_skips_the_median_only_where_it_cannot_move_the_forecast() -> None:
    """A quiet target and a quiet recent level give no forecast with a level weight of zero or more, whatever the
    usual level (`SparseForecaster` then leaves its median out); with a weight below zero a busy usual level raises
    one, as in the domain forecaster. Demand every day at 10:05 but today; now 10:15, the target 10:20; the profiles
    read the very bucket of the time of day."""
    clock = FixedClock(START)
    store = SimulationStateStore("c", clock, history_from=START, buckets=50)
    config = make_config(make_pool("gpu"))
    prewarm = SimulatedPrewarm(store.series, config, store, EventQueue(lambda *_: None, 0.0),
                               make_catalog().instance_types, plan_capacity=lambda pods: [], clock=clock)
    ten = START.replace(hour=10, minute=0, second=0, microsecond=0) + timedelta(days=1)
    for day in range(20):
        store.record_demand("gpu/1d-t0", ten + timedelta(days=day, minutes=5), 2.0, BUCKET)
    now = ten + timedelta(days=20, minutes=15)
    target = now + timedelta(minutes=5)
    window = prewarm._history("gpu/1d-t0", now - timedelta(days=14), now)
    assert isinstance(window, SparseSeries)
    plain = DemandSeries(window.start, window.values, window.first_record)
    for weight, expected in ((0.5, 0.0), (0.0, 0.0), (-0.5, 1.0)):
        domain = Forecaster(0.9, tolerance=BUCKET * 0, level_weight=weight)
        want = domain.forecast(plain, now, target, "gpu")
        assert (want.profile, want.level, want.gpus) == (0.0, 0.0, expected), weight
        assert SparseForecaster.like(domain).forecast(window, now, target, "gpu") == want, weight

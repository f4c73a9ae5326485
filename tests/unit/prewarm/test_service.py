"""The prewarm service with the real packer solver over a small catalog, an in-memory store and queue."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import pytest

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.consolidation import warm_held, warm_until
from gpu_autoscaler.domain.packing.results import REQUESTS_ATTRIBUTE
from gpu_autoscaler.domain.packing.solver import Solver
from gpu_autoscaler.domain.prewarm import FORECAST_HOLD, FORECAST_WARM, WARM_GPUS_ATTRIBUTE, window_warm
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.messages import ScheduleTick
from gpu_autoscaler.services.prewarm import (
    RELEASED_ATTRIBUTE,
    InvalidTick,
    PrewarmService,
    SolverPlanner,
    parse_tick,
)

from .builders import MONDAY, make_catalog, make_claim, make_config, make_pool, make_window, office_hours_demand
from .fakes import MemoryStore, RecordingQueue

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config

START = datetime(2026, 1, 5, 14, tzinfo=UTC)
RATE = ScheduleTick(trigger="rate")
PEAK = window_warm("peak")


class Rig:
    """A service wired as the Lambda wires it, on fakes: the test moves the clock and reads the store."""

    def __init__(self, config: Config, now: datetime) -> None:
        self.config = config
        self.clock = FixedClock(now)
        self.store = MemoryStore()
        self.queue = RecordingQueue()
        catalog = make_catalog()
        solver = Solver(config, catalog, self.clock)
        # MemoryStore holds the StateStore operations prewarm and its planner use, not the whole port.
        self.service = PrewarmService(config, self.store, self.queue, catalog.instance_types,  # type: ignore[arg-type]
                                      plan_capacity=SolverPlanner(lambda: solver, self.store),  # type: ignore[arg-type]
                                      clock=self.clock)

    def tick(self, at: datetime | None = None, tick: ScheduleTick = RATE) -> dict[str, Any]:
        if at is not None:
            self.clock.set(at)
        return self.service.run(tick).summary()

    def warm(self, holder: str | None = None) -> list[Any]:
        return [c for c in self.store.claims.values() if c.warm and (holder is None or c.warm == holder)]

    def gpus(self, holder: str) -> float:
        return sum(float(c.attributes[WARM_GPUS_ATTRIBUTE]) for c in self.warm(holder))


class TestWindow:
    def test_nothing_before_the_lead_time_and_the_tick_period(self) -> None:
        rig = Rig(make_config(), START - timedelta(minutes=14, seconds=1))
        summary = rig.tick()
        assert summary["launched"] == [] and rig.queue.sent == []
        assert summary["pools"]["gpu"]["warmTargetGpus"] == 0

    def test_warm_claims_for_the_target_a_lead_time_and_a_tick_period_ahead(self) -> None:
        # 8 minutes of lead time, plus the 5 until the next tick: capacity is up by 09:00 however ticks fall.
        rig = Rig(make_config(), START - timedelta(minutes=13))
        summary = rig.tick()
        claims = rig.warm(PEAK)
        assert rig.gpus(PEAK) >= 8
        assert {c.instance_types[0] for c in claims} <= {"g6.xlarge", "g6.12xlarge", "g6.48xlarge"}  # no g6f
        assert all(c.state is ClaimState.PENDING and c.pods == () and REQUESTS_ATTRIBUTE not in c.attributes
                   for c in claims)
        assert sorted(rig.queue.claim_ids) == sorted(c.id for c in claims)
        assert all(len(r.claim_ids) == 1 and r.cluster == "test" for r in rig.queue.sent)
        assert summary["pools"]["gpu"]["warmTargetGpus"] == 8 and summary["pools"]["gpu"]["windows"] == {"peak": 8}
        assert {item["claim"] for item in summary["launched"]} == {c.id for c in claims}

    def test_a_window_is_warmed_by_the_tick_whose_next_one_up_to_a_minute_late_would_be_too_late(self) -> None:
        """Scheduler: "if you set your schedule to run at 1:00, it will invoke the target API between 1:00:00 and
        1:00:59". After a tick at 08:46:30, the next may come at 08:52:29, under the 8-minute lead time before 09:00:
        this one must ask."""
        rig = Rig(make_config(), START - timedelta(minutes=13, seconds=30))
        assert rig.tick()["launched"] and rig.gpus(PEAK) >= 8

    def test_a_second_tick_launches_nothing_more(self) -> None:
        rig = Rig(make_config(), START - timedelta(minutes=8))
        rig.tick()
        before = set(rig.store.claims)
        summary = rig.tick(START - timedelta(minutes=3), ScheduleTick(trigger="window", window="peak"))
        assert set(rig.store.claims) == before and summary["launched"] == []

    def test_warm_capacity_is_held_while_the_window_is_open_and_released_after(self) -> None:
        rig = Rig(make_config(), START - timedelta(minutes=8))
        rig.tick()
        ids = {c.id for c in rig.warm(PEAK)}
        for claim_id in ids:  # the fleet launched them and the nodes joined; a real pod landed on one
            claim = rig.store.claims[claim_id]
            rig.store.claims[claim_id] = claim.model_copy(update={"state": ClaimState.REGISTERED})
        rig.tick(START + timedelta(hours=8, minutes=59))
        assert {c.id for c in rig.warm(PEAK)} == ids  # still held: consolidation must leave them alone
        summary = rig.tick(START + timedelta(hours=9))
        assert rig.warm() == []
        assert {r["claim"] for r in summary["released"]} == ids
        for claim_id in ids:
            claim = rig.store.claims[claim_id]
            assert claim.warm is None and claim.attributes[RELEASED_ATTRIBUTE] == PEAK
            assert "window peak is not open" in claim.reason

    @pytest.mark.parametrize(("schedule", "duration", "first", "later"), [
        ("cron(0 0 * * ? *)", "24h", datetime(2026, 1, 5, tzinfo=UTC), datetime(2026, 1, 6, 0, 1, tzinfo=UTC)),
        ("cron(0 9-17 ? * MON-FRI *)", "1h", START, START + timedelta(hours=1, minutes=30)),
    ])
    def test_claims_a_later_opening_counts_stay_held_until_it_ends(self, schedule: str, duration: str,
                                                                    first: datetime, later: datetime) -> None:
        """All day every day, or a working day as hourly openings: the next opening counts the claims the last one
        holds and launches nothing; their hold (which consolidation reads) must last until the opening's end."""
        config = make_config(windows=[make_window(schedule=schedule, duration=duration)])
        rig = Rig(config, first)
        rig.tick()
        ids = {c.id for c in rig.warm(PEAK)}
        rig.tick(later - timedelta(minutes=4))
        summary = rig.tick(later)
        assert summary["launched"] == [] and summary["released"] == []
        assert {c.id for c in rig.warm(PEAK)} == ids
        assert all(warm_held(c, later) for c in rig.warm(PEAK))
        assert summary["holdsRenewed"] == []  # renewed once, by the tick that first counted them for this opening

    def test_instance_type_window(self) -> None:
        config = make_config(windows=[make_window(warm={"instanceTypes": {"g6.12xlarge": 2}})])
        rig = Rig(config, START)
        rig.tick()
        assert sorted(c.instance_types for c in rig.warm(PEAK)) == [("g6.12xlarge",), ("g6.12xlarge",)]
        assert rig.gpus(PEAK) == 8

    @pytest.mark.parametrize("strategy", ["mixed", "single"])
    def test_instance_type_window_in_a_mig_pool_warms_each_node_asked(self, strategy: str) -> None:
        """A MIG node advertises its slices, not its GPUs: as `nvidia.com/mig-1g.10gb` (mixed) or as
        `nvidia.com/gpu` (single), 56 on a p5.48xlarge. A placeholder asking `nvidia.com/gpu` 8 fits no mixed node
        and seven times over on a single one: each node asked must be asked for all of its devices."""
        pool = make_pool(requirements=[{"key": "karpenter.k8s.aws/instance-family", "operator": "In",
                                        "values": ["p5"]}],
                         gpuSharing={"mode": "mig", "migProfile": "1g.10gb", "migStrategy": strategy})
        config = make_config(pools=[pool], windows=[make_window(warm={"instanceTypes": {"p5.48xlarge": 2}})])
        rig = Rig(config, START)
        rig.tick()
        assert sorted(c.instance_types for c in rig.warm(PEAK)) == [("p5.48xlarge",), ("p5.48xlarge",)]
        assert rig.gpus(PEAK) == 16

    def test_gpu_window_in_a_mig_single_pool_warms_its_gpus(self) -> None:
        """With the single strategy NVIDIA's device plugin advertises each slice as `nvidia.com/gpu` (56 on a
        p5.48xlarge): a placeholder asking `nvidia.com/mig-1g.10gb` fits no node of the pool."""
        pool = make_pool(requirements=[{"key": "karpenter.k8s.aws/instance-family", "operator": "In",
                                        "values": ["p5"]}],
                         gpuSharing={"mode": "mig", "migProfile": "1g.10gb", "migStrategy": "single"})
        rig = Rig(make_config(pools=[pool]), START - timedelta(minutes=13))
        rig.tick()
        assert [c.instance_types for c in rig.warm(PEAK)] == [("p5.48xlarge",)]
        assert rig.gpus(PEAK) == 8

    @pytest.mark.parametrize("strategy", ["mixed", "single"])
    def test_gpu_window_in_a_mig_pool_counts_the_slices_of_the_pools_own_gpus(self, strategy: str) -> None:
        """`1g.10gb` is four slices of an A100 40 GB but seven of an H100: a pool of H100s warming 9 GPUs asks for
        63 slices, two p5.48xlarge, not 36 (one node, 8 GPUs, short of the window's target)."""
        pool = make_pool(requirements=[{"key": "karpenter.k8s.aws/instance-family", "operator": "In",
                                        "values": ["p5"]}],
                         gpuSharing={"mode": "mig", "migProfile": "1g.10gb", "migStrategy": strategy})
        rig = Rig(make_config(pools=[pool], windows=[make_window(warm={"gpus": 9})]), START - timedelta(minutes=13))
        rig.tick()
        assert rig.gpus(PEAK) == 16

    def test_a_stuck_pending_claim_is_named_again(self) -> None:
        rig = Rig(make_config(), START - timedelta(minutes=8))
        rig.tick()
        sent = len(rig.queue.sent)
        summary = rig.tick(START)
        assert sorted(summary["launchRequestsResent"]) == sorted(c.id for c in rig.warm(PEAK))
        assert len(rig.queue.sent) == sent + len(rig.warm(PEAK))

    def test_a_tick_for_an_unknown_window_still_reconciles(self) -> None:
        rig = Rig(make_config(), START)
        summary = rig.tick(tick=ScheduleTick(trigger="window", window="gone"))
        assert "window 'gone', which is not configured" in summary["notes"][0]
        assert rig.gpus(PEAK) >= 8


class TestShapedWindow:
    """A window that asks for a GPU count holds nodes the pool's pods fit, not the cheapest GPUs whatever they hold:
    replaying the Alibaba trace, 344 of 393 pods that found no room had such warm nodes and fitted none."""

    def rig(self, shape: str | None) -> Rig:
        now = START - timedelta(minutes=13)
        rig = Rig(make_config(), now)  # window "peak", 8 GPUs; prediction off
        if shape is not None:
            for i in range(12 * 24 * 3):  # the packer's series of the pool's pending pods of one shape, 3 days
                bucket = now - timedelta(days=3) + i * timedelta(minutes=5)
                rig.store.record_demand(f"gpu/{shape}", bucket, 2.0 if i % 12 == 0 else 0.0, timedelta(days=14))
        return rig

    def test_warm_nodes_hold_the_pools_pods(self) -> None:
        rig = self.rig("1d-t2")  # 1 GPU, up to 14.4 vCPU and 54.4 GiB: g6.xlarge (4 vCPU, 16 GiB) holds none
        rig.tick()
        claims = rig.warm(PEAK)
        assert rig.gpus(PEAK) >= 8
        assert claims and all(c.instance_types[0] in {"g6.12xlarge", "g6.48xlarge"} for c in claims)

    def test_outside_its_windows_a_pool_without_a_forecast_reads_no_shape_series(self) -> None:
        rig = self.rig("1d-t2")
        read: list[str] = []
        history = rig.store.demand_history

        def recording(pool: str, since: datetime) -> list[tuple[datetime, float]]:
            read.append(pool)
            return history(pool, since)

        rig.store.demand_history = recording  # type: ignore[method-assign]
        rig.tick(START - timedelta(hours=2))
        assert read == [] and rig.warm(PEAK) == []
        rig.tick(START - timedelta(minutes=13))
        assert "gpu/1d-t2" in read and rig.gpus(PEAK) >= 8

    def test_without_recorded_pods_the_cheapest_gpus(self) -> None:
        rig = self.rig(None)
        rig.tick()
        assert {c.instance_types[0] for c in rig.warm(PEAK)} == {"g6.xlarge"} and rig.gpus(PEAK) == 8


class TestForecast:
    def rig(self, days: float, now: datetime, **predictive: Any) -> Rig:
        config = make_config(windows=[], enabled=True, **predictive)
        rig = Rig(config, now)
        demand = office_hours_demand(21)
        first = now - timedelta(days=days)
        for i, gpus in enumerate(demand):
            bucket = MONDAY + i * timedelta(minutes=5)
            if first <= bucket < now:
                rig.store.record_demand("gpu", bucket, float(gpus), timedelta(days=14))
        return rig

    def test_no_forecast_without_24_hours_of_history(self, caplog: pytest.LogCaptureFixture) -> None:
        now = MONDAY + timedelta(days=14, hours=8, minutes=55)
        rig = self.rig(0.9, now)
        with caplog.at_level(logging.INFO, logger="gpu_autoscaler.services.prewarm"):
            summary = rig.tick()
        assert summary["forecastStatus"] == "insufficient-history"
        assert summary["pools"]["gpu"]["forecast"]["status"] == "insufficient-history"
        assert "of demand history; forecasting needs at least 24.0 h" in summary["pools"]["gpu"]["forecast"]["reason"]
        assert any("no forecast for pool gpu" in r.getMessage() for r in caplog.records)
        assert rig.warm() == []

    def test_the_forecast_reads_demand_in_the_windows_time_zone(self) -> None:
        """The cluster's users' time zone, as its windows name it: office hours follow it across clock changes."""
        assert Rig(make_config(enabled=True), START).service.forecaster.zone == ZoneInfo("America/New_York")
        two = make_config(enabled=True, windows=[make_window(), make_window(name="night", timezone="Europe/Paris")])
        assert Rig(two, START).service.forecaster.zone is None  # which one? UTC, as without windows
        assert Rig(make_config(windows=[], enabled=True), START).service.forecaster.zone is None

    def test_prediction_off_is_reported(self) -> None:
        rig = Rig(make_config(windows=[]), START)
        assert rig.tick()["forecastStatus"] == "disabled"

    def test_launches_ahead_of_the_morning_ramp(self) -> None:
        now = MONDAY + timedelta(days=14, hours=8, minutes=55)  # Monday, 8 minutes before 09:03
        rig = self.rig(14, now)
        summary = rig.tick()
        assert summary["forecastStatus"] == "ok"
        assert summary["pools"]["gpu"]["forecast"]["gpus"] == pytest.approx(12, abs=0.5)
        assert rig.gpus(FORECAST_WARM) >= 12

    def test_forecast_claims_are_held_a_few_ticks_ahead_and_each_tick_renews_them(self) -> None:
        now = MONDAY + timedelta(days=14, hours=8, minutes=55)
        rig = self.rig(14, now)
        rig.tick()
        ids = {c.id for c in rig.warm(FORECAST_WARM)}
        assert ids and {warm_until(c) for c in rig.warm(FORECAST_WARM)} == {now + FORECAST_HOLD}
        later = now + timedelta(minutes=5)
        summary = rig.tick(later)
        assert {r["claim"] for r in summary["holdsRenewed"]} >= ids
        assert {warm_until(c) for c in rig.warm(FORECAST_WARM) if c.id in ids} == {later + FORECAST_HOLD}
        assert not any(warm_held(c, later + FORECAST_HOLD) for c in rig.warm(FORECAST_WARM))  # were ticks to stop

    def test_max_warm_gpus_caps_what_is_launched(self) -> None:
        now = MONDAY + timedelta(days=14, hours=8, minutes=55)
        rig = self.rig(14, now, maxWarmGpus=5)
        rig.store.create_claim(make_claim())  # a 4-GPU node serving the 2-GPU baseline
        summary = rig.tick()
        assert summary["pools"]["gpu"]["forecast"]["current"] == 2
        assert rig.gpus(FORECAST_WARM) == 3  # capacity 7: the 2 GPUs asked for now plus 5 idle ahead of demand

    def test_max_warm_price_per_hour_caps_what_is_launched(self) -> None:
        now = MONDAY + timedelta(days=14, hours=8, minutes=55)
        rig = self.rig(14, now, maxWarmPricePerHour=5.0, maxWarmGpus=32)
        rig.tick()
        price = sum(c.price_per_hour for c in rig.warm(FORECAST_WARM))
        assert 0 < price <= 5.0
        # The cheapest GPU is a g6.xlarge at $0.8048/h: six fit in $5/h ($4.83), a seventh would not.
        assert rig.gpus(FORECAST_WARM) == 6

    def test_released_when_demand_falls_away(self) -> None:
        now = MONDAY + timedelta(days=14, hours=8, minutes=55)
        rig = self.rig(14, now)
        rig.store.create_claim(make_claim())  # a 4-GPU node serving the 2-GPU baseline
        rig.tick()
        assert 8 <= rig.gpus(FORECAST_WARM) < 12  # 12 forecast against the 4 already there
        summary = rig.tick(MONDAY + timedelta(days=14, hours=17, minutes=30))
        assert rig.warm(FORECAST_WARM) == []
        assert all(r["warm"] == FORECAST_WARM for r in summary["released"])


class TestTick:
    def test_parses_scheduler_payloads(self) -> None:
        tick = parse_tick({"trigger": "window", "window": "peak", "scheduledTime": "2026-11-23T14:00:00Z"})
        assert tick.window == "peak" and tick.scheduled_time == datetime(2026, 11, 23, 14, tzinfo=UTC)
        assert parse_tick({"trigger": "rate"}).trigger == "rate"

    @pytest.mark.parametrize("event, message", [
        ({"trigger": "cron"}, "trigger"),
        ({"trigger": "window"}, "must name its window"),
        ({"trigger": "rate", "scheduledTime": "<aws.scheduler.scheduled-time>"}, "scheduledTime"),
        ([], "JSON object"),
    ])
    def test_bad_input_is_a_clear_error(self, event: Any, message: str) -> None:
        with pytest.raises(InvalidTick, match=message):
            parse_tick(event)


def test_a_claim_changed_meanwhile_is_left_for_the_next_tick() -> None:
    rig = Rig(make_config(), START + timedelta(hours=10))
    claim = make_claim(warm=PEAK)
    rig.store.create_claim(claim)

    stale = claim.model_copy(update={"state": ClaimState.LAUNCHED})  # what the service read is not what is stored
    original = rig.store.list_claims
    rig.store.list_claims = lambda states=None: [stale]  # type: ignore[method-assign]
    summary = rig.tick()
    rig.store.list_claims = original  # type: ignore[method-assign]
    assert summary["released"] == [] and rig.store.claims[claim.id].warm == PEAK


class TestShapedForecast:
    """Headroom in pods of the shapes that come: a warm GPU is no use to a pod that does not fit its node."""

    def rig(self, shape: str) -> Rig:
        now = MONDAY + timedelta(days=14, hours=8, minutes=55)
        rig = Rig(make_config(windows=[], enabled=True), now)
        for i, gpus in enumerate(office_hours_demand(21)):
            bucket = MONDAY + i * timedelta(minutes=5)
            if bucket < now:
                rig.store.record_demand("gpu", bucket, float(gpus), timedelta(days=14))
                # the packer's series of pending pods of one shape: 1 GPU, up to 14.4 vCPU and 54.4 GiB
                rig.store.record_demand(f"gpu/{shape}", bucket, float(gpus) / 2, timedelta(days=14))
        return rig

    def test_warm_nodes_hold_the_pods_that_come(self) -> None:
        rig = self.rig("1d-t2")
        summary = rig.tick()
        claims = rig.warm(FORECAST_WARM)
        # Headroom for the 6 GPUs of such pods forecast to arrive, in whole nodes (the 2 GPUs asked for now
        # that no claim holds are the packer's to place, not headroom).
        assert summary["pools"]["gpu"]["forecastTargetGpus"] == pytest.approx(6, abs=0.5)
        assert rig.gpus(FORECAST_WARM) >= 6
        # g6.xlarge (4 vCPU, 16 GiB) is the cheapest GPU, but holds no such pod: the warm nodes are bigger ones
        assert claims and all(c.instance_types[0] in {"g6.12xlarge", "g6.48xlarge"} for c in claims)

    def test_small_pods_keep_the_cheapest_gpus(self) -> None:
        rig = self.rig("1d-t0")
        rig.tick()
        assert {c.instance_types[0] for c in rig.warm(FORECAST_WARM)} == {"g6.xlarge"}
        assert rig.gpus(FORECAST_WARM) == 6

    def test_no_class_coming_warms_nothing_though_the_pool_total_does(self) -> None:
        # Pods of one shape come in office hours only; at night the pool's total still reads 2 GPUs (pods
        # running), the class reads none: no cheapest-GPU node is warmed for pods that do not come.
        now = MONDAY + timedelta(days=14, hours=22)
        rig = Rig(make_config(windows=[], enabled=True), now)
        for i, gpus in enumerate(office_hours_demand(21)):
            bucket = MONDAY + i * timedelta(minutes=5)
            if bucket < now:
                rig.store.record_demand("gpu", bucket, float(gpus), timedelta(days=14))
                rig.store.record_demand("gpu/1d-t2", bucket, float(gpus - 2) / 2, timedelta(days=14))
        summary = rig.tick()
        assert rig.warm(FORECAST_WARM) == [] and summary["launched"] == []


def test_warm_capacity_leaves_room_for_what_the_account_s_other_instances_use() -> None:
    """Pre-warm plans through the same quotas as the packer: another workload's 64 of 96 G vCPUs leave 32."""
    from gpu_autoscaler.models.quotas import UsageReading
    from tests.unit.packing import builders
    from tests.unit.packing.fakes import FixedQuotas

    config = builders.make_config(builders.make_pool(capacityTypes=["on-demand"]))
    clock = FixedClock(builders.NOW)
    solver = Solver(config, builders.make_catalog(), clock)
    quotas = FixedQuotas({"g/on-demand": 96}, usage={"g/on-demand": UsageReading(64, builders.NOW)})
    planner = SolverPlanner(lambda: solver, MemoryStore(), quotas)  # type: ignore[arg-type]
    pinned = {"node.kubernetes.io/instance-type": "g5.2xlarge"}
    claims = planner([builders.make_pod(cpu="2", memory="8Gi", nodeSelector=pinned) for _ in range(6)])
    assert len(claims) == 4


def test_warm_claims_another_planner_leaves_no_room_for_within_the_pool_limit_are_withdrawn_before_launch() -> None:
    """Prewarm plans against the claims it read; the packer (or an interruption's replacements) may store claims
    meanwhile. Once its warm claims are stored it reads the pool again and ends, before any launch, those the
    others' claims leave no room for under the pool's `limits` (`Solver.beyond_limits`). Before: the pool ran 16
    GPUs under a 12-GPU limit."""
    rig = Rig(make_config(pools=[make_pool(limits={"gpus": 12})]), START - timedelta(minutes=13))
    original = rig.store.create_claim
    raced: list[bool] = []

    def racing(claim: Any) -> None:
        if not raced:  # the packer stores an 8-GPU claim after prewarm planned against an empty pool
            raced.append(True)
            original(make_claim(instance_types=("g6.48xlarge",), state=ClaimState.PENDING, created_at=START))
        original(claim)

    rig.store.create_claim = racing  # type: ignore[method-assign]
    summary = rig.tick()
    live = [c for c in rig.store.claims.values() if c.live]
    gpus = {"g6.xlarge": 1, "g6.12xlarge": 4, "g6.48xlarge": 8}
    assert sum(gpus[c.instance_types[0]] for c in live) <= 12
    withdrawn = [c for c in rig.store.claims.values() if c.warm and c.state is ClaimState.TERMINATED]
    assert withdrawn and all("limits" in c.history[-1].reason for c in withdrawn)
    assert not set(rig.queue.claim_ids) & {c.id for c in withdrawn}  # never sent to the fleet
    assert {item["claim"] for item in summary["launched"]} == {c.id for c in live if c.warm}

"""The pre-warm decision: window targets, forecast shortfall within budgets, releases and hand-overs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.domain.forecast import Forecast, ForecastStatus
from gpu_autoscaler.domain.prewarm import (
    FORECAST_HOLD,
    FORECAST_WARM,
    WARM_GPUS_ATTRIBUTE,
    WARM_UNTIL_ATTRIBUTE,
    GpuCapacity,
    WarmNeed,
    decide,
    largest_within_budget,
    mig_slices_per_gpu,
    placeholder_pods,
    window_warm,
)
from gpu_autoscaler.models.claims import ClaimState
from tests.unit.packing.builders import make_type as make_packing_type

from .builders import make_claim, make_config, make_pool, make_types, make_window

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.config import Config

START = datetime(2026, 1, 5, 14, tzinfo=UTC)
"""Monday 09:00 in New York: the default window's start."""
GPUS = GpuCapacity(make_types())
PEAK = window_warm("peak")
HELD_TO_END = {WARM_UNTIL_ATTRIBUTE: (START + timedelta(hours=9)).isoformat()}
"""A `peak` claim's `warmUntil`: the end of Monday's opening."""


def forecast(gpus: float | None, current: float = 0.0, pool: str = "gpu", at: datetime = START) -> Forecast:
    """A forecast of `gpus` at `at`, with `current` GPUs asked for in the last bucket."""
    if gpus is None:
        return Forecast(pool, ForecastStatus.INSUFFICIENT_HISTORY, at, timedelta(hours=3), reason="3.0 h of history")
    return Forecast(pool, ForecastStatus.OK, at, timedelta(days=14), gpus, gpus, current, 100, current=current)


class TestWindows:
    def test_nothing_before_start_minus_lead_time(self) -> None:
        decision = decide(make_config(), START - timedelta(minutes=9), [], GPUS)
        assert decision.needs == () and decision.changes == ()
        assert decision.pools[0].target == 0

    def test_the_period_to_the_next_decision_asks_earlier(self) -> None:
        early = decide(make_config(), START - timedelta(minutes=13), [], GPUS, period=timedelta(minutes=5))
        assert [n.gpus for n in early.needs] == [8]

    def test_the_target_is_asked_for_at_start_minus_lead_time(self) -> None:
        decision = decide(make_config(), START - timedelta(minutes=8), [], GPUS)
        assert [(n.pool, n.warm, n.gpus) for n in decision.needs] == [("gpu", PEAK, 8)]
        assert decision.needs[0].until == START + timedelta(hours=9)
        assert decision.pools[0].windows == {"peak": 8}

    def test_a_gpu_count_window_is_shaped_like_the_pools_recorded_pods(self) -> None:
        config = make_config()
        decision = decide(config, START - timedelta(minutes=8), [], GPUS,
                          mixes={"gpu": {"1d-t2": 30.0, "2d-t0": 10.0, "4d-t0": 0.0}})
        [need] = decision.needs
        assert (need.gpus, need.shapes) == (8, (("1d-t2", 30.0), ("2d-t0", 10.0)))
        pods = placeholder_pods(need, config.pool("gpu"), "s")
        kinds = [cls for p in pods for cls in ("1d-t2", "2d-t0") if f"-{cls}-" in p.uid]
        assert sorted(kinds) == ["1d-t2"] * 6 + ["2d-t0"]  # 8 GPUs as whole pods, 3 : 1 by GPUs
        assert all(p.resources["cpu"] > 0 for p in pods)  # the classes' CPU and memory, not one bare GPU

    def test_less_than_one_of_the_pools_pods_is_asked_for_as_the_cheapest_gpus(self) -> None:
        # 4 of the window's 8 GPUs held, the pool's pods take 8 GPUs each: the 4 left go as the cheapest GPUs, so the
        # target is met instead of asked for again every tick with nothing to launch.
        held = [make_claim(warm=PEAK)]  # a g6.12xlarge: 4 GPUs
        [need] = decide(make_config(), START, held, GPUS, mixes={"gpu": {"8d-t0": 16.0}}).needs
        assert (need.gpus, need.shapes) == (4, ())
        [need] = decide(make_config(), START, held, GPUS, mixes={"gpu": {"4d-t0": 16.0}}).needs
        assert (need.gpus, need.shapes) == (4, (("4d-t0", 16.0),))

    def test_a_pool_with_no_recorded_pods_gets_the_cheapest_gpus(self) -> None:
        no_pods: tuple[Mapping[str, Mapping[str, float]] | None, ...] = (None, {"gpu": {}})
        for mixes in no_pods:
            [need] = decide(make_config(), START - timedelta(minutes=8), [], GPUS, mixes=mixes).needs
            assert need.shapes == ()

    def test_held_claims_count_whether_or_not_pods_landed_on_them(self) -> None:
        held = [make_claim(warm=PEAK, pods=("real-pod",), attributes=HELD_TO_END),
                make_claim(warm=PEAK, state=ClaimState.PENDING, attributes=HELD_TO_END)]
        decision = decide(make_config(), START + timedelta(hours=1), held, GPUS)
        assert decision.needs == () and decision.changes == ()
        assert decision.pools[0].held == {PEAK: 8}

    def test_only_the_shortfall_is_asked_for(self) -> None:
        decision = decide(make_config(), START, [make_claim(warm=PEAK, instance_types=("g6.xlarge",))], GPUS)
        assert [n.gpus for n in decision.needs] == [7]

    def test_draining_claims_do_not_count(self) -> None:
        decision = decide(make_config(), START, [make_claim(warm=PEAK, state=ClaimState.DRAINING)], GPUS)
        assert [n.gpus for n in decision.needs] == [8]

    def test_released_when_the_window_closes(self) -> None:
        held = [make_claim(warm=PEAK, attributes=HELD_TO_END), make_claim(warm=PEAK, attributes=HELD_TO_END),
                make_claim()]
        during = decide(make_config(), START + timedelta(hours=9) - timedelta(seconds=1), held, GPUS)
        assert during.changes == ()
        after = decide(make_config(), START + timedelta(hours=9), held, GPUS)
        assert sorted(c.claim.id for c in after.releases) == sorted(c.id for c in held[:2])
        assert all(c.warm is None and "window peak is not open" in c.reason for c in after.changes)
        assert after.needs == ()

    def test_a_lowered_target_releases_what_it_no_longer_needs(self) -> None:
        config = make_config(windows=[make_window(warm={"gpus": 4})])
        held = [make_claim(warm=PEAK), make_claim(warm=PEAK)]
        decision = decide(config, START, held, GPUS)
        assert len(decision.releases) == 1 and decision.needs == ()

    def test_claims_of_a_removed_or_moved_window_are_released(self) -> None:
        config = make_config(pools=[make_pool(), make_pool("other")], windows=[make_window(nodePool="other")])
        held = [make_claim(warm=window_warm("gone")), make_claim(warm=PEAK)]
        decision = decide(config, START, held, GPUS)
        reasons = sorted(c.reason for c in decision.releases)
        assert reasons == ["window gone is no longer configured", "window peak now warms pool other"]
        assert [(n.pool, n.gpus) for n in decision.needs] == [("other", 8)]

    def test_instance_type_windows_count_nodes_per_type(self) -> None:
        config = make_config(windows=[make_window(warm={"instanceTypes": {"g6.12xlarge": 2, "g6.xlarge": 1}})])
        held = [make_claim(warm=PEAK, instance_type="g6.12xlarge"),
                make_claim(warm=PEAK, instance_types=("g6.48xlarge",))]
        decision = decide(config, START, held, GPUS)
        assert [(n.instance_type, n.nodes) for n in decision.needs] == [("g6.12xlarge", 1), ("g6.xlarge", 1)]
        assert [c.claim.id for c in decision.releases] == [held[1].id]
        assert decision.pools[0].windows == {"peak": 9}

    def test_a_later_opening_extends_the_hold_of_the_claims_it_counts(self) -> None:
        # All day, every day: the next opening holds from before the last one ends, and counts its claims.
        config = make_config(windows=[make_window(schedule="cron(0 0 * * ? *)", timezone="UTC", duration="24h")])
        midnight = datetime(2026, 1, 6, tzinfo=UTC)
        held = [make_claim(warm=PEAK, attributes={WARM_UNTIL_ATTRIBUTE: midnight.isoformat()}) for _ in range(2)]
        decision = decide(config, midnight - timedelta(minutes=8), held, GPUS)
        assert decision.needs == () and decision.releases == ()
        assert sorted((c.claim.id, c.warm, c.until) for c in decision.changes) == sorted(
            (c.id, PEAK, midnight + timedelta(days=1)) for c in held)
        renewed = [c.claim.model_copy(update={"attributes": {WARM_UNTIL_ATTRIBUTE: c.until.isoformat()}})
                   for c in decision.changes if c.until is not None]
        assert decide(config, midnight + timedelta(hours=1), renewed, GPUS).changes == ()  # written once

    def test_a_later_opening_extends_the_hold_of_an_instance_type_window(self) -> None:
        config = make_config(windows=[make_window(schedule="cron(0 9-17 ? * MON-FRI *)", duration="1h",
                                                  warm={"instanceTypes": {"g6.12xlarge": 1}})])
        end = START + timedelta(hours=1)
        held = [make_claim(warm=PEAK, instance_type="g6.12xlarge", attributes={WARM_UNTIL_ATTRIBUTE: end.isoformat()})]
        decision = decide(config, end - timedelta(minutes=8), held, GPUS)
        assert decision.needs == ()
        assert [(c.claim.id, c.warm, c.until) for c in decision.changes] == [
            (held[0].id, PEAK, end + timedelta(hours=1))]

    def test_unknown_instance_type_is_noted(self) -> None:
        config = make_config(windows=[make_window(warm={"instanceTypes": {"x9.huge": 1}})])
        decision = decide(config, START, [], GPUS)
        assert decision.needs == ()
        assert decision.pools[0].notes == ("window peak: instance type x9.huge is not in the catalog",)


class TestForecast:
    def config(self, **predictive: Any) -> Config:
        return make_config(windows=[], enabled=True, **predictive)

    def test_launches_the_shortfall_against_all_live_capacity(self) -> None:
        live = [make_claim(), make_claim(state=ClaimState.PENDING)]  # 8 GPUs registered and in flight
        decision = decide(self.config(), START, live, GPUS, {"gpu": forecast(13.2, current=8)})
        assert [(n.warm, n.gpus, n.gpu_room) for n in decision.needs] == [(FORECAST_WARM, 6, 16)]
        assert decision.pools[0].forecast_target == pytest.approx(5.2)

    def test_enough_capacity_launches_nothing(self) -> None:
        decision = decide(self.config(), START, [make_claim(), make_claim()], GPUS, {"gpu": forecast(7.5, 6)})
        assert decision.needs == ()

    def test_max_warm_gpus_caps_the_idle_gpus_held_ahead_of_demand(self) -> None:
        live = [make_claim(), make_claim(), make_claim()]  # 12 GPUs, 10 of them busy
        decision = decide(self.config(maxWarmGpus=4), START, live, GPUS, {"gpu": forecast(30, current=10)})
        assert [(n.gpus, n.gpu_room) for n in decision.needs] == [(2, 2)]
        assert "maxWarmGpus 4 over the current 10 caps capacity at 14.0" in decision.pools[0].notes[0]

    def test_forecast_claims_real_pods_filled_do_not_count_against_the_cap(self) -> None:
        live = [make_claim(), make_claim(), make_claim(warm=FORECAST_WARM), make_claim(warm=FORECAST_WARM)]
        decision = decide(self.config(maxWarmGpus=4), START, live, GPUS, {"gpu": forecast(30, current=16)})
        assert [(n.gpus, n.gpu_room) for n in decision.needs] == [(4, 4)]

    def test_idle_forecast_claims_count_against_the_cap(self) -> None:
        live = [make_claim(), make_claim(warm=FORECAST_WARM)]
        decision = decide(self.config(maxWarmGpus=6), START, live, GPUS, {"gpu": forecast(30, current=4)})
        assert [(n.gpus, n.gpu_room) for n in decision.needs] == [(2, 2)]

    def test_the_price_budget_left_goes_with_the_need(self) -> None:
        held = [make_claim(warm=FORECAST_WARM, price_per_hour=4.0)]  # idle: nothing is asked for now
        decision = decide(self.config(maxWarmPricePerHour=10), START, held, GPUS, {"gpu": forecast(12)})
        assert [(n.gpus, n.price_room) for n in decision.needs] == [(8, pytest.approx(6.0))]

    def test_a_spent_price_budget_launches_nothing(self) -> None:
        held = [make_claim(warm=FORECAST_WARM, price_per_hour=4.0, launched_price_per_hour=10.5)]
        decision = decide(self.config(maxWarmPricePerHour=10), START, held, GPUS, {"gpu": forecast(12)})
        assert decision.needs == ()
        assert "maxWarmPricePerHour 10 is spent" in decision.pools[0].notes[0]

    def test_no_forecast_no_forecast_claims(self) -> None:
        held = [make_claim(warm=FORECAST_WARM)]
        decision = decide(self.config(), START, held, GPUS, {"gpu": forecast(None)})
        assert decision.needs == ()
        assert [(c.claim.id, c.warm) for c in decision.changes] == [(held[0].id, None)]
        assert "no forecast (3.0 h of history)" in decision.changes[0].reason

    def test_released_when_the_forecast_no_longer_needs_them(self) -> None:
        old = START - timedelta(hours=1)
        held = [make_claim(warm=FORECAST_WARM, created_at=old), make_claim(warm=FORECAST_WARM, created_at=old),
                make_claim()]
        decision = decide(self.config(), START, held, GPUS, {"gpu": forecast(7, current=5)})  # 12 held, 7 wanted
        assert len(decision.releases) == 1 and decision.needs == ()

    def test_young_forecast_claims_are_kept_a_while(self) -> None:
        held = [make_claim(warm=FORECAST_WARM, created_at=START - timedelta(minutes=5))]
        assert decide(self.config(), START, held, GPUS, {"gpu": forecast(0)}).releases == ()
        later = decide(self.config(), START + timedelta(minutes=10), held, GPUS, {"gpu": forecast(0)})
        assert len(later.releases) == 1

    def test_the_forecast_holds_its_claims_a_few_ticks_ahead_renewed_by_each_tick_that_keeps_them(self) -> None:
        """A hold no tick renews (prewarm failing for good) ends by itself, FORECAST_HOLD after the last tick."""
        until = {WARM_UNTIL_ATTRIBUTE: (START + timedelta(minutes=5)).isoformat()}
        held = [make_claim(warm=FORECAST_WARM, attributes=until), make_claim(warm=FORECAST_WARM, attributes=until)]
        decision = decide(self.config(), START, held, GPUS, {"gpu": forecast(12)})
        assert [(n.warm, n.until) for n in decision.needs] == [(FORECAST_WARM, START + FORECAST_HOLD)]
        assert sorted((c.claim.id, c.warm, c.until) for c in decision.changes) == sorted(
            (c.id, FORECAST_WARM, START + FORECAST_HOLD) for c in held)
        assert decision.renewals == decision.changes

    def test_a_closing_window_hands_its_claims_to_the_forecast(self) -> None:
        config = make_config(enabled=True)
        held = [make_claim(warm=PEAK), make_claim(warm=PEAK)]
        end = START + timedelta(hours=9)
        decision = decide(config, end, held, GPUS, {"gpu": forecast(5)})
        handed = [c for c in decision.changes if c.warm == FORECAST_WARM]
        released = [c for c in decision.changes if c.warm is None]
        assert len(handed) == 2 and released == []  # 4 + 4 adopted: one would leave 1 GPU short
        assert {c.until for c in handed} == {end + FORECAST_HOLD}
        assert decision.needs == ()

    def test_without_prediction_closing_window_claims_are_released(self) -> None:
        held = [make_claim(warm=PEAK)]
        decision = decide(make_config(), START + timedelta(hours=10), held, GPUS)
        assert [c.warm for c in decision.changes] == [None]


class TestPackerRequest:
    def test_placeholders_select_the_pool_tolerate_its_taints_and_ask_for_one_gpu_each(self) -> None:
        pool = make_config().pool("gpu")
        pods = placeholder_pods(WarmNeed("gpu", PEAK, gpus=3), pool, "t1", exclude_types=["g6f.large"])
        assert len(pods) == 3 and len({p.uid for p in pods}) == 3
        assert all(p.requests == {"nvidia.com/gpu": "1"} for p in pods)
        assert pods[0].node_selector == {"karpenter.sh/nodepool": "gpu"}
        assert pods[0].tolerations[0].key == "nvidia.com/gpu" and pods[0].tolerations[0].operator == "Exists"
        expressions = pods[0].required_node_affinity[0].match_expressions
        assert [(e.key, e.operator, e.values) for e in expressions] == [
            ("node.kubernetes.io/instance-type", "NotIn", ("g6f.large",)),
            ("kubernetes.io/arch", "In", ("amd64",)),
        ]

    def test_a_pool_that_names_its_architecture_keeps_it(self) -> None:
        arm = make_pool(requirements=[{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}])
        pool = make_config(pools=[arm], windows=[]).pool("gpu")
        assert placeholder_pods(WarmNeed("gpu", FORECAST_WARM, gpus=1), pool, "t")[0].required_node_affinity == ()

    def test_time_sliced_and_mig_pools_ask_for_one_physical_gpu(self) -> None:
        sliced = make_config(pools=[make_pool(gpuSharing={"mode": "time-slicing", "replicas": 4})], windows=[])
        mig = make_config(pools=[make_pool(gpuSharing={"mode": "mig", "migProfile": "3g.40gb"})], windows=[])
        assert placeholder_pods(WarmNeed("gpu", "forecast", gpus=1), sliced.pool("gpu"), "t")[0].requests == {
            "nvidia.com/gpu": "4"}
        assert placeholder_pods(WarmNeed("gpu", "forecast", gpus=1), mig.pool("gpu"), "t")[0].requests == {
            "nvidia.com/mig-3g.40gb": "2"}
        media = make_config(pools=[make_pool(gpuSharing={"mode": "mig", "migProfile": "1g.10gb+me"})], windows=[])
        assert placeholder_pods(WarmNeed("gpu", "forecast", gpus=1), media.pool("gpu"), "t")[0].requests == {
            "nvidia.com/mig-1g.10gb.me": "1"}

    def test_a_mig_pool_counts_the_slices_of_its_own_gpus(self) -> None:
        """`1g.10gb` is four slices of the p4d's A100 40 GB, seven of the p4de's A100 80 GB and the p5's H100."""
        types = [make_packing_type(n) for n in ("g5.xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge")]

        def pool(*families: str, profile: str = "1g.10gb") -> Any:
            requirements = [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": list(families)},
                            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]
            return make_config(pools=[make_pool(requirements=requirements, gpuSharing={
                "mode": "mig", "migProfile": profile})], windows=[]).pool("gpu")

        assert mig_slices_per_gpu(pool("p5"), types) == 7
        assert mig_slices_per_gpu(pool("p4de", "p5"), types) == 7
        assert mig_slices_per_gpu(pool("p4d", "p5"), types) == 4  # the fewest: a short tick is made up on the next
        assert mig_slices_per_gpu(pool("g5"), types) is None
        assert mig_slices_per_gpu(pool("p5", profile="3g.40gb"), types) == 2
        assert mig_slices_per_gpu(make_config().pool("gpu"), types) is None  # not a MIG pool
        pods = placeholder_pods(WarmNeed("gpu", "forecast", gpus=1), pool("p5"), "t", slices_per_gpu=7)
        assert pods[0].requests == {"nvidia.com/mig-1g.10gb": "7"}

    def test_instance_type_placeholders_fill_one_node_each(self) -> None:
        pool = make_config().pool("gpu")
        pods = placeholder_pods(WarmNeed("gpu", PEAK, instance_type="g6.12xlarge", nodes=2), pool, "t",
                               devices={"nvidia.com/gpu": 4})
        assert len(pods) == 2 and pods[0].requests == {"nvidia.com/gpu": "4"}
        assert pods[0].node_selector["node.kubernetes.io/instance-type"] == "g6.12xlarge"

    def test_the_largest_request_within_budget(self) -> None:
        asked: list[int] = []

        def plan(n: int) -> list:  # one 1-GPU node per GPU at $1/h
            asked.append(n)
            return [make_claim(instance_types=("g6.xlarge",), price_per_hour=1.0,
                               attributes={WARM_GPUS_ATTRIBUTE: "1"}) for _ in range(n)]

        need = WarmNeed("gpu", FORECAST_WARM, gpus=10, gpu_room=16, price_room=6.5)
        assert len(largest_within_budget(need, plan, GPUS)) == 6
        assert asked[0] == 10 and len(asked) <= 1 + 4
        assert len(largest_within_budget(WarmNeed("gpu", FORECAST_WARM, gpus=3), plan, GPUS)) == 3
        assert largest_within_budget(WarmNeed("gpu", FORECAST_WARM, gpus=1, price_room=0.5), plan, GPUS) == []


class TestShapedForecast:
    """Headroom in whole pods of the classes that come, against the room the pool has free."""

    def config(self, **predictive: Any) -> Config:
        return make_config(windows=[], enabled=True, **predictive)

    def test_free_room_on_registered_nodes_is_headroom(self) -> None:
        # 12 GPUs registered, 10 asked for: the 2 free GPUs hold the two 1-GPU pods that come, nothing is bought
        live = [make_claim(), make_claim(), make_claim()]
        decision = decide(self.config(), START, live, GPUS, {"gpu": forecast(12, current=10)},
                          shapes={"gpu": {"1d-t0": 2.0}})
        assert decision.needs == ()

    def test_only_what_free_room_lacks_is_bought(self) -> None:
        live = [make_claim(), make_claim()]  # 8 GPUs, 7 asked for
        decision = decide(self.config(), START, live, GPUS, {"gpu": forecast(10, current=7)},
                          shapes={"gpu": {"1d-t2": 3.0}})
        assert [(n.gpus, n.shapes) for n in decision.needs] == [(2, (("1d-t2", 3.0),))]

    def test_a_fraction_of_a_pod_warms_no_node(self) -> None:
        # one pod pending in one bucket of the recent level: a fifth of a pod forecast, not a node to warm
        decision = decide(self.config(), START, [], GPUS, {"gpu": forecast(0.2)}, shapes={"gpu": {"1d-t2": 0.2}})
        assert decision.needs == ()
        # nor is most of one: 0.6 of a 1-GPU pod and half of a 2-GPU one buy nothing
        short = decide(self.config(), START, [], GPUS, {"gpu": forecast(1.6)},
                       shapes={"gpu": {"1d-t2": 0.6, "2d-t0": 1.0}})
        assert short.needs == ()
        rounded = decide(self.config(), START, [], GPUS, {"gpu": forecast(4.2)},
                         shapes={"gpu": {"1d-t2": 1.2, "2d-t0": 3.0}})
        assert [(n.gpus, n.shapes) for n in rounded.needs] == [(3, (("1d-t2", 1.0), ("2d-t0", 2.0)))]

    def test_shape_history_with_no_class_coming_holds_nothing(self) -> None:
        # The pool's GPU total forecasts 4, but no class does: no cheapest-GPU headroom that no pod could use.
        held = [make_claim(warm=FORECAST_WARM, created_at=START - timedelta(hours=1))]
        decision = decide(self.config(), START, held, GPUS, {"gpu": forecast(4)}, shapes={"gpu": {}})
        assert decision.needs == ()
        assert [c.claim.id for c in decision.releases] == [held[0].id]
        without_shapes = decide(self.config(), START, [], GPUS, {"gpu": forecast(4)})
        assert [n.gpus for n in without_shapes.needs] == [4]

"""The cost decomposition: known answers on hand-made traces, and parts that add up to the cost on random ones."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_autoscaler.simulation.costs import COST_PARTS, CostLedger
from gpu_autoscaler.simulation.engine import PolicyRun
from gpu_autoscaler.simulation.policies import POLICY_NAMES, build_policy
from gpu_autoscaler.simulation.settings import SimulationSettings
from tests.unit.simulation.builders import MIXED_CATALOG as CATALOG
from tests.unit.simulation.builders import MIXED_CONFIG as CONFIG
from tests.unit.simulation.builders import make_catalog, make_config, make_pod, make_pool, make_trace
from tests.unit.simulation.builders import settings as sim_settings

PACK, QUEUE, BOOT = 10.0, 2.0, 300.0


def test_the_ledger_splits_one_instance_by_its_state() -> None:
    ledger = CostLedger()
    ledger.launched("i-1", 0.0, price_per_hour=3600.0 * 4, gpus=4, pool="gpu")  # 4 USD a second, 1 a GPU-second
    ledger.ready("i-1", 10.0)  # 40 booting
    ledger.pod_started("i-1", "a", 20.0, share=1.0, bound_per_gpu_second=0.5,  # 40 empty, not held: lag
                       allocatable_per_gpu_second=0.75)
    ledger.pod_started("i-1", "b", 20.0, share=0.5, bound_per_gpu_second=None)
    # 20..30: 1.5 GPUs used: work 0.5/s, overhead 0.25/s, premium (1.5 - 0.75)/s, fragmentation 2.5/s
    ledger.pod_stopped("a", 30.0)
    ledger.pod_stopped("b", 30.0)
    ledger.warm("i-1", 30.0, held=True)
    ledger.noticed("i-1", 40.0)  # 40 warm idle
    ledger.terminated("i-1", 45.0)  # 20 under notice
    parts = ledger.breakdown(total=4.0 * 45)
    assert parts == pytest.approx({
        "lowerBound": 5.0, "booting": 40.0, "warmIdle": 40.0, "fragmentation": 25.0, "nodeOverhead": 2.5,
        "pricePremium": 7.5,
        "consolidationLag": 40.0, "spotInterruption": 20.0, "other": 0.0,
    })


def test_the_ledger_keeps_each_pools_parts_apart_and_they_add_up_to_the_whole() -> None:
    ledger = CostLedger()
    ledger.launched("i-1", 0.0, price_per_hour=3600.0, gpus=1, pool="training")  # 1 USD a second
    ledger.launched("i-2", 0.0, price_per_hour=7200.0, gpus=1, pool="shared")  # 2 USD a second
    ledger.launched("i-3", 5.0, price_per_hour=3600.0, gpus=1, pool="shared")
    ledger.ready("i-1", 10.0)
    ledger.ready("i-2", 10.0)
    ledger.pod_started("i-2", "p", 10.0, share=1.0, bound_per_gpu_second=1.0)
    ledger.close(20.0)
    zero = dict.fromkeys(COST_PARTS, 0.0)
    by_pool = ledger.by_pool()
    assert by_pool == {
        "training": pytest.approx({**zero, "booting": 10.0, "consolidationLag": 10.0}),
        "shared": pytest.approx({**zero, "booting": 20.0 + 15.0, "lowerBound": 10.0, "pricePremium": 10.0}),
    }
    whole = ledger.breakdown(total=20.0 + 40.0 + 15.0)
    assert whole == pytest.approx({part: sum(p[part] for p in by_pool.values()) for part in COST_PARTS} | {"other": 0})


def test_a_pod_on_a_node_of_its_own_costs_its_bound_plus_the_boot() -> None:
    catalog = make_catalog(spot=False)
    trace = make_trace(make_pod(arrival=100.0, duration=3600.0))
    config = make_config()
    result = PolicyRun(build_policy("ours", config, catalog, trace.pods), trace, catalog, sim_settings()).run()
    parts = result.cost_breakdown
    assert parts["booting"] == pytest.approx(0.526 * BOOT / 3600)
    assert parts["lowerBound"] == pytest.approx(result.lower_bound) == pytest.approx(0.526)
    assert parts["pricePremium"] == pytest.approx(0.0, abs=1e-9)
    assert sum(parts.values()) == pytest.approx(result.cost)
    assert result.to_json()["costBreakdown"]["booting"] == round(0.526 * BOOT / 3600, 2)


def test_the_cost_by_pool_names_each_pools_instance_types_and_what_they_cost() -> None:
    # A whole-GPU pod lands in the whole-GPU pool, a quarter of a GPU in the time-slicing pool: each pool's cost is
    # its own node's, from launch to termination, split into the same parts as the run's.
    catalog = make_catalog(("g4dn.xlarge",), spot=False)
    trace = make_trace(make_pod(0, arrival=0.0, duration=3600.0),
                       make_pod(1, arrival=0.0, duration=3600.0, milli=250, cpu=1000, memory=2048))
    result = PolicyRun(build_policy("ours-no-prediction", CONFIG, catalog, trace.pods), trace, catalog,
                       sim_settings()).run()
    pools = result.to_json()["costByPool"]
    assert list(pools) == ["gpu", "gpu-shared"]
    for name, pool in pools.items():
        assert pool["nodesLaunched"] == 1, name
        [only] = pool["instanceTypes"]
        hours = result.cost_by_pool[name].types["g4dn.xlarge", "on-demand"].hours
        assert only == {"instanceType": "g4dn.xlarge", "capacityType": "on-demand", "cost": pool["cost"],
                        "nodesLaunched": 1, "hours": round(hours, 2)}, name
        assert hours >= (BOOT + 3600.0) / 3600, "up from launch: its boot and its pod's hour at least"
        assert pool["cost"] == pytest.approx(0.526 * hours, abs=0.01), name
        assert sum(pool["costBreakdown"].values()) == pytest.approx(pool["cost"], abs=0.02), name
    assert pools["gpu"]["costBreakdown"]["lowerBound"] == pytest.approx(0.526, abs=0.01)
    assert pools["gpu-shared"]["costBreakdown"]["lowerBound"] == pytest.approx(0.526 / 4, abs=0.01)
    assert sum(p["cost"] for p in pools.values()) == pytest.approx(result.cost, abs=0.02)


def test_a_dearer_type_forced_by_memory_is_a_premium_and_its_idle_gpus_are_fragmentation() -> None:
    catalog = make_catalog(("g4dn.xlarge", "g4dn.12xlarge"), spot=False)
    # 100 GiB of memory: only the 4-GPU type holds it; the bound prices its one GPU at that type's per-GPU price.
    trace = make_trace(make_pod(arrival=0.0, duration=3600.0, memory=100 * 1024))
    result = PolicyRun(build_policy("ours", make_config(), catalog, trace.pods), trace, catalog,
                       sim_settings()).run()
    parts = result.cost_breakdown
    assert parts["lowerBound"] == pytest.approx(3.912 / 4)
    assert parts["pricePremium"] == pytest.approx(0.0, abs=1e-9), "the bound already pays for the memory"
    assert parts["fragmentation"] == pytest.approx(3.912 * 3 / 4), "three GPUs idle for the pod's hour"


def test_a_pod_asking_a_whole_node_pays_the_reservations_as_overhead_not_premium() -> None:
    catalog = make_catalog(("g4dn.xlarge", "g4dn.12xlarge"), spot=False)
    # 4 vCPU: all of a g4dn.xlarge's capacity (the bound's price), but kubelet reservations leave less
    # allocatable, so only the 4-GPU type holds it: the difference is overhead, no policy's choice.
    trace = make_trace(make_pod(arrival=0.0, duration=3600.0, cpu=4000, memory=8192))
    result = PolicyRun(build_policy("ours", make_config(), catalog, trace.pods), trace, catalog,
                       sim_settings()).run()
    parts = result.cost_breakdown
    assert parts["lowerBound"] == pytest.approx(0.526)
    assert parts["nodeOverhead"] == pytest.approx(3.912 / 4 - 0.526)
    assert parts["pricePremium"] == pytest.approx(0.0, abs=1e-9)


def test_warm_capacity_held_by_a_window_is_warm_idle() -> None:
    catalog = make_catalog(spot=False)
    window = {"name": "night-batch", "schedule": "cron(0 1 * * ? *)", "timezone": "UTC", "duration": "2h",
              "nodePool": "gpu", "warm": {"gpus": 1}}
    trace = make_trace(make_pod(arrival=5400.0, duration=600.0))
    config = make_config(scalingWindows=[window])
    result = PolicyRun(build_policy("ours", config, catalog, trace.pods), trace, catalog, sim_settings()).run()
    parts = result.cost_breakdown
    launched, ready = 4500.0 + QUEUE, 4500.0 + QUEUE + BOOT
    assert parts["booting"] == pytest.approx(0.526 * (ready - launched) / 3600)
    assert parts["warmIdle"] == pytest.approx(0.526 * (5400.0 - ready) / 3600)
    assert parts["consolidationLag"] == pytest.approx(0.0, abs=1e-9)


def test_a_spot_warning_charges_the_notice_to_interruption() -> None:
    catalog = make_catalog(band=4)
    config = make_config(make_pool(capacityTypes=["spot", "on-demand"]))
    trace = make_trace(make_pod(arrival=0.0, duration=5 * 86400.0))
    result = PolicyRun(build_policy("ours", config, catalog, trace.pods), trace, catalog,
                       sim_settings(spot_monthly_interruption=(0.999,) * 5, seed=3)).run()
    assert result.interruptions >= 1
    assert result.cost_breakdown["spotInterruption"] > 0
    assert sum(result.cost_breakdown.values()) == pytest.approx(result.cost)


pods = st.builds(
    lambda arrival, duration, gpus, milli, memory: make_pod(
        0, arrival=arrival, duration=duration, gpus=gpus, milli=milli if gpus == 1 else 1000, memory=memory),
    st.floats(0, 6 * 3600, allow_nan=False),
    st.floats(1, 2 * 86400, allow_nan=False),
    st.sampled_from([1, 1, 2, 4, 8]),
    st.sampled_from([250, 470, 1000]),
    st.integers(1024, 300_000),
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pods, min_size=1, max_size=6), st.integers(0, 3))
def test_the_parts_add_up_to_the_cost_and_the_bound_is_the_lower_bound(drawn, seed) -> None:
    trace = make_trace(*(replace(p, index=i, name=f"pod-{i}") for i, p in enumerate(drawn)))
    rough = SimulationSettings(seed=seed, insufficient_capacity_rate=0.3, spot_monthly_interruption=(0.999,) * 5)
    for name in POLICY_NAMES:
        result = PolicyRun(build_policy(name, CONFIG, CATALOG, trace.pods), trace, CATALOG, rough).run()
        parts = result.cost_breakdown
        assert set(parts) == {*COST_PARTS, "other"}
        assert parts["lowerBound"] == pytest.approx(result.lower_bound, rel=1e-9, abs=1e-9), name
        assert abs(parts["other"]) <= 1e-6 * max(result.cost, 1.0), name
        waste = {k: v for k, v in parts.items() if k not in ("lowerBound", "pricePremium", "other")}
        assert parts["pricePremium"] >= -1e-6 * max(result.cost, 1.0), name
        assert all(v >= -1e-9 for v in waste.values()), (name, waste)
        pools = result.cost_by_pool
        assert sum(p.cost for p in pools.values()) == pytest.approx(result.cost, rel=1e-9, abs=1e-9), name
        assert sum(p.nodes for p in pools.values()) == result.nodes_launched, name
        for pool in pools.values():
            assert sum(pool.breakdown().values()) == pytest.approx(pool.cost, rel=1e-9, abs=1e-9), name
            assert abs(pool.breakdown()["other"]) <= 1e-6 * max(pool.cost, 1.0), name
        for part in COST_PARTS:
            assert sum(p.parts[part] for p in pools.values()) == pytest.approx(parts[part], rel=1e-9, abs=1e-9)

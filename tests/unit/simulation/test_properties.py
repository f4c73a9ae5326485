"""Determinism for a seed, and the lower bound below every policy's cost whatever the trace."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_autoscaler.simulation.engine import PolicyRun
from gpu_autoscaler.simulation.policies import POLICY_NAMES, build_policy
from gpu_autoscaler.simulation.run import simulate
from gpu_autoscaler.simulation.settings import SimulationSettings
from tests.unit.simulation.builders import MIXED_CATALOG as CATALOG
from tests.unit.simulation.builders import MIXED_CONFIG as CONFIG
from tests.unit.simulation.builders import make_pod, make_trace

ROUGH: dict[str, Any] = {"insufficient_capacity_rate": 0.3, "spot_monthly_interruption": (0.999,) * 5}
"""Capacity errors and interruptions often enough that a short trace meets them."""


def _mixed_trace():
    pods = [
        make_pod(0, arrival=0.0, duration=3 * 86400.0, gpus=1, milli=470),
        make_pod(1, arrival=60.0, duration=7200.0, gpus=4, cpu=24000, memory=65536),
        make_pod(2, arrival=61.0, duration=600.0, gpus=1, milli=230),
        make_pod(3, arrival=3600.0, duration=None, deleted_at=3700.0),
        make_pod(4, arrival=7200.0, duration=2 * 86400.0, gpus=8, cpu=64000, memory=600_000),
        make_pod(5, arrival=7300.0, duration=50.0, gpus=2, cpu=8000, memory=32768),
    ]
    return make_trace(*pods)


def test_the_same_seed_gives_the_same_report() -> None:
    trace = _mixed_trace()
    runs = [simulate(trace, CONFIG, settings=SimulationSettings(seed=11, **ROUGH), catalog=CATALOG, workers=1)
            for _ in range(2)]
    first, second = ([{k: v for k, v in p.items() if k != "runSeconds"} for p in r.to_json()["policies"]]
                     for r in runs)
    assert first == second
    assert any(p["interruptions"] or p["insufficientCapacityErrors"] for p in first), "the seed met some trouble"


def test_parallel_processes_give_the_same_report_as_one() -> None:
    trace = _mixed_trace()
    kwargs: dict[str, Any] = {"settings": SimulationSettings(seed=5, **ROUGH), "catalog": CATALOG}
    alone = simulate(trace, CONFIG, workers=1, **kwargs).to_json()["policies"]
    side_by_side = simulate(trace, CONFIG, workers=2, **kwargs).to_json()["policies"]
    strip = lambda ps: [{k: v for k, v in p.items() if k != "runSeconds"} for p in ps]  # noqa: E731
    assert strip(alone) == strip(side_by_side)


pods = st.builds(
    lambda i, arrival, duration, gpus, milli, cpu, memory: make_pod(
        i, arrival=arrival, duration=duration, gpus=gpus, milli=milli if gpus == 1 else 1000, cpu=cpu, memory=memory),
    st.just(0),
    st.floats(0, 6 * 3600, allow_nan=False),
    st.floats(1, 2 * 86400, allow_nan=False),
    st.sampled_from([1, 1, 1, 2, 4, 8]),
    st.sampled_from([100, 250, 470, 810, 1000]),
    st.integers(500, 40_000),
    st.integers(1024, 300_000),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pods, min_size=1, max_size=6), st.integers(0, 3))
def test_the_lower_bound_never_exceeds_any_policys_cost(drawn, seed) -> None:
    trace = make_trace(*(replace(p, index=i, name=f"pod-{i}") for i, p in enumerate(drawn)))
    for name in POLICY_NAMES:
        policy = build_policy(name, CONFIG, CATALOG, trace.pods)
        result = PolicyRun(policy, trace, CATALOG, SimulationSettings(seed=seed, **ROUGH)).run()
        assert result.lower_bound <= result.cost + 1e-9, name
        assert result.gpu_hours_allocated <= result.gpu_hours_provisioned + 1e-9, name

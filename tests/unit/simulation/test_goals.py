"""Issue 16's goals judged from report.json's policies: each verdict from figures worked out by hand."""

from __future__ import annotations

from typing import Any

from benchmarks.simulation.goals import judge, total


def policy(name: str, cost: float, *, bound: float = 100.0, p95: float = 312.0, ran: int = 1000,
           launched: int = 100) -> dict[str, Any]:
    return {"name": name, "cost": cost, "lowerBound": bound, "waitP95": p95, "podsRan": ran,
            "nodesLaunched": launched}



def test_the_readme_default_trace_figures_miss_all_but_launches() -> None:
    # Seed 0, main after the sixth round (README): 23,822 / 23,014 / 24,930 USD; launches 2,293 / 1,937.
    goals = judge([policy("ours", 23_822, bound=17_785, ran=6_883, launched=2_293),
                   policy("ours-no-prediction", 23_014, bound=17_790, ran=6_830, launched=2_144),
                   policy("karpenter-like", 24_930, bound=17_800, ran=6_887, launched=1_937)])
    assert [(g.met, g.figures.split(" (")[0]) for g in goals] == [
        (False, "+4.4%"),  # 1 - 23,822 / 24,930
        (False, "1.34 ×"),  # 23,822 / 17,785
        (True, "1.18 ×"),  # 2,293 / 1,937
        (False, "p95 312 vs 312 s, cost +3.5%"),  # 23,822 / 23,014 - 1
    ]


def test_each_goal_met_at_its_threshold() -> None:
    goals = judge([policy("ours", 85.0, bound=68.0, p95=150.0, ran=1000, launched=150),
                   policy("ours-no-prediction", 80.0, p95=300.0),
                   policy("karpenter-like", 100.0, p95=150.0, ran=1000, launched=100)])
    assert [g.met for g in goals] == [True, True, True, True]


def test_one_pod_fewer_or_a_worse_p95_misses_the_cost_goal_however_cheap() -> None:
    base = policy("karpenter-like", 100.0, p95=100.0, ran=1000)
    assert not judge([policy("ours", 50.0, p95=100.0, ran=999), base])[0].met
    assert not judge([policy("ours", 50.0, p95=101.0, ran=1000), base])[0].met
    assert judge([policy("ours", 50.0, p95=100.0, ran=1000), base])[0].met


def test_karpenter_overlay_is_the_baseline_when_the_run_has_it() -> None:
    goals = judge([policy("ours", 90.0, launched=160), policy("karpenter-like", 200.0, launched=100),
                   policy("karpenter-overlay", 100.0, launched=100)])
    assert "karpenter-overlay" in goals[0].name and not goals[0].met  # 10 % cheaper than the overlay
    assert "karpenter-overlay" in goals[2].name and not goals[2].met  # 1.6 ×


def test_goals_whose_policies_the_run_lacks_are_left_out() -> None:
    assert [g.name.split(" ")[1] for g in judge([policy("ours", 120.0)])] == ["≤"]
    assert judge([policy("karpenter-like", 100.0)]) == []


def test_runs_sum_their_figures_and_keep_the_worst_p95() -> None:
    runs = [[policy("ours", 80.0, p95=100.0, launched=10), policy("karpenter-like", 100.0)],
            [policy("ours", 90.0, p95=312.0, launched=20), policy("karpenter-like", 100.0),
             policy("fixed-node-group", 500.0)]]
    summed = {p["name"]: p for p in total(runs)}
    assert set(summed) == {"ours", "karpenter-like"}  # fixed-node-group ran in one of the two
    assert summed["ours"] == {"name": "ours", "cost": 170.0, "lowerBound": 200.0, "podsRan": 2000,
                              "nodesLaunched": 30, "waitP95": 312.0}

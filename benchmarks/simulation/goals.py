"""Issue 16's economics goals, judged from simulation reports: where each stands, met or missed.

    python -m benchmarks.simulation.goals REPORT.json [REPORT.json ...]

Each report is judged on its own; given several (the same trace under different seeds), their sums are
judged too, since one seed moves a baseline's cost by ~6 % (README, "The simulator") and a margin of
15 % should hold over more than one draw of Spot interruptions and capacity errors.

The baseline is `karpenter-overlay` where the run has it (on traces whose pods share GPUs, Karpenter
would advertise the time-slicing replicas with a NodeOverlay, so it is the fair comparison) and
`karpenter-like` otherwise. The goals, as the issue states them:

- ours ≥ 15 % cheaper than the baseline, at a p95 wait no worse, with no fewer pods run;
- ours ≤ 1.25 × the clairvoyant lower bound;
- ours launches ≤ 1.5 × the baseline's nodes;
- prediction (`ours` against `ours-no-prediction`) halves the p95 wait at ≤ 10 % extra cost.

The replay-time goal (≤ 60 s) is the `simulation` benchmark's own line.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["Goal", "baseline_name", "judge", "main", "total"]

CHEAPER_BY = 0.15
BOUND_RATIO = 1.25
LAUNCH_RATIO = 1.5
P95_FACTOR = 0.5
PREDICTION_EXTRA = 0.10


@dataclass(frozen=True)
class Goal:
    name: str
    figures: str
    met: bool

    def line(self) -> str:
        return f"  {'met   ' if self.met else 'MISSED'}  {self.name}: {self.figures}"


def baseline_name(policies: Mapping[str, Mapping[str, Any]]) -> str | None:
    for name in ("karpenter-overlay", "karpenter-like"):
        if name in policies:
            return name
    return None


def judge(policies: Sequence[Mapping[str, Any]]) -> list[Goal]:
    """The goals a run's policies (report.json's `policies`) can be judged on; those whose policies the
    run lacks are left out rather than guessed."""
    by_name = {p["name"]: p for p in policies}
    ours, blind = by_name.get("ours"), by_name.get("ours-no-prediction")
    base_name = baseline_name(by_name)
    goals: list[Goal] = []
    if ours is not None and base_name is not None:
        base = by_name[base_name]
        cheaper = 1 - ours["cost"] / base["cost"]
        goals.append(Goal(
            f"ours ≥ {CHEAPER_BY:.0%} cheaper than {base_name}, p95 no worse, no fewer pods run",
            f"{cheaper:+.1%} ({ours['cost']:,.0f} vs {base['cost']:,.0f} USD), p95 {ours['waitP95']:.0f} vs "
            f"{base['waitP95']:.0f} s, pods run {ours['podsRan']:,} vs {base['podsRan']:,}",
            cheaper >= CHEAPER_BY and ours["waitP95"] <= base["waitP95"] and ours["podsRan"] >= base["podsRan"]))
    if ours is not None:
        ratio = ours["cost"] / ours["lowerBound"]
        goals.append(Goal(f"ours ≤ {BOUND_RATIO} × the lower bound",
                          f"{ratio:.2f} × ({ours['cost']:,.0f} vs {ours['lowerBound']:,.0f} USD)",
                          ratio <= BOUND_RATIO))
    if ours is not None and base_name is not None:
        base = by_name[base_name]
        launches = ours["nodesLaunched"] / base["nodesLaunched"] if base["nodesLaunched"] else float("inf")
        goals.append(Goal(f"ours launches ≤ {LAUNCH_RATIO} × {base_name}'s nodes",
                          f"{launches:.2f} × ({ours['nodesLaunched']:,} vs {base['nodesLaunched']:,})",
                          launches <= LAUNCH_RATIO))
    if ours is not None and blind is not None:
        extra = ours["cost"] / blind["cost"] - 1
        goals.append(Goal(
            f"prediction halves ours-no-prediction's p95 at ≤ {PREDICTION_EXTRA:.0%} extra cost",
            f"p95 {ours['waitP95']:.0f} vs {blind['waitP95']:.0f} s, cost {extra:+.1%}",
            ours["waitP95"] <= P95_FACTOR * blind["waitP95"] and extra <= PREDICTION_EXTRA))
    return goals


def total(runs: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The policies every run has, summed over the runs: costs, bounds, pods and launches add up; the p95
    of the sums is the worst run's, which is what "no worse" has to survive."""
    names = [p["name"] for p in runs[0] if all(any(q["name"] == p["name"] for q in run) for run in runs)]
    summed = []
    for name in names:
        each = [next(p for p in run if p["name"] == name) for run in runs]
        summed.append({"name": name, **{key: sum(p[key] for p in each)
                                        for key in ("cost", "lowerBound", "podsRan", "nodesLaunched")},
                       "waitP95": max(p["waitP95"] for p in each)})
    return summed


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print(__doc__)
        return 2
    runs = []
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        runs.append(report["policies"])
        print(f"{path} (seed {report['settings'].get('seed')}, {report['trace'].get('file', '')}):")
        for goal in judge(report["policies"]):
            print(goal.line())
    if len(runs) > 1:
        print(f"summed over the {len(runs)} runs:")
        for goal in judge(total(runs)):
            print(goal.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())

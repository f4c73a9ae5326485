"""Packing quality: our plan's USD/h against the exact MILP and a Karpenter-like baseline.

    python -m benchmarks packing-quality [--scenarios N] [--random N] [--seed S] [--time-limit S]

For each scenario: the plan's USD/h, the MILP's (best found, and the proven lower bound), the ratio of
ours to each, and the baseline's ratio. Target: ours ≤ 1.02 × optimum on every scenario.

The MILP prices one batch alone, so ours is planned for the same objective: every pool's `spareRoomWorth` at 0.
The default (0.8) may buy a roomier node for a batch of up to four pods, for the pods that come next (the
simulator measures what that is worth over a trace); the column `room/MILP` shows that plan against the same
optimum, and its worst is printed apart, not held to the target.

Two sets: the 24 themed scenarios (`--scenarios`, seeds 0 …), and `--random N` randomised ones from
`--seed S` on (1/2/4/8-GPU workloads with CPU and memory drawn per GPU, GPU-name and GPU-memory selectors,
time-sliced shares, one to three pools, over all six zones of us-east-1), named `r<seed>-…`. To replay
one: `--scenarios 0 --random 1 --seed <seed>`.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from benchmarks.packing.catalog import region_catalog
from benchmarks.packing.milp import solve_reference
from benchmarks.packing.scenarios import RANDOM_SEED, random_scenarios, scenarios
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.packing import Solver
from gpu_autoscaler.domain.packing.baseline import first_fit_decreasing

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="packing-quality")
    parser.add_argument("--scenarios", type=int, default=24, help="themed scenarios (seeds 0 … N − 1)")
    parser.add_argument("--random", type=int, default=30, help="randomised scenarios")
    parser.add_argument("--seed", type=int, default=RANDOM_SEED, help="first seed of the randomised scenarios")
    parser.add_argument("--time-limit", type=float, default=60.0, help="MILP time limit per tier, seconds")
    args = parser.parse_args(argv)
    clock = FixedClock(datetime(2026, 11, 22, tzinfo=UTC))
    header = (f"{'scenario':<34}{'pods':>5}{'classes':>8}{'ours $/h':>11}{'MILP $/h':>11}{'bound $/h':>11}"
              f"{'ours/MILP':>10}{'room/MILP':>10}{'ours/bound':>11}{'gap':>8}{'FFD/MILP':>10}{'plan ms':>9}"
              f"{'MILP s':>8}  notes")
    print(header)
    print("-" * len(header))
    worst = (0.0, "")
    worst_bound = (0.0, "")
    worst_room = (0.0, "")
    ffd_ratios = []
    proven = 0
    count = 0
    for sc in [*scenarios(args.scenarios), *random_scenarios(args.random, args.seed)]:
        catalog = region_catalog("us-east-1", sc.config.zones)
        batch_config = _without_spare_room(sc.config)
        ours_solver = Solver(batch_config, catalog, clock)
        started = time.perf_counter()
        plan = ours_solver.solve(sc.pods)
        plan_ms = (time.perf_counter() - started) * 1000
        roomy = Solver(sc.config, catalog, clock).solve(sc.pods).total_price_per_hour
        baseline = Solver(sc.config, catalog, clock, packer=first_fit_decreasing).solve(sc.pods)
        reference = solve_reference(sc.config, catalog, sc.pods, plan, time_limit=args.time_limit)
        ours = plan.total_price_per_hour
        # A scenario whose pods all stay unschedulable costs nothing either way: ratio 1.
        ratio = _ratio(ours, reference.best)
        ratio_bound = _ratio(ours, reference.lower_bound)
        ratio_room = _ratio(roomy, reference.best)
        ffd = _ratio(baseline.total_price_per_hour, reference.best)
        ffd_ratios.append(ffd)
        notes = []
        if plan.unschedulable:
            notes.append(f"{len(plan.unschedulable)} unschedulable (MILP: {reference.unplaceable})")
        if len(baseline.unschedulable) != len(plan.unschedulable):
            notes.append(f"baseline left {len(baseline.unschedulable)}")
        if reference.exact_tiers < reference.tiers:
            notes.append(f"column generation in {reference.tiers - reference.exact_tiers} of {reference.tiers} tiers")
        if reference.time_limit_hit:
            notes.append(f"MILP time limit hit, gap {reference.gap:.2%} proven")
        if not reference.converged:
            notes.append("column generation did not converge: bound not proven")
        proven += reference.gap < 1e-6
        classes = len({(tuple(p.requests.items()), tuple(p.node_selector.items()), p.required_node_affinity,
                        p.tolerations, p.gang) for p in sc.pods})
        print(f"{sc.name:<34}{sc.size:>5}{classes:>8}{ours:>11.3f}{reference.best:>11.3f}{reference.lower_bound:>11.3f}"
              f"{ratio:>10.4f}{ratio_room:>10.4f}{ratio_bound:>11.4f}{reference.gap:>8.2%}{ffd:>10.3f}{plan_ms:>9.1f}"
              f"{reference.seconds:>8.1f}  {', '.join(notes)}")
        count += 1
        worst = max(worst, (ratio, sc.name))
        worst_bound = max(worst_bound, (ratio_bound, sc.name))
        worst_room = max(worst_room, (ratio_room, sc.name))
    print("-" * len(header))
    print(f"scenarios: {count}; MILP optimum proven (gap 0) in {proven}")
    print(f"worst ours/MILP:  {worst[0]:.4f} ({worst[1]})   target ≤ 1.02")
    print(f"worst with the default spareRoomWorth (room bought for pods to come, not valued by one batch's "
          f"optimum): {worst_room[0]:.4f} ({worst_room[1]})")
    print(f"worst ours/bound: {worst_bound[0]:.4f} ({worst_bound[1]})   (against the proven lower bound)")
    print(f"Karpenter-like FFD/MILP: mean {sum(ffd_ratios) / len(ffd_ratios):.3f}, worst {max(ffd_ratios):.3f}")
    return 0 if worst[0] <= 1.02 else 1


def _without_spare_room(config: Config) -> Config:
    """The configuration with every pool's `spareRoomWorth` at 0: the plan for the batch alone."""
    pools = [p.model_copy(update={"spare_room_worth": 0.0}) for p in config.node_pools]
    return config.model_copy(update={"node_pools": pools})


def _ratio(value: float, reference: float) -> float:
    if reference > 0:
        return value / reference
    return 1.0 if value <= 0 else float("inf")


if __name__ == "__main__":
    raise SystemExit(main())

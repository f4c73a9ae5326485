"""The chaos scenarios' figures (issue 19), on one running emulator, with the suite's invariant checker.

    python -m benchmarks chaos [--seeds 0,1,2] [--pods 200] [--throttle-seconds 60] [--outage-seconds 60]

Printed per scenario and seed: wall-clock seconds of each phase (pods bound, node replaced, capacity given
back), what was injected (crashes, duplicated messages, throttled calls) and whether the four invariants held
(`tests/chaos/invariants.py`). The emulator runs rate schedules 30× faster and boots nodes in 1.5 s, so the
seconds measure the pipeline's own work and retries under load, not EC2's or a kubelet's.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

from tests.chaos.outage import api_outage_during_drain
from tests.chaos.rig import running_rig
from tests.chaos.scenarios import (
    conflicting_launches,
    crash_lifecycle,
    crash_points_for,
    duplicate_lifecycle,
    interruption_storm,
    throttling_storm,
)
from tests.chaos.skew import Skew, skewed_lifecycle

__all__ = ["main"]


def _row(name: str, seconds: dict[str, float], injected: str, ok: bool, detail: str = "") -> None:
    phases = "  ".join(f"{k} {v:5.1f} s" for k, v in seconds.items())
    print(f"{name:<28} {phases:<52} {injected:<34} {'ok' if ok else 'VIOLATED'} {detail}", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks chaos")
    parser.add_argument("--seeds", default="0", help="crash and duplicate seeds (0: the fixed points)")
    parser.add_argument("--pods", type=int, default=40, help="pods arriving during throttling (the issue: 200)")
    parser.add_argument("--throttle-seconds", type=float, default=15.0)
    parser.add_argument("--outage-seconds", type=float, default=15.0, help="API outage in scenario 7 (the issue: 60)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    status = 0
    began = time.monotonic()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    with running_rig() as rig:
        print(f"emulator started in {time.monotonic() - began:.1f} s")
        for seed in seeds:
            result, plan = crash_lifecycle(rig, crash_points_for(seed), prefix=f"c{seed}")
            _row(f"3 crashes, seed {seed}", result.seconds, f"{len(plan.crashed)} crashes", result.report.ok,
                 "; ".join(result.crashed))
            status |= not result.report.ok
        for seed in seeds:
            result, plan = duplicate_lifecycle(rig, seed, prefix=f"d{seed}")
            _row(f"4 duplicates, seed {seed}", result.seconds, f"{sum(plan.duplicated.values())} copies",
                 result.report.ok)
            status |= not result.report.ok
        storm = interruption_storm(rig)
        _row("4 rebalance+5 warnings", storm.seconds, "1 rebalance, 5 warnings", storm.report.ok)
        status |= not storm.report.ok
        conflict, plan = conflicting_launches(rig)
        _row("5 two writers, one claim", conflict.seconds,
             f"{sum(came for _, came in plan.released)}/{len(plan.released)} overlapped", conflict.report.ok)
        status |= not conflict.report.ok
        throttled = throttling_storm(rig, pods=args.pods, seconds=args.throttle_seconds)
        _row(f"1 throttling 30 %, {args.pods} pods", {"bound": throttled.seconds_to_bound},
             f"{throttled.refused}/{throttled.seen} refused", throttled.report.ok,
             f"{throttled.dead_letters} dead letters")
        status |= not throttled.report.ok
        outage = api_outage_during_drain(rig, seconds=args.outage_seconds)
        _row(f"7 API down {args.outage_seconds:.0f} s in a drain", outage.seconds,
             f"503 for {args.outage_seconds:.0f} s, {outage.drain_retries} drain retries", outage.report.ok,
             f"fewest guarded pods running {outage.min_running}/{outage.pods}; relisted {outage.relisted}")
        status |= not outage.report.ok
        skew = Skew(api_server=timedelta(minutes=2), agent=timedelta(minutes=-2))
        skewed = skewed_lifecycle(rig, skew, prefix="s0")
        _row("8 clocks 2 min apart", skewed.seconds, str(skew), skewed.report.ok)
        status |= not skewed.report.ok
    print(f"total {time.monotonic() - began:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return int(status)

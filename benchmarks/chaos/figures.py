"""The chaos scenarios' figures (issue 19), on one running emulator, with the suite's invariant checker.

    python -m benchmarks chaos [--seeds 0,1,2] [--pods 200] [--throttle-seconds 60] [--warned-nodes 100]
                               [--warning-seconds 60] [--outage-seconds 60] [--scenarios 1,2,6,7,8]

Printed per scenario and seed: wall-clock seconds of each phase (pods bound, node replaced, capacity given
back; for the capacity storm, from capacity back to every pod bound; for the Spot warnings, from the first and the
last warning to every pod bound again), what was injected (crashes, duplicated messages, throttled calls, launches
refused for insufficient capacity, Spot warnings) and whether the four invariants held
(`tests/chaos/invariants.py`). The emulator runs rate schedules 30× faster and boots nodes in 1.5 s, so the
seconds measure the pipeline's own work and retries under load, not EC2's or a kubelet's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from tests.chaos.outage import api_outage_during_drain
from tests.chaos.rig import SOAK_GC_GRACE, chaos_config, running_rig
from tests.chaos.scenarios import (
    capacity_storm_lifecycle,
    conflicting_launches,
    crash_lifecycle,
    crash_points_for,
    duplicate_lifecycle,
    interruption_storm,
    spot_warning_storm,
    storm_shape,
    throttling_storm,
)
from tests.chaos.skew import Skew, skewed_lifecycle

if TYPE_CHECKING:
    from tests.chaos.invariants import Report

__all__ = ["main"]


def _row(name: str, seconds: dict[str, float], injected: str, ok: bool, detail: str = "") -> None:
    phases = "  ".join(f"{k} {v:5.1f} s" for k, v in seconds.items())
    print(f"{name:<28} {phases:<52} {injected:<34} {'ok' if ok else 'VIOLATED'} {detail}", flush=True)


def _violations(report: Report) -> None:
    """What a VIOLATED row broke, and the figures the checker saw (the long scenarios are not cheap to rerun). The
    figures are the last check's (after the capacity was given back: 0 pods, 0 instances when it was); the
    violations are every phase's, each found at its own check."""
    if not report.ok:
        print(f"  last check: {report}", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks chaos")
    parser.add_argument("--seeds", default="0", help="crash and duplicate seeds (0: the fixed points)")
    parser.add_argument("--pods", type=int, default=20, help="pods arriving during throttling (the issue: 200)")
    parser.add_argument("--throttle-seconds", type=float, default=8.0, help="(the issue: 120)")
    parser.add_argument("--warned-nodes", type=int, default=6, help="nodes given a Spot warning (the issue: 100)")
    parser.add_argument("--warning-seconds", type=float, default=3.6, help="the warnings spread over (the issue: 60)")
    parser.add_argument("--scenarios", default="1,2,3,4,5,6,7,8", help="which scenarios to run")
    parser.add_argument("--outage-seconds", type=float, default=10.0, help="API outage in scenario 7 (the issue: 60)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    wanted = {s.strip() for s in args.scenarios.split(",")}
    status = 0
    began = time.monotonic()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    soak = args.pods > 40 or args.warned_nodes > 20  # the packer's and fleet's batches take tens of seconds
    with running_rig(chaos_config(gc_grace=SOAK_GC_GRACE) if soak else None) as rig:
        large = rig.soak_visibility if soak else contextlib.nullcontext
        print(f"emulator started in {time.monotonic() - began:.1f} s")
        for seed in seeds if "3" in wanted else ():
            result, plan = crash_lifecycle(rig, crash_points_for(seed), prefix=f"c{seed}")
            _row(f"3 crashes, seed {seed}", result.seconds, f"{len(plan.crashed)} crashes", result.report.ok,
                 "; ".join(result.crashed))
            status |= not result.report.ok
        for seed in seeds if "4" in wanted else ():
            result, plan = duplicate_lifecycle(rig, seed, prefix=f"d{seed}")
            _row(f"4 duplicates, seed {seed}", result.seconds, f"{sum(plan.duplicated.values())} copies",
                 result.report.ok)
            status |= not result.report.ok
        if "4" in wanted:
            storm = interruption_storm(rig)
            _row("4 rebalance+5 warnings", storm.seconds, "1 rebalance, 5 warnings", storm.report.ok)
            status |= not storm.report.ok
        if "5" in wanted:
            conflict, plan = conflicting_launches(rig)
            _row("5 two writers, one claim", conflict.seconds,
                 f"{sum(came for _, came in plan.released)}/{len(plan.released)} overlapped", conflict.report.ok)
            status |= not conflict.report.ok
        if "1" in wanted:
            with large():
                throttled = throttling_storm(rig, pods=args.pods, seconds=args.throttle_seconds)
            _row(f"1 throttling 30 %, {args.pods} pods", {"bound": throttled.seconds_to_bound},
                 f"{throttled.refused}/{throttled.seen} refused", throttled.report.ok,
                 f"{throttled.dead_letters} dead letters")
            status |= not throttled.report.ok
            _violations(throttled.report)
        for seed in seeds if "2" in wanted else ():
            family, count = storm_shape(seed)
            ice = capacity_storm_lifecycle(rig, family=family, pods=count, seed=seed, prefix=f"i{seed}")
            _row(f"2 {family} capacity storm, seed {seed}", {"bound after": ice.seconds_to_bound},
                 f"{ice.refused} launches refused", ice.report.ok,
                 f"{ice.on_demand}/{ice.pods // 2} On-Demand with Spot out; {ice.released}/{ice.pods - ice.pods // 2} "
                 f"released with a reason ({ice.told} told by an Event)")
            status |= not ice.report.ok
        if "6" in wanted:
            with large():
                warned = spot_warning_storm(rig, nodes=args.warned_nodes, seconds=args.warning_seconds)
            ok = warned.report.ok and not warned.shared
            _row(f"6 {warned.warnings} Spot warnings/{args.warning_seconds:g} s",
                 {"all bound": warned.seconds_to_bound, "after last": warned.seconds_after_last},
                 f"{warned.replacements} launched", ok,
                 f"peak {warned.peak_gpus}/{warned.limit_gpus} GPUs of the pool's limit; "
                 f"{len(warned.shared)} replacements shared")
            status |= not ok
            _violations(warned.report)
        if "7" in wanted:
            outage = api_outage_during_drain(rig, seconds=args.outage_seconds)
            _row(f"7 API down {args.outage_seconds:.0f} s in a drain", outage.seconds,
                 f"503 for {args.outage_seconds:.0f} s, {outage.drain_retries} drain retries", outage.report.ok,
                 f"fewest guarded pods running {outage.min_running}/{outage.pods}; relisted {outage.relisted}")
            status |= not outage.report.ok
        if "8" in wanted:
            skew = Skew(api_server=timedelta(minutes=2), agent=timedelta(minutes=-2))
            skewed = skewed_lifecycle(rig, skew, prefix="s0")
            _row("8 clocks 2 min apart", skewed.seconds, str(skew), skewed.report.ok)
            status |= not skewed.report.ok
    print(f"total {time.monotonic() - began:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return int(status)

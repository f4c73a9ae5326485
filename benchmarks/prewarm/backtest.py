"""Pre-warm backtest: the Alibaba GPU trace's demand replayed under no pre-warm, a scaling window, and the
forecast (and both), through the real window, forecast and decision code.

    python -m benchmarks prewarm-backtest [--trace FILE] [--boot MINUTES]

Per policy: the share of GPU demand that found free capacity on arrival (and on warm capacity), the
mean and 95th-percentile wait for capacity, and the idle GPU-hours it cost — idle warm capacity, and
idle capacity of any kind. See `replay` for the model and `profile` for how the window is set.

Anchor: AWS predictive scaling forecasts hourly, 48 h ahead, for Auto Scaling groups only; this
forecasts per 5 minutes, per pool, one lead time ahead, for fleets.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from benchmarks.prewarm.profile import derive_window
from benchmarks.prewarm.replay import Replay, ReplaySettings
from benchmarks.prewarm.trace import DEFAULT_TRACE, EPOCH, load_trace
from gpu_autoscaler.config import parse_config

if TYPE_CHECKING:
    from benchmarks.prewarm.replay import Outcome
    from gpu_autoscaler.config import Config

__all__ = ["main"]

DAY = 86400.0
REPLAY_FROM, SCORE_FROM = 114, 116
"""Trace days: the replay starts two days before the busy stretch (about 99 % of pods arrive from day
116 on), so the forecast has its 24 h of history before scoring begins; everything is scored from day 116."""
POOL = "gpu"


def config(*, windows: list[dict[str, Any]] | None = None, predictive: bool = False, lead_minutes: float = 8,
           max_warm_gpus: int = 16, quantile: float = 0.9) -> Config:
    return parse_config({
        "clusterName": "backtest",
        "region": "us-east-1",
        "kubernetes": {"endpoint": "https://backtest.invalid"},
        "network": {"subnets": {"us-east-1a": "subnet-0001"}, "securityGroups": ["sg-0001"]},
        "nodeRole": "arn:aws:iam::123456789012:role/backtest",
        "ami": {"family": "AL2023", "version": "v1", "x86_64": "ami-0123456789abcdef0"},
        "nodePools": [{"name": POOL, "leadTime": f"{lead_minutes:g}m"}],
        "scalingWindows": windows or [],
        "predictive": {"enabled": predictive, "leadTime": f"{lead_minutes:g}m", "history": "14d", "quantile": quantile,
                       "maxWarmGpus": max_warm_gpus},
    })


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prewarm-backtest")
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--boot", type=float, default=8.0, help="node boot plus image pull, minutes")
    parser.add_argument("--max-warm-gpus", type=int, default=16)
    parser.add_argument("--quantile", type=float, default=0.9, help="forecast quantile (and the window's level)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    trace = load_trace(args.trace)
    start, score_from = REPLAY_FROM * DAY, SCORE_FROM * DAY
    end = float(trace.arrival.max()) + 1
    window = derive_window(trace, score_from, end, args.quantile)
    settings = ReplaySettings(boot=args.boot * 60)
    lead = args.boot
    policies = {
        "none": config(lead_minutes=lead),
        "windows only": config(windows=[window.config(POOL)], lead_minutes=lead),
        "predictive": config(predictive=True, lead_minutes=lead, max_warm_gpus=args.max_warm_gpus,
                             quantile=args.quantile),
        "windows + predictive": config(windows=[window.config(POOL)], predictive=True, lead_minutes=lead,
                                       max_warm_gpus=args.max_warm_gpus, quantile=args.quantile),
    }
    outcomes = [Replay(name, trace, cfg, start=start, score_from=score_from, end=end, settings=settings).run()
                for name, cfg in policies.items()]
    span = (end - score_from) / DAY
    print(f"trace: {args.trace}")
    print(f"  t=0 → {EPOCH:%a %Y-%m-%d %H:%M} UTC; replayed from day {REPLAY_FROM}, scored from day {SCORE_FROM} "
          f"({EPOCH.fromtimestamp(EPOCH.timestamp() + score_from, EPOCH.tzinfo):%a %Y-%m-%d}) for {span:.1f} days: "
          f"{outcomes[0].pods} GPU pods, {outcomes[0].gpus:.0f} GPUs asked for")
    print(f"  node boot + image pull {args.boot:g} min (= lead time); consolidation after 5 min idle; "
          f"prewarm tick every 5 min")
    print(f"  window (from the daily profile of arrivals): {window.describe()}")
    print(f"  predictive: quantile {args.quantile:g}, history 14 d, maxWarmGpus {args.max_warm_gpus}")
    print()
    _table(outcomes)
    print()
    print("ready: share of GPU demand placed on arrival on free capacity of any kind (for 'none', nodes not yet "
          "consolidated);\nwarm: of that, on warm capacity; waits are per pod, in seconds; idle GPU-h over the "
          "scored days.")
    print(f"({time.perf_counter() - started:.1f} s)")
    return 0


def _table(outcomes: list[Outcome]) -> None:
    header = (f"{'policy':<22}{'ready %':>8}{'warm %':>8}{'mean wait s':>12}{'p95 wait s':>11}"
              f"{'idle warm GPU-h':>16}{'idle GPU-h':>11}{'GPU-h':>9}{'unplaced':>9}")
    print(header)
    print("-" * len(header))
    for o in outcomes:
        print(f"{o.policy:<22}{100 * o.ready_share:>8.1f}{100 * o.warm_share:>8.1f}{o.mean_wait:>12.1f}"
              f"{o.p95_wait:>11.1f}{o.idle_warm_gpu_hours:>16.0f}{o.idle_gpu_hours:>11.0f}{o.gpu_hours:>9.0f}"
              f"{o.unplaced:>9}")


if __name__ == "__main__":
    raise SystemExit(main())

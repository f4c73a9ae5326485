"""`python -m benchmarks load`: the issue's load figures on the emulator.

    python -m benchmarks load [--part packer|bound|both] [--pods 10000] [--per-document 10] [--profile]
                              [--bound-pods 1000] [--bound-timeout 900]
                              [--part fleet --fleet-pods 1000]

packer: pods per second the packer sustains through its FIFO queue at the stack's batch size (10), with the
whole backlog queued first (`benchmarks.load.packer_queue`). bound: 1,000 pods created in the local Kubernetes
API → all bound, the whole emulator running (`benchmarks.load.pods_bound`). fleet: one document packed, then its
launch requests through one fleet poller (`benchmarks.load.fleet_queue`).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import warnings

from benchmarks.load import unlimited
from gpu_autoscaler.config import load_config
from gpu_autoscaler.wiring import consumer
from infra.layer import ROOT

__all__ = ["main"]


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (5 min {five:.2f}) on {os.cpu_count()} CPUs"


def _packer(args: argparse.Namespace) -> int:
    from benchmarks.load.packer_queue import run

    config = unlimited(load_config(ROOT / "cdk.json"))
    print(f"packer: {args.pods} pods, {args.per_document} per document, batch size "
          f"{consumer('pending-pods').batch_size}; {_load()}", flush=True)
    result = run(config, pods=args.pods, per_document=args.per_document, profile=args.profile)
    ms = sorted(result.batch_ms) or [0.0]
    print(f"  {result.pods} pods in {result.messages} documents, {result.batches} batches: {result.seconds:.1f} s "
          f"→ {result.pods / result.seconds:.0f} pods/s, {result.messages / result.seconds:.1f} documents/s")
    print(f"  CPU {result.cpu_seconds:.1f} s (this process: packer, moto, Kubernetes API) → "
          f"{result.pods / result.cpu_seconds:.0f} pods per CPU-second, "
          f"{1000 * result.cpu_seconds / result.messages:.0f} CPU-ms per document")
    print(f"  batch ms: median {statistics.median(ms):.0f}, p95 {ms[int(0.95 * (len(ms) - 1))]:.0f}, "
          f"first {result.batch_ms[0] if result.batch_ms else 0:.0f}, last {ms and result.batch_ms[-1]:.0f}")
    tenth = max(1, len(result.batch_ms) // 10)
    print("  batch ms by tenth of the backlog (growth = work per document growing with the claims kept): "
          + " ".join(f"{statistics.mean(result.batch_ms[i:i + tenth]):.0f}"
                     for i in range(0, len(result.batch_ms), tenth)))
    print(f"  claims {result.claims}, launch requests {result.launch_requests}, records failed "
          f"{result.failed_records}, whole-batch errors {dict(result.errors) or 0}, dead letters "
          f"{result.dead_letters}; {_load()}")
    print("  calls per document, ms each, share of the time:")
    for name, (count, seconds) in sorted(result.calls.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"    {name:<38} {count / result.messages:6.1f}  {1000 * seconds / count:7.1f} ms  "
              f"{100 * seconds / result.seconds:5.1f} %")
    if result.profile:
        print(result.profile)
    return int(bool(result.dead_letters or result.errors))


def _fleet(args: argparse.Namespace) -> int:
    from benchmarks.load.fleet_queue import run

    config = unlimited(load_config(ROOT / "cdk.json"))
    print(f"fleet: one {args.fleet_pods}-pod document packed, its launch requests through one fleet poller; {_load()}",
          flush=True)
    result = run(config, args.fleet_pods)
    print(f"  packer {result.packer_seconds:.1f} s → {result.launch_requests} launch requests; fleet "
          f"{result.invocations} invocations, {result.instances} instances in {result.seconds:.1f} s "
          f"({result.cpu_seconds:.1f} CPU-s), {result.failed_records} records failed; {_load()}")
    for name, (count, seconds) in sorted(result.calls.items(), key=lambda kv: -kv[1][1])[:10]:
        print(f"    {name:<38} {count:6.0f} calls  {1000 * seconds / count:7.1f} ms each")
    return int(bool(result.failed_records) or result.instances == 0)


def _bound(args: argparse.Namespace) -> int:
    from benchmarks.load.pods_bound import run

    print(f"bound: {args.bound_pods} pods created → all bound; {_load()}", flush=True)
    result = run(pods=args.bound_pods, timeout=args.bound_timeout, profile=args.profile)
    print(f"  {result.summary()}; {_load()}")
    if result.profile:
        print(result.profile)
    return int(not result.ok)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks load")
    parser.add_argument("--part", choices=("packer", "fleet", "bound", "both"), default="both")
    parser.add_argument("--pods", type=int, default=10_000, help="the packer's backlog, in pods")
    parser.add_argument("--per-document", type=int, default=10, help="pods per pending-pods document")
    parser.add_argument("--profile", action="store_true",
                        help="packer: cProfile the poller and the packer; bound: sample every thread")
    parser.add_argument("--fleet-pods", type=int, default=1_000)
    parser.add_argument("--bound-pods", type=int, default=1_000)
    parser.add_argument("--bound-timeout", type=float, default=900.0, help="seconds to wait for all bound")
    args = parser.parse_args(argv)
    # The functions log each unplaceable pod and each fallback (prices, quotas); the figures are what counts here.
    logging.getLogger("gpu_autoscaler").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    began = time.monotonic()
    status = 0
    if args.part in ("packer", "both"):
        status |= _packer(args)
    if args.part == "fleet":
        status |= _fleet(args)
    if args.part in ("bound", "both"):
        status |= _bound(args)
    print(f"total {time.monotonic() - began:.0f} s")
    return status

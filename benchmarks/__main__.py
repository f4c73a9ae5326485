"""`python -m benchmarks [NAME [ARGS...]]`: list the benchmarks, or run one (`all` runs each in turn)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS: dict[str, tuple[str, str]] = {
    # name: (module with a `main(argv) -> int`, what it measures). Add one line per benchmark.
    "packing-quality": ("benchmarks.packing.quality",
                        "plan USD/h vs an exact MILP (HiGHS) and a Karpenter-like baseline, 24 seeded + 30 random "
                        "scenarios"),
    "packing-speed": ("benchmarks.packing.speed",
                      "planning time for 1,000 and 10,000 pods over us-east-1's whole GPU catalog; `plan` end to end"),
    "kube-api": ("benchmarks.kubernetes.api",
                 "local Kubernetes API via the real client: create, list, watch latency, scheduling, eviction"),
    "consolidation": ("benchmarks.consolidation.quality",
                      "fragmented clusters (≥ 50 nodes): USD/h after one pass vs the MILP's optimum repacking"),
    "prewarm-backtest": ("benchmarks.prewarm.backtest",
                         "Alibaba GPU trace: warm hits, waits and idle GPU-hours for none / windows / predictive"),
    "simulation": ("benchmarks.simulation.replay",
                   "the whole Alibaba GPU trace, four policies, through the simulator: time vs 60 s, the table"),
    "synth": ("benchmarks.deploy.synth",
              "cdk synth's app with the real layer on a clean checkout: empty layer cache, then cached"),
    "cold-start": ("benchmarks.deploy.cold_start",
                   "each function's import time and peak memory in a fresh interpreter with the layer alone"),
    "itn-cordon": ("benchmarks.deploy.interruption_path",
                   "Spot warning on the emulator's bus → node cordoned, the interruption function cold-started"),

    "load": ("benchmarks.load.figures",
             "packer pods/s through its FIFO queue (batch 10, 10,000-pod backlog); 1,000 pods created → all bound"),
    "chaos": ("benchmarks.chaos.figures",
              "fault injection on the running emulator (throttling, capacity storms, crashes, duplicates, write "
              "conflicts, Spot warning storms, API outage, clock skew): times, invariants"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print("benchmarks (python -m benchmarks NAME [ARGS]):")
        for name, (_, about) in BENCHMARKS.items():
            print(f"  {name:<18} {about}")
        return 0
    name, args = argv[0], argv[1:]
    names = list(BENCHMARKS) if name == "all" else [name]
    status = 0
    for each in names:
        if each not in BENCHMARKS:
            print(f"unknown benchmark '{each}'; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
        print(f"== {each}")
        status |= importlib.import_module(BENCHMARKS[each][0]).main(args if name != "all" else [])
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The simulator: a job trace replayed through the Lambdas' own decision code, one run per policy.

`read_trace` reads a trace; `simulate(trace, config)` runs each policy (`default_policies`) on simulated
adapters — a `FixedClock`, the in-memory state store, `SimulatedCloud` (EC2) and `SimulatedCluster`
(Kubernetes) — and returns a `SimulationReport` (`report.json`, the terminal table, the plots).
"""

from __future__ import annotations

from gpu_autoscaler.simulation.engine import PolicyRun
from gpu_autoscaler.simulation.policies import POLICY_NAMES, Policy, build_policy
from gpu_autoscaler.simulation.report import SimulationReport
from gpu_autoscaler.simulation.run import simulate, simulation_catalog
from gpu_autoscaler.simulation.settings import SimulationSettings
from gpu_autoscaler.simulation.trace import GPU_MODELS, TRACE_EPOCH, Trace, TraceError, TracePod, read_trace

__all__ = [
    "GPU_MODELS",
    "POLICY_NAMES",
    "TRACE_EPOCH",
    "Policy",
    "PolicyRun",
    "SimulationReport",
    "SimulationSettings",
    "Trace",
    "TraceError",
    "TracePod",
    "build_policy",
    "read_trace",
    "simulate",
    "simulation_catalog",
]

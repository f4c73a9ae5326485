"""Run a trace under several policies: one catalog, one `PolicyRun` per policy, side by side.

Policies are independent (each its own store, cluster, cloud and random stream, seeded from the seed and
the policy's name), so they run in parallel processes when there is more than one core, and the report is
the same whichever order they finish in.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.catalog import Catalog
from gpu_autoscaler.simulation.engine import PolicyRun
from gpu_autoscaler.simulation.policies import build_policy, default_policies
from gpu_autoscaler.simulation.report import SimulationReport
from gpu_autoscaler.simulation.settings import SimulationSettings

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.simulation.metrics import RunResult
    from gpu_autoscaler.simulation.policies import Policy
    from gpu_autoscaler.simulation.trace import Trace

__all__ = ["simulate", "simulation_catalog", "submission_order"]


def simulation_catalog(config: Config) -> Catalog:
    """The configuration's region as `gpu-autoscaler plan` sees it without AWS (moto's EC2 data and the bundled
    price snapshots), less the partitioned GPU types: a trace's fraction is a share of a whole GPU."""
    from gpu_autoscaler.cli.plan import offline_catalog

    full = offline_catalog(config)
    types = [t for t in full.instance_types() if t.gpus >= t.gpu_devices]
    kept = {t.name for t in types}
    return Catalog(types, [o for o in full.all_offerings() if o.instance_type in kept])


def simulate(
    trace: Trace,
    config: Config,
    *,
    policies: Sequence[str] | None = None,
    settings: SimulationSettings | None = None,
    catalog: Catalog | None = None,
    progress: Callable[[str, float], None] | None = None,
    workers: int | None = None,
) -> SimulationReport:
    """Replay `trace` under each policy (default: `default_policies`); `workers` processes (default: one per core, at
    most one per policy)."""
    started = time.perf_counter()
    settings = settings or SimulationSettings()
    catalog = catalog or simulation_catalog(config)
    names = policies if policies is not None else default_policies(config, trace.pods)
    built = [build_policy(name, config, catalog, trace.pods, settings.fixed_instance_type) for name in names]
    count = workers if workers is not None else min(len(built), os.cpu_count() or 1)
    if count > 1 and len(built) > 1 and "fork" in multiprocessing.get_all_start_methods():
        results = _parallel(built, trace, catalog, settings, progress, count)
    else:
        results = [
            PolicyRun(p, trace, catalog, settings, progress=_bind(progress, p.name)).run() for p in built
        ]
    return SimulationReport(trace, config, catalog, settings, tuple(results), time.perf_counter() - started)


def _bind(progress: Callable[[str, float], None] | None, name: str) -> Callable[[float], None] | None:
    if progress is None:
        return None
    return lambda fraction: progress(name, fraction)


# In parallel: forked workers inherit the trace, catalog and policies; progress comes back through a queue.

_JOB: dict[str, Any] = {}


def _parallel(policies: list[Policy], trace: Trace, catalog: Catalog, settings: SimulationSettings,
              progress: Callable[[str, float], None] | None, workers: int) -> list[RunResult]:
    context = multiprocessing.get_context("fork")
    queue = context.Manager().Queue() if progress is not None else None
    _JOB.update(policies={p.name: p for p in policies}, trace=trace, catalog=catalog, settings=settings, queue=queue)
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {p.name: pool.submit(_run_one, p.name) for p in submission_order(policies)}
            while not all(f.done() for f in futures.values()):
                _drain(queue, progress)
                time.sleep(0.1)
            _drain(queue, progress)
            return [futures[p.name].result() for p in policies]
    finally:
        _JOB.clear()


def submission_order(policies: Sequence[Policy]) -> list[Policy]:
    """The order the workers start the policies in (results keep the given order): first those whose consolidation
    weighs every node with pods (no `underutilizedBelow`: Karpenter's), the longest replays with the search every
    minute, so that two workers finish together instead of one starting the longest last."""
    def weighs_every_node(policy: Policy) -> bool:
        return any(p.disruption.underutilized_below is None
                   and p.disruption.consolidation_policy == "WhenEmptyOrUnderutilized"
                   for p in policy.config.node_pools)

    return sorted(policies, key=lambda p: not weighs_every_node(p))


def _drain(queue: Any, progress: Callable[[str, float], None] | None) -> None:
    if queue is None or progress is None:
        return
    while not queue.empty():
        name, fraction = queue.get()
        progress(name, fraction)


def _run_one(name: str) -> RunResult:
    queue = _JOB["queue"]
    report = (lambda fraction: queue.put((name, fraction))) if queue is not None else None
    return PolicyRun(_JOB["policies"][name], _JOB["trace"], _JOB["catalog"], _JOB["settings"], progress=report).run()

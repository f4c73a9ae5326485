"""How much of the gap to the lower bound CPU and memory force: the bound again, with every resource counted.

    python -m benchmarks.simulation.resource_bound [--trace FILE] [--config FILE] [--bucket-hours H]

The simulator's lower bound (`simulation.metrics`) bills each pod's GPU share at the cheapest price per GPU of a
type that could hold it, as if every node could be filled with GPU work to its last GPU. A trace's pods also ask for
CPU and memory, and a pod asking 12 vCPUs beside half a GPU leaves GPUs no other pod can use on every type whose CPU
it fills. This bound counts that, and stays a bound: at each moment the pods running need nodes whose GPUs, vCPUs
and memory cover theirs, each pod on a type that could hold it (the GPU bound's own test, `metrics.holds`), at each
type's cheapest price; allowing fractions of nodes makes it a linear programme (HiGHS) whose optimum no packing,
online or clairvoyant, can beat. Over a time bucket it is solved for the pods' average concurrency in that bucket:
the optimum is a convex function of the demand (a minimum over a polyhedron whose right-hand side the demand is), so
by Jensen's inequality that is at most the bucket's average optimum — still a bound, loosened by longer buckets.

Both bounds are computed on the trace's own timing (each pod that ran in the source cluster runs its duration from
its arrival), so their ratio says how much of a policy's distance from the GPU bound no packing could remove: the
rest is time (pods come and go at different moments, nodes come whole) and choice.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from benchmarks.simulation.replay import DEFAULT_CONFIG, DEFAULT_TRACE
from gpu_autoscaler.config import load_config
from gpu_autoscaler.simulation.metrics import GpuPrices, holds
from gpu_autoscaler.simulation.run import simulation_catalog
from gpu_autoscaler.simulation.trace import read_trace

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.simulation.trace import TracePod

__all__ = ["Bounds", "Types", "bounds", "main", "resource_rate"]

_RESOURCES = 3
"""GPUs (physical), vCPUs (milli), memory (MiB): the axes of a type's capacity and a pod's request."""


@dataclass(frozen=True)
class Types:
    """The types a bound may use: capacity [T, 3] on `_RESOURCES`' axes and USD per second of a whole node [T]."""

    types: Sequence[InstanceType]
    capacity: np.ndarray
    price_per_second: np.ndarray

    @classmethod
    def of(cls, prices: GpuPrices) -> Types:
        """The GPU bound's types at its prices (its USD per GPU-second times the type's GPUs)."""
        types = [t for t, _ in prices.types]
        capacity = np.array([[t.gpus, t.vcpu * 1000, t.memory_mib] for t in types], float).reshape(-1, _RESOURCES)
        return cls(types, capacity, np.array([per_gpu * t.gpus for t, per_gpu in prices.types], float))


@dataclass(frozen=True)
class Bounds:
    gpu: float
    """USD: the simulator's bound (GPU share × seconds at the cheapest USD per GPU-second that could hold it)."""
    resources: float
    """USD: the bound with GPUs, vCPUs and memory counted."""
    buckets: int
    pods: int


def resource_rate(demand: Mapping[int, float], requests: np.ndarray, allowed: Sequence[Sequence[int]],
                  types: Types) -> float:
    """USD per second of the cheapest fractional nodes holding `demand` (class → pods running, on average).

    Variables: x[t] nodes of each type, y[c, t] pods of class c on type t (only where t could hold c);
    minimise Σ x·price subject to Σ_t y[c, t] = demand[c] and, per type and resource, Σ_c y[c, t]·request ≤ x·capacity.
    """
    classes = [c for c, count in demand.items() if count > 0]
    if not classes:
        return 0.0
    n_types = len(types.types)
    pairs = [(c, t) for c in classes for t in allowed[c]]
    if any(not allowed[c] for c in classes):
        raise ValueError("a class that no type could hold has no bound")
    n = n_types + len(pairs)
    pair_class = np.array([c for c, _ in pairs])
    pair_type = np.array([t for _, t in pairs])
    columns = n_types + np.arange(len(pairs))
    row_of_class = {c: i for i, c in enumerate(classes)}
    equality = coo_matrix((np.ones(len(pairs)), ([row_of_class[c] for c in pair_class], columns)),
                          shape=(len(classes), n))
    # Row t·3 + k: type t's resource k, used by the pods placed on it less what its nodes provide.
    used_rows = (pair_type[:, None] * _RESOURCES + np.arange(_RESOURCES)[None, :]).ravel()
    used_cols = np.repeat(columns, _RESOURCES)
    used_vals = requests[pair_class].ravel()
    own_rows = np.arange(n_types * _RESOURCES)
    own_cols = np.repeat(np.arange(n_types), _RESOURCES)
    capacity = coo_matrix((np.concatenate([used_vals, -types.capacity.ravel()]),
                           (np.concatenate([used_rows, own_rows]), np.concatenate([used_cols, own_cols]))),
                          shape=(n_types * _RESOURCES, n))
    cost = np.concatenate([types.price_per_second, np.zeros(len(pairs))])
    result = linprog(cost, A_ub=capacity.tocsr(), b_ub=np.zeros(n_types * _RESOURCES), A_eq=equality.tocsr(),
                     b_eq=np.array([demand[c] for c in classes]), bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"the bound's linear programme did not solve: {result.message}")
    return float(result.fun)


def bounds(pods: Sequence[TracePod], prices: GpuPrices, bucket_seconds: float) -> Bounds:
    """Both bounds over the pods that ran in the source cluster (a `duration`), each from its arrival."""
    types = Types.of(prices)
    class_of: dict[tuple[object, ...], int] = {}
    requests: list[tuple[float, float, float]] = []
    allowed: list[list[int]] = []
    seconds: defaultdict[int, defaultdict[int, float]] = defaultdict(lambda: defaultdict(float))
    gpu = 0.0
    counted = 0
    for pod in pods:
        per_gpu_second = prices.per_gpu_second(pod)
        if pod.duration is None or pod.duration <= 0 or per_gpu_second is None:
            continue
        key = (pod.cpu_milli, pod.memory_mib, pod.gpus, pod.gpu_milli, pod.gpu_names)
        c = class_of.get(key)
        if c is None:
            c = class_of[key] = len(requests)
            requests.append((pod.share, float(pod.cpu_milli), float(pod.memory_mib)))
            allowed.append([i for i, t in enumerate(types.types) if holds(t, pod)])
        counted += 1
        gpu += pod.share * pod.duration * per_gpu_second
        start, end = pod.arrival, pod.arrival + pod.duration
        bucket = int(start // bucket_seconds)
        while start < end:
            until = min(end, (bucket + 1) * bucket_seconds)
            seconds[bucket][c] += until - start
            start, bucket = until, bucket + 1
    request_matrix = np.array(requests, float).reshape(-1, _RESOURCES)
    resources = sum(
        resource_rate({c: s / bucket_seconds for c, s in by_class.items()}, request_matrix, allowed, types)
        * bucket_seconds
        for by_class in seconds.values()
    )
    return Bounds(gpu, resources, len(seconds), counted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulation.resource_bound", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--bucket-hours", type=float, default=1.0,
                        help="solve for each bucket's average demand (longer: quicker, looser)")
    args = parser.parse_args(argv)
    config = load_config(Path(args.config))
    trace = read_trace(Path(args.trace))
    prices = GpuPrices(simulation_catalog(config), set(config.network.subnets))
    started = time.process_time()
    found = bounds(trace.pods, prices, args.bucket_hours * 3600)
    print(f"{Path(args.trace).name}: {found.pods:,} GPU pods that ran, on the trace's own timing; "
          f"{found.buckets:,} buckets of {args.bucket_hours:g} h ({time.process_time() - started:.1f} s of CPU)")
    print(f"  GPU bound (the simulator's):       {found.gpu:>10,.0f} USD")
    print(f"  with vCPUs and memory counted too: {found.resources:>10,.0f} USD "
          f"({found.resources / found.gpu:.3f} × the GPU bound)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

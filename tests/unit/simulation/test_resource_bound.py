"""The bound with CPU and memory counted, against answers worked out by hand (not by the code under test).

Two types from the builders' catalog, On-Demand only: g4dn.xlarge (1 GPU, 4 vCPU, 16 GiB, 0.526 USD/h) and
g4dn.12xlarge (4 GPUs, 48 vCPU, 192 GiB, 3.912 USD/h). Pod A asks half a GPU, 12 vCPU and 16 GiB: only the
12xlarge holds it. Pod B asks half a GPU, 1 vCPU and 1 GiB: either holds it.

- GPU bound: A's half GPU at the 12xlarge's 0.978 USD per GPU-hour, B's at the xlarge's 0.526: 0.752 USD/h.
- With every resource: A needs a quarter of a 12xlarge for its CPU (12 of 48 vCPUs; its GPU would need an
  eighth). B on an xlarge needs half of one for its GPU (0.263 USD/h); on the 12xlarge, beside A, its vCPU is the
  tighter resource: (12 + s)/48 of a node for a share s of B, so moving B there costs 3.912/48 = 0.0815 USD/h per
  unit of s and saves 0.263: all of B goes there, 13/48 of a 12xlarge: 3.912 × 13 / 48 = 1.0595 USD/h.
- The two together on one real 12xlarge cost 3.912 USD/h: both bounds are below it.
"""

from __future__ import annotations

import pytest

from benchmarks.simulation.resource_bound import bounds
from gpu_autoscaler.simulation.metrics import GpuPrices
from gpu_autoscaler.simulation.trace import TracePod
from tests.unit.simulation.builders import ZONES, make_catalog

HOUR = 3600.0
BOTH_PER_HOUR = 3.912 * 13 / 48
GPU_PER_HOUR = 0.5 * 3.912 / 4 + 0.5 * 0.526


def _pod(index: int, cpu_milli: int, memory_mib: int, arrival: float, duration: float) -> TracePod:
    return TracePod(index, f"p{index}", arrival, duration, None, cpu_milli, memory_mib, gpus=1, gpu_milli=500)


def _prices() -> GpuPrices:
    return GpuPrices(make_catalog(("g4dn.xlarge", "g4dn.12xlarge"), spot=False), ZONES)


def test_cpu_that_strands_gpus_is_counted_and_the_bound_stays_below_a_real_node() -> None:
    pods = [_pod(0, 12000, 16384, 0.0, 2 * HOUR), _pod(1, 1000, 1024, 0.0, 2 * HOUR)]
    found = bounds(pods, _prices(), HOUR)
    assert found.gpu == pytest.approx(2 * GPU_PER_HOUR)
    assert found.resources == pytest.approx(2 * BOTH_PER_HOUR)
    assert found.gpu < found.resources < 2 * 3.912
    assert (found.buckets, found.pods) == (2, 2)


def test_a_bucket_is_solved_for_its_average_demand_which_only_loosens_the_bound() -> None:
    """A alone for the first half hour, B alone for the second. In half-hour buckets each runs alone: A on a quarter
    of a 12xlarge, B on half an xlarge. In one hour's bucket the average is half of each, together."""
    pods = [_pod(0, 12000, 16384, 0.0, HOUR / 2), _pod(1, 1000, 1024, HOUR / 2, HOUR / 2)]
    apart = bounds(pods, _prices(), HOUR / 2)
    averaged = bounds(pods, _prices(), HOUR)
    assert apart.resources == pytest.approx(0.5 * 3.912 / 4 + 0.5 * 0.526 / 2)
    assert averaged.resources == pytest.approx(0.5 * BOTH_PER_HOUR)
    assert apart.gpu == pytest.approx(averaged.gpu) == pytest.approx(GPU_PER_HOUR / 2)
    assert averaged.gpu < averaged.resources < apart.resources


def test_pods_that_never_ran_in_the_source_cluster_are_left_out() -> None:
    withdrawn = TracePod(0, "gone", 0.0, None, 600.0, 1000, 1024, gpus=1)
    found = bounds([withdrawn, _pod(1, 1000, 1024, 0.0, HOUR)], _prices(), HOUR)
    assert found.pods == 1
    assert found.resources == pytest.approx(0.526 / 2)

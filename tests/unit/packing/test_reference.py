"""The benchmark's exact MILP: its optimum must be a real plan's cost, whatever HiGHS reports.

HiGHS 1.16's presolve mis-maps a MIP start on these pattern models ("feasible in the reduced space:
objective value is 27.45" for a 54.90 start) and then stops at that start, reporting half its cost as
the optimum and the bound. The reference recomputes the cost from the solution and, when the two
disagree, solves again without presolve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from benchmarks.packing.milp import solve_reference
from tests.unit.packing.builders import ZONES, make_catalog, make_config, make_pod, make_solver

if TYPE_CHECKING:
    from gpu_autoscaler.models.pods import PendingPod

MIG_TAINT = {"key": "gpu-autoscaler/mig", "value": "true", "effect": "NoSchedule"}
TOLERATE_MIG = {"key": "gpu-autoscaler/mig", "operator": "Exists", "effect": "NoSchedule"}
MIG_POOL = {"name": "gpu-mig", "capacityTypes": ["on-demand"], "taints": [MIG_TAINT],
            "gpuSharing": {"mode": "mig", "migProfile": "1g.10gb"}}
MIG_TYPES = ("p4d.24xlarge", "p4de.24xlarge", "p5.4xlarge", "p5.48xlarge")


def mig_pods(count: int, cpu: str, memory: str, slices: int) -> list[PendingPod]:
    requests = {"cpu": cpu, "memory": memory, "nvidia.com/mig-1g.10gb": str(slices)}
    return [make_pod(gpus=None, tolerate=False, tolerations=[TOLERATE_MIG], requests=requests) for _ in range(count)]


def test_mig_optimum_is_the_cost_of_a_real_plan() -> None:
    # 103 slices of 1g.10gb. Per GPU an A100 80 GB holds 7, an A100 40 GB 4, an H100 7: p4de holds 56
    # for 27.45, p4d 32 for 21.96, p5.4xlarge 7 for 6.88, p5.48xlarge 56 for 55.04. Two p4de (54.90)
    # is the optimum: one p4de leaves 47 slices, which any other mix covers for more than 27.45.
    pods = (mig_pods(3, "2", "16Gi", 1) + mig_pods(2, "4", "24Gi", 1) + mig_pods(4, "2", "24Gi", 1)
            + mig_pods(44, "2", "24Gi", 2) + mig_pods(6, "4", "8Gi", 1))
    config = make_config(MIG_POOL)
    catalog = make_catalog(MIG_TYPES, zones=ZONES[:1])
    plan = make_solver(config, catalog).solve(pods)
    assert not plan.unschedulable
    assert plan.total_price_per_hour == pytest.approx(54.90)

    reference = solve_reference(config, catalog, pods, plan, time_limit=20)

    assert reference.best == pytest.approx(54.90)
    assert reference.lower_bound == pytest.approx(54.90)
    assert reference.exact_tiers == reference.tiers == 1

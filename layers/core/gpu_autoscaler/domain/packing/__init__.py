"""The packing decision: pending GPU pods onto the cheapest set of new nodes, always valid.

`Solver(config, catalog, clock).solve(pods, claims=..., covered=..., unavailable=...) -> Plan` decides;
`fit` holds the one copy of "what does a node hold, does this pod fit"; `baseline` is a Karpenter-like
first-fit-decreasing packer kept for comparison.
"""

from __future__ import annotations

from gpu_autoscaler.domain.packing.fit import allocatable, fits, gpu_equivalent, node_capacity, pod_requests
from gpu_autoscaler.domain.packing.nodes import MAX_CANDIDATES
from gpu_autoscaler.domain.packing.results import Plan, Unschedulable, claim_requests
from gpu_autoscaler.domain.packing.solve_pass import claim_id
from gpu_autoscaler.domain.packing.solver import Solver

__all__ = [
    "MAX_CANDIDATES",
    "Plan",
    "Solver",
    "Unschedulable",
    "allocatable",
    "claim_id",
    "claim_requests",
    "fits",
    "gpu_equivalent",
    "node_capacity",
    "pod_requests",
]

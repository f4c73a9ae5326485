"""The consolidation benchmark's fragmented clusters must be clusters consolidation may act on.

Its nodes once carried no allocatable resources, so every one was "not initialized" (the device plugin had
not advertised its GPUs) and the benchmark printed 0 % captured without failing anything but its target."""

from __future__ import annotations

from benchmarks.consolidation.cluster import NOW, consolidation_config, fragmented_cluster
from benchmarks.packing.catalog import region_catalog
from benchmarks.packing.scenarios import ZONES
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.consolidation import consolidate
from gpu_autoscaler.domain.initialization import not_initialized
from gpu_autoscaler.domain.packing import Solver
from gpu_autoscaler.domain.packing.results import claim_requests


def test_the_benchmarks_nodes_are_initialized_and_consolidation_acts_on_them() -> None:
    config = consolidation_config()
    solver = Solver(config, region_catalog("us-east-1", ZONES), FixedClock(NOW))
    cluster = fragmented_cluster(solver, 0, waves=3, wave_pods=40, min_nodes=10)

    # A node without its claim is listed too.
    assert [n.node.name for n in cluster.nodes
            if n.claim is None or not_initialized(n.node, claim_requests(n.claim))] == []
    result = consolidate(config, solver, cluster.nodes)
    assert result.saving > 0

"""The simulated kube-scheduler binds as it would pod by pod: skipping a pod like one that fitted nowhere in the
same pass changes no binding."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

from gpu_autoscaler.domain.packing.fit import fits, pod_requests
from gpu_autoscaler.models.requirements import terms_match
from gpu_autoscaler.models.resources import CPU, GPU
from gpu_autoscaler.models.taints import tolerates_all
from gpu_autoscaler.simulation.cloud import SimulatedInstance
from gpu_autoscaler.simulation.cluster import SimNode, SimPod, SimulatedCluster
from gpu_autoscaler.simulation.policies import PodShaper
from tests.unit.simulation.builders import MIXED_CATALOG, MIXED_CONFIG, make_pod

_TYPES = ("g4dn.xlarge", "g4dn.12xlarge", "p4d.24xlarge")


def _cluster() -> SimulatedCluster:
    return SimulatedCluster(MIXED_CONFIG, lambda: 0.0, lambda t: datetime.fromtimestamp(t, UTC),
                            on_unbind=lambda pod, why: None)


def _join(cluster: SimulatedCluster, n: int, type_name: str, pool: str) -> SimNode:
    instance_type = MIXED_CATALOG.get(type_name)
    assert instance_type is not None, type_name
    instance = SimulatedInstance(f"i-{n:04d}", instance_type, "us-east-1a", "on-demand", 1.0, 0.0,
                                 f"claim-{n}", pool)
    return cluster.join(instance, MIXED_CONFIG.pool(pool))


def _allowed(pod: SimPod, node: SimNode) -> bool:
    spec = pod.spec
    return (tolerates_all(spec.tolerations, node.pool.taints)
            and all(node.labels.get(k) == v for k, v in spec.node_selector.items())
            and terms_match(spec.required_node_affinity, node.labels))


def _reference(cluster: SimulatedCluster, pods: list[SimPod]) -> list[tuple[str, str]]:
    """Every pod searched for, in order, on every node (kube-scheduler's pass with no cache at all): the fitting
    node it may go to that leaves the fewest GPUs, then the least CPU, free; the oldest of those."""
    ready = [n for n in cluster.nodes.values() if not n.cordoned and len(n.taints) == len(n.pool.taints)]
    out = []
    for pod in pods:
        fitting = [n for n in ready if fits(pod.requests, n.free) and _allowed(pod, n)]
        if not fitting:
            continue
        node = min(fitting, key=lambda n: (n.free.get(GPU, 0) - pod.requests.get(GPU, 0),
                                           n.free.get(CPU, 0) - pod.requests.get(CPU, 0), n.order))
        cluster.bind(pod, node)
        out.append((pod.uid, node.name))
    return out


def test_scheduling_a_queue_binds_what_searching_every_pod_binds() -> None:
    rng = random.Random(4)
    shaper = PodShaper(MIXED_CONFIG)
    for trial in range(40):
        clusters = (_cluster(), _cluster())
        for n in range(rng.randint(0, 5)):
            type_name, pool = rng.choice(_TYPES), rng.choice(["gpu", "gpu-shared"])
            if pool == "gpu-shared" and type_name == "p4d.24xlarge":
                type_name = "g4dn.12xlarge"
            for cluster in clusters:
                _join(cluster, n, type_name, pool)
        shapes: list[dict[str, Any]] = [{"gpus": g, "milli": m, "cpu": c} for g, m, c in
                  ((1, 1000, 2000), (1, 500, 2000), (2, 1000, 8000), (4, 1000, 40000), (1, 250, 1000))]
        queues: tuple[list[SimPod], list[SimPod]] = ([], [])
        for i in range(rng.randint(1, 40)):
            trace_pod = make_pod(i, **rng.choice(shapes))
            for queue in queues:
                spec = shaper.pending(trace_pod)
                queue.append(SimPod(trace_pod, spec, pod_requests(spec).as_dict()))
        got = [(pod.uid, node.name) for pod, node in clusters[0].schedule(queues[0])]
        assert got == _reference(clusters[1], queues[1]), trial
        assert {n.name: n.free for n in clusters[0].nodes.values()} == \
            {n.name: n.free for n in clusters[1].nodes.values()}


def test_a_pod_like_one_that_fitted_nowhere_is_not_bound_but_another_still_is() -> None:
    shaper = PodShaper(MIXED_CONFIG)
    cluster = _cluster()
    node = _join(cluster, 0, "g4dn.xlarge", "gpu")
    trace_pods = (make_pod(0, gpus=4, cpu=8000), make_pod(1, gpus=4, cpu=8000), make_pod(2, gpus=1, cpu=1000),
                  make_pod(3, gpus=1, cpu=1000))
    pods = [SimPod(tp, spec, pod_requests(spec).as_dict()) for tp in trace_pods for spec in [shaper.pending(tp)]]
    bound = cluster.schedule(pods)
    assert [(pod.trace.name, to.name) for pod, to in bound] == [("pod-2", node.name)]
    assert pods[3].node is None and pods[0].node is None


def test_a_node_knows_when_a_pod_was_last_bound_to_it_or_taken_off_it() -> None:
    """The fact consolidation's consolidateAfter counts from (Karpenter's lastPodEventTime), as the cluster saw it."""
    clock = [100.0]
    cluster = SimulatedCluster(MIXED_CONFIG, lambda: clock[0], lambda t: datetime.fromtimestamp(t, UTC),
                               on_unbind=lambda pod, why: None)
    node = _join(cluster, 0, "g4dn.12xlarge", "gpu")
    assert node.pods_changed_at is None
    shaper = PodShaper(MIXED_CONFIG)
    pods = [SimPod(tp, spec, pod_requests(spec).as_dict()) for tp in (make_pod(0), make_pod(1))
            for spec in [shaper.pending(tp)]]
    cluster.schedule(pods)
    assert node.pods_changed_at == 100.0
    clock[0] = 400.0
    assert cluster.release(pods[0])
    assert node.pods_changed_at == 400.0

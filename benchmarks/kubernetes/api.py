"""The local Kubernetes API's speed, through the real client: what tests, the emulator and the demo wait on.

    python -m benchmarks kube-api [--pods N] [--nodes M]

Printed: pod creation rate (typed client), a full pod list (raw JSON, as `KubernetesCluster` and the agent
read it, and typed), watch latency (create → event at a watcher), one scheduling pass binding N pods onto
M simulated GPU nodes, and the eviction round trip. Controllers run stepped, so each figure is one thing.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from datetime import timedelta
from typing import Any

from kubernetes import client, watch

from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes, SimulatedInstance
from gpu_autoscaler.models.resources import Resources
from tests import kube_reads

__all__ = ["main"]


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app": "bench"}}, "spec": {"containers": [{
        "name": "main", "image": "trainer:1",
        "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"nvidia.com/gpu": "1"}}}]}}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def _watch_latency(writer: client.CoreV1Api, reader: client.CoreV1Api, rounds: int = 20) -> list[float]:
    """Seconds from a create returning to its ADDED event reaching a watch on another connection."""
    latencies: list[float] = []
    seen = threading.Event()
    sent_at = [0.0]
    version = kube_reads.list_version(reader.list_namespaced_pod("default", limit=1))

    def follow() -> None:
        for event in watch.Watch().stream(reader.list_namespaced_pod, "default", resource_version=version,
                                          field_selector="metadata.name=w", timeout_seconds=30):
            if event["type"] == "ADDED":
                latencies.append(time.perf_counter() - sent_at[0])
                seen.set()
                if len(latencies) == rounds:
                    return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    for _ in range(rounds):
        seen.clear()
        sent_at[0] = time.perf_counter()
        writer.create_namespaced_pod("default", client.V1Pod.model_validate(_pod("w")))
        seen.wait(5)
        writer.delete_namespaced_pod("w", "default")
    thread.join(5)
    return latencies


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks kube-api")
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=125)
    args = parser.parse_args(argv)
    with LocalKubernetes(run_controllers=False) as kube, kube.client() as api:
        core = client.CoreV1Api(api)
        started = time.perf_counter()
        for i in range(args.pods):
            core.create_namespaced_pod("default", client.V1Pod.model_validate(_pod(f"p-{i:05d}")))
        created = time.perf_counter() - started
        print(f"create {args.pods} pods          {_ms(created)}  ({args.pods / created:,.0f} pods/s)")

        started = time.perf_counter()
        raw = KubernetesCluster(api).list_pods()
        print(f"list {len(raw)} pods, raw JSON    {_ms(time.perf_counter() - started)}")
        started = time.perf_counter()
        typed = core.list_namespaced_pod("default").items
        print(f"list {len(typed)} pods, typed     {_ms(time.perf_counter() - started)}")

        for i in range(args.nodes):
            kube.add_instance(SimulatedInstance(f"i-{i:05x}", "p5.48xlarge", "us-east-1a", Resources.from_quantities(
                {"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": "8", "pods": "110"})), boot_delay=timedelta(0))
        kube.kubelets.register_due()
        started = time.perf_counter()
        result = kube.schedule()
        print(f"schedule {len(result.bound)} pods on {args.nodes} nodes {_ms(time.perf_counter() - started)}"
              f"  ({len(result.unschedulable)} unschedulable)")

        with kube.client() as watcher_api:
            latencies = _watch_latency(core, client.CoreV1Api(watcher_api))
        print(f"watch latency, median of {len(latencies)}  {_ms(statistics.median(latencies))}")

        cluster = KubernetesCluster(api)
        bound = [p for p in cluster.list_pods() if p.node_name][:50]
        started = time.perf_counter()
        evicted = sum(cluster.evict(p).evicted for p in bound)
        print(f"evict {evicted} pods, each          {_ms((time.perf_counter() - started) / max(len(bound), 1))}")
    return 0

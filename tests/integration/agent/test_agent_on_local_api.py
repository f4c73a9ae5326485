"""The real agent — watcher and dispatcher threads — against the local Kubernetes API and the FIFO queue on moto.

The local API's scheduler marks pods that fit nowhere `PodScheduled=False, Unschedulable`, as kube-scheduler
does, so the agent sees exactly what it would in a cluster. The agent's clock is fixed: a resync window
passes when the test advances it, so "once per resync" is counted, not timed.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler_agent.agent import Agent
from gpu_autoscaler_agent.health import Metrics
from gpu_autoscaler_agent.sender import Backoff
from gpu_autoscaler_agent.settings import AgentSettings
from tests import kube_reads
from tests.integration.agent.conftest import agent_api

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
    from tests.integration.agent.conftest import Queue

RESYNC = timedelta(seconds=60)
START = datetime(2026, 11, 22, 10, 0, 30, tzinfo=UTC)


def gpu_pod(name: str, gpus: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{
        "name": "main", "image": "trainer:1",
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def cpu_pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{
        "name": "main", "image": "web:1", "resources": {"requests": {"cpu": "64", "memory": "1Ti"}}}]}}


class Delivered:
    """Every pod name the queue has received so far, in order, one entry per report."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self.names: list[str] = []

    def poll(self) -> list[str]:
        for message in self._queue.receive():
            self.names += [p["name"] for p in message["document"]["pods"]]
        return self.names

    def until(self, predicate: Callable[[list[str]], bool], timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while not predicate(self.poll()):
            if time.monotonic() > deadline:
                raise AssertionError(f"queue never satisfied the condition; delivered: {self.names}")
            time.sleep(0.05)
        return self.names


@pytest.fixture
def core(kube: LocalKubernetes) -> Iterator[client.CoreV1Api]:
    with kube.client() as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(START)


@pytest.fixture
def agent(aws: EmbeddedAws, kube: LocalKubernetes, queue: Queue, clock: FixedClock) -> Iterator[Agent]:
    settings = AgentSettings(
        cluster=aws.config.cluster_name, queue_url=queue.url, region=aws.config.region,
        endpoint_url=aws.endpoint_url, resync_seconds=RESYNC.total_seconds(), max_delay_seconds=0,
        watch_timeout_seconds=30, health_port=None, kube_url=kube.url,
    )
    running = Agent(settings, api_client=agent_api(kube), sqs_client=queue.sqs, clock=clock, metrics=Metrics(),
                    send_backoff=Backoff(initial=0.05, maximum=0.2), watch_backoff=Backoff(initial=0.05, maximum=0.2))
    running.start()
    assert running.wait_until_ready()
    yield running
    running.stop(grace=2)


def _unschedulable(core: client.CoreV1Api, name: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        conditions = kube_reads.pod_status(core.read_namespaced_pod(name, "default")).conditions or ()
        if any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions):
            return
        time.sleep(0.02)
    raise AssertionError(f"{name} was never marked Unschedulable")


def test_a_pending_gpu_pod_is_sent_once_per_resync_and_a_cpu_pod_never(
    core: client.CoreV1Api, agent: Agent, queue: Queue, clock: FixedClock,
) -> None:
    delivered = Delivered(queue)
    core.create_namespaced_pod("default", client.V1Pod.model_validate(cpu_pod("web")))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(gpu_pod("train")))
    _unschedulable(core, "web")
    delivered.until(lambda names: "train" in names)
    time.sleep(1.0)  # several dispatcher ticks within the same window: nothing more is sent
    assert delivered.poll() == ["train"]
    for window in (2, 3):
        clock.advance(RESYNC)

        def sent(names: list[str], n: int = window) -> bool:
            return len(names) >= n

        assert delivered.until(sent) == ["train"] * window
    assert "web" not in delivered.poll()
    assert agent.metrics.value("pods_sent_total") == 3


def test_a_forced_410_is_recovered_by_listing_again_and_nothing_is_lost(
    core: client.CoreV1Api, agent: Agent, queue: Queue, kube: LocalKubernetes,
) -> None:
    delivered = Delivered(queue)
    core.create_namespaced_pod("default", client.V1Pod.model_validate(gpu_pod("before")))
    delivered.until(lambda names: "before" in names)
    kube.expire_watches()
    # lands while the watch is being re-established
    core.create_namespaced_pod("default", client.V1Pod.model_validate(gpu_pod("during")))
    delivered.until(lambda names: "during" in names)
    assert agent.metrics.value("watch_restarts_total", reason="expired") >= 1
    assert agent.metrics.value("relists_total") >= 2
    core.create_namespaced_pod("default", client.V1Pod.model_validate(gpu_pod("after")))
    assert delivered.until(lambda names: "after" in names).count("before") == 1  # same window: not resent


def test_an_api_server_restart_is_survived(
    core: client.CoreV1Api, agent: Agent, queue: Queue, kube: LocalKubernetes,
) -> None:
    delivered = Delivered(queue)
    kube.restart()
    core.create_namespaced_pod("default", client.V1Pod.model_validate(gpu_pod("after-restart")))
    delivered.until(lambda names: "after-restart" in names)
    assert agent.healthy() and agent.ready()


def test_a_pod_that_gets_scheduled_is_no_longer_reported(
    core: client.CoreV1Api, agent: Agent, queue: Queue, kube: LocalKubernetes, clock: FixedClock,
) -> None:
    from gpu_autoscaler.emulator.kubelet import SimulatedInstance
    from gpu_autoscaler.models.resources import Resources

    delivered = Delivered(queue)
    core.create_namespaced_pod("default", client.V1Pod.model_validate(gpu_pod("placed")))
    delivered.until(lambda names: "placed" in names)
    kube.add_instance(SimulatedInstance("i-0aaa", "g5.2xlarge", "us-east-1a", Resources.from_quantities(
        {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1", "pods": "58"})))
    deadline = time.monotonic() + 5
    while not kube_reads.pod_spec(core.read_namespaced_pod("placed", "default")).node_name:
        assert time.monotonic() < deadline, "the pod was never bound"
        time.sleep(0.02)
    deadline = time.monotonic() + 5
    while agent.dispatcher.pending:  # the watch told the dispatcher the pod is no longer pending
        assert time.monotonic() < deadline, "the bound pod is still pending for the agent"
        time.sleep(0.02)
    clock.advance(RESYNC)
    time.sleep(1.0)
    assert delivered.poll() == ["placed"]


def test_a_coscheduling_gang_is_reported_with_its_podgroup_size(
    core: client.CoreV1Api, agent: Agent, queue: Queue, kube: LocalKubernetes,
) -> None:
    with kube.client() as api:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "scheduling.x-k8s.io", "v1alpha1", "default", "podgroups",
            {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "train-42"},
             "spec": {"minMember": 4}})
    for i in range(2):
        pod = gpu_pod(f"train-{i}")
        pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "train-42"}
        core.create_namespaced_pod("default", client.V1Pod.model_validate(pod))
    documents: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while sum(len(d["pods"]) for d in documents) < 2:
        assert time.monotonic() < deadline, f"gang not delivered: {documents}"
        documents += [m["document"] for m in queue.receive()]
        time.sleep(0.05)
    groups = {p["name"]: p["podGroup"] for d in documents for p in d["pods"]}
    assert groups == {"train-0": {"name": "train-42", "minMember": 4}, "train-1": {"name": "train-42", "minMember": 4}}

"""Gangs as the agent sees them on the local Kubernetes API: which pods form one (KAI, Kueue Jobs and JobSets),
and the hold on a gang's nodes — members tolerate the gang taint their nodes register with, and the taint comes
off once the gang is bound, so no other pod takes the gang's room first.

The agent is stepped (`run_once`): list, report, deliver.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.emulator.kubelet import SimulatedInstance
from gpu_autoscaler.models.labels import GANG_LABEL
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import gang_taint
from gpu_autoscaler_agent.agent import Agent
from gpu_autoscaler_agent.health import Metrics
from gpu_autoscaler_agent.settings import AgentSettings
from tests import kube_reads
from tests.integration.agent.conftest import agent_api

if TYPE_CHECKING:

    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
    from tests.integration.agent.conftest import Queue

NS = "default"


def gpu_pod(name: str, gpus: int = 1, *, labels: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {"metadata": metadata, "spec": {"containers": [{
        "name": "main", "image": "trainer:1",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}}]}}


@pytest.fixture
def agent(aws: EmbeddedAws, kube: LocalKubernetes, queue: Queue) -> Agent:
    settings = AgentSettings(cluster=aws.config.cluster_name, queue_url=queue.url, region=aws.config.region,
                             endpoint_url=aws.endpoint_url, max_delay_seconds=0, health_port=None,
                             kube_url=kube.url)
    return Agent(settings, api_client=agent_api(kube), sqs_client=queue.sqs,
                 clock=FixedClock(datetime(2026, 11, 22, 10, tzinfo=UTC)), metrics=Metrics())


def wait(condition: Any, what: str, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def unschedulable(core: client.CoreV1Api, *names: str) -> None:
    def marked() -> bool:
        return all(any(c.type == "PodScheduled" and c.reason == "Unschedulable"
                       for c in kube_reads.pod_status(core.read_namespaced_pod(n, NS)).conditions or ()) for n in names)
    wait(marked, f"{names} to be marked Unschedulable")


def reported_groups(queue: Queue) -> dict[str, Any]:
    return {p["name"]: p.get("podGroup") for m in queue.receive() for p in m["document"]["pods"]}


def test_a_gangs_node_is_kept_for_the_gang_until_it_is_bound(
    api: client.ApiClient, kube: LocalKubernetes, agent: Agent, queue: Queue,
) -> None:
    core = client.CoreV1Api(api)
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", NS, "podgroups",
        {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "train"},
         "spec": {"minMember": 2}})
    for i in range(2):
        core.create_namespaced_pod(NS, client.V1Pod.model_validate(
            gpu_pod(f"train-{i}", 4, labels={"scheduling.x-k8s.io/pod-group": "train"})))
    core.create_namespaced_pod(NS, client.V1Pod.model_validate(gpu_pod("small")))
    unschedulable(core, "train-0", "train-1", "small")
    agent.run_once()
    assert reported_groups(queue) == {"train-0": {"name": "train", "minMember": 2},
                                      "train-1": {"name": "train", "minMember": 2}, "small": None}
    taint = gang_taint("default/train")
    for i in range(2):
        tolerations = kube_reads.pod_spec(core.read_namespaced_pod(f"train-{i}", NS)).tolerations or ()
        assert any(t.key == taint.key and t.value == taint.value and t.effect == "NoSchedule" for t in tolerations)

    # The node launched for the gang joins tainted (its user data says so) with room for all three pods.
    kube.add_instance(SimulatedInstance(
        "i-0gang", "g5.12xlarge", "us-east-1a",
        Resources.from_quantities({"cpu": "48", "memory": "192Gi", "nvidia.com/gpu": "9", "pods": "50"}),
        labels={GANG_LABEL: taint.value}, taints=(taint,)))
    node = wait(lambda: core.list_node().items, "the node")[0].metadata.name
    wait(lambda: all(kube_reads.pod_spec(core.read_namespaced_pod(f"train-{i}", NS)).node_name == node
                     for i in range(2)), "the gang to bind to its node")
    # kept off while the gang was pending
    assert kube_reads.pod_spec(core.read_namespaced_pod("small", NS)).node_name is None

    agent.run_once()  # the gang is bound: its node is open to everyone
    assert all(t.key != GANG_LABEL for t in kube_reads.taints(core.read_node(node)))
    wait(lambda: kube_reads.pod_spec(core.read_namespaced_pod("small", NS)).node_name == node,
         "the small pod to use the rest")
    assert agent.metrics.value("gang_nodes_released_total") == 1


def test_kai_gangs_and_kueue_jobs_and_jobsets_are_reported_as_gangs(
    api: client.ApiClient, agent: Agent, queue: Queue,
) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(
        "scheduling.run.ai", "v2alpha2", NS, "podgroups",
        {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", "metadata": {"name": "pg-kai"},
         "spec": {"minMember": 3}})
    core.create_namespaced_pod(NS, client.V1Pod.model_validate(
        gpu_pod("kai-0", annotations={"pod-group-name": "pg-kai"})))
    batch = client.BatchV1Api(api)
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "trainer:1"}]}}
    for name, labels in (("queued", {"kueue.x-k8s.io/queue-name": "team-a"}), ("plain", {})):
        job = batch.create_namespaced_job(NS, client.V1Job.model_validate({
            "metadata": {"name": name, "labels": labels},
            "spec": {"parallelism": 4, "completions": 8, "template": template}}))
        core.create_namespaced_pod(NS, client.V1Pod.model_validate(gpu_pod(f"{name}-0", owner={
            "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": kube_reads.uid(job), "controller": True})))
    custom.create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", NS, "jobsets",
        {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
         "metadata": {"name": "llm", "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
         "spec": {"replicatedJobs": [
             {"name": "leader", "replicas": 1, "template": {"spec": {"parallelism": 1, "template": template}}},
             {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 3, "template": template}}}]}})
    core.create_namespaced_pod(NS, client.V1Pod.model_validate(
        gpu_pod("llm-workers-0-0", labels={"jobset.sigs.k8s.io/jobset-name": "llm"})))
    unschedulable(core, "kai-0", "queued-0", "plain-0", "llm-workers-0-0")
    agent.run_once()
    assert reported_groups(queue) == {
        "kai-0": {"name": "pg-kai", "minMember": 3},
        "queued-0": {"name": "job.queued", "minMember": 4},
        "plain-0": None,  # Kueue does not manage it: its pods start as they come
        "llm-workers-0-0": {"name": "jobset.llm", "minMember": 7},
    }


def test_a_node_held_for_a_gang_with_nothing_pending_is_released_on_the_next_list(
    api: client.ApiClient, kube: LocalKubernetes, agent: Agent,
) -> None:
    core = client.CoreV1Api(api)
    taint = gang_taint("default/gone")  # the gang was deleted while its node booted
    kube.add_instance(SimulatedInstance(
        "i-0late", "g5.12xlarge", "us-east-1a",
        Resources.from_quantities({"cpu": "48", "memory": "192Gi", "nvidia.com/gpu": "4", "pods": "50"}),
        labels={GANG_LABEL: taint.value}, taints=(taint,)))
    node = wait(lambda: core.list_node().items, "the node")[0].metadata.name
    core.create_namespaced_pod(NS, client.V1Pod.model_validate(gpu_pod("someone")))
    agent.run_once()
    assert all(t.key != GANG_LABEL for t in kube_reads.taints(core.read_node(node)))
    wait(lambda: kube_reads.pod_spec(core.read_namespaced_pod("someone", NS)).node_name == node,
         "another pod to use the node")

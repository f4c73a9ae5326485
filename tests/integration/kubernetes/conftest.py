"""The local Kubernetes API, and the real `kubernetes` client pointed at it, for each test.

A server is cheap to start (a listening socket and two threads), so each test gets its own and no test
sees another's nodes or pods. Builders make objects in their Kubernetes JSON shape with keyword overrides.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client

from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes, SimulatedInstance
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint
from tests import kube_reads

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

GPU_TAINT = Taint(key="nvidia.com/gpu", value="true", effect="NoSchedule")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def kube() -> Iterator[LocalKubernetes]:
    with LocalKubernetes(cluster_name="ml-prod", bookmark_interval=0.2) as local:
        yield local


@pytest.fixture
def api(kube: LocalKubernetes) -> Iterator[client.ApiClient]:
    with kube.client() as api_client:
        yield api_client


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


FUNCTIONS_GROUP = "gpu-autoscaler-functions"
"""The group the stack's access entries put the functions' roles in, which agent/deploy/functions-rbac.yaml binds."""


def functions_client(kube: LocalKubernetes) -> client.ApiClient:
    """A client as the functions are: a member of their group, so RBAC allows what their shipped ClusterRole allows."""
    return kube.client(kube.user_token("a-function", (FUNCTIONS_GROUP,)))


@pytest.fixture
def functions_api(kube: LocalKubernetes) -> Iterator[client.ApiClient]:
    """The functions' permissions (the tests' `api` and `core` are the cluster admin's, setting the scene)."""
    with functions_client(kube) as api_client:
        yield api_client


@pytest.fixture
def cluster(functions_api: client.ApiClient) -> KubernetesCluster:
    """The functions' Kubernetes adapter, as the functions' group."""
    return KubernetesCluster(functions_api)


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll until `predicate` returns something truthy (the background controllers act within milliseconds)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def make_instance(
    instance_id: str = "i-0aaa",
    *,
    gpus: int = 1,
    cpu: str = "8",
    memory: str = "32Gi",
    pods: int = 58,
    zone: str = "us-east-1a",
    labels: dict[str, str] | None = None,
    taints: tuple[Taint, ...] = (GPU_TAINT,),
    node_name: str | None = None,
) -> SimulatedInstance:
    quantities = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    if gpus:
        quantities["nvidia.com/gpu"] = str(gpus)
    return SimulatedInstance(
        instance_id=instance_id, instance_type="g5.2xlarge", zone=zone,
        capacity=Resources.from_quantities(quantities), labels=labels or {}, taints=taints, node_name=node_name,
    )


def make_pod(
    name: str = "pod-0",
    *,
    gpus: int | None = 1,
    cpu: str = "1",
    memory: str = "1Gi",
    tolerate_gpu: bool = True,
    labels: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    affinity_terms: list[dict[str, Any]] | None = None,
    node_name: str | None = None,
    priority: int | None = None,
    gates: list[str] | None = None,
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "trainer:1",
                                            "resources": {"requests": {"cpu": cpu, "memory": memory},
                                                          "limits": limits}}]}
    if tolerate_gpu:
        spec["tolerations"] = [GPU_TOLERATION]
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity_terms:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": affinity_terms}}}
    if node_name:
        spec["nodeName"] = node_name
    if priority is not None:
        spec["priority"] = priority
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def make_budget(name: str, selector: dict[str, Any], **spec: Any) -> client.V1PodDisruptionBudget:
    """A PodDisruptionBudget in `default`: `selector` is its label selector (`matchLabels`, `matchExpressions`),
    `spec` the rest (`minAvailable`, `maxUnavailable`)."""
    return client.V1PodDisruptionBudget.model_validate({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
        "spec": {"selector": selector, **spec}})


def pod_condition(core: client.CoreV1Api, name: str, namespace: str = "default") -> dict[str, Any] | None:
    pod = core.read_namespaced_pod(name, namespace)
    for condition in kube_reads.pod_status(pod).conditions or ():
        if condition.type == "PodScheduled":
            return {"status": condition.status, "reason": condition.reason, "message": condition.message}
    return None


def node_names(core: client.CoreV1Api) -> list[str]:
    return sorted(kube_reads.name(n) for n in core.list_node().items)

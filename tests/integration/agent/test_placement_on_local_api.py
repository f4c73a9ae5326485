"""What the agent reads beside the pod, on the local Kubernetes API: its volumes' zones, its zone spread (with the
matching pods per zone), and its Dynamic Resource Allocation claims (resource.k8s.io/v1).

The agent is stepped (`run_once`): list, report, deliver.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.emulator.kubelet import SimulatedInstance
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler_agent.agent import Agent
from gpu_autoscaler_agent.health import Metrics
from gpu_autoscaler_agent.settings import AgentSettings
from tests import kube_reads
from tests.integration.agent.conftest import agent_api
from tests.integration.agent.test_gangs_on_local_api import unschedulable

if TYPE_CHECKING:

    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
    from tests.integration.agent.conftest import Queue

NS = "default"
ZONE = "topology.kubernetes.io/zone"


def pod(name: str, gpus: int = 1, **spec: Any) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"metadata": {"name": name, "labels": spec.pop("labels", {})}, "spec": {**spec, "containers": [{
        "name": "main", "image": "trainer:1", "resources": {"requests": {"cpu": "1"}, "limits": limits}}]}}


@pytest.fixture
def agent(aws: EmbeddedAws, kube: LocalKubernetes, queue: Queue) -> Agent:
    settings = AgentSettings(cluster=aws.config.cluster_name, queue_url=queue.url, region=aws.config.region,
                             endpoint_url=aws.endpoint_url, max_delay_seconds=0, health_port=None, kube_url=kube.url)
    return Agent(settings, api_client=agent_api(kube), sqs_client=queue.sqs,
                 clock=FixedClock(datetime(2026, 11, 22, 10, tzinfo=UTC)), metrics=Metrics())


def reported(queue: Queue) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for m in queue.receive() for p in m["document"]["pods"]}


def test_volume_zones_come_from_bound_volumes_and_late_binding_classes(
    api: client.ApiClient, agent: Agent, queue: Queue,
) -> None:
    core = client.CoreV1Api(api)
    core.create_persistent_volume(client.V1PersistentVolume.model_validate({"metadata": {"name": "pv-data"}, "spec": {
        "capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
        "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0abc"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1b"]}]}]}}}}))
    client.StorageV1Api(api).create_storage_class(client.V1StorageClass.model_validate({
        "metadata": {"name": "gp3"}, "provisioner": "ebs.csi.aws.com", "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [
            {"key": ZONE, "values": ["us-east-1a", "us-east-1b"]}]}]}))
    claim = {"accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
             "resources": {"requests": {"storage": "100Gi"}}}
    core.create_namespaced_persistent_volume_claim(NS, client.V1PersistentVolumeClaim.model_validate(
        {"metadata": {"name": "data"}, "spec": {**claim, "volumeName": "pv-data"}}))
    core.create_namespaced_persistent_volume_claim(NS, client.V1PersistentVolumeClaim.model_validate(
        {"metadata": {"name": "scratch"}, "spec": claim}))
    volume = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
    core.create_namespaced_pod(NS, client.V1Pod.model_validate(pod("bound", volumes=[volume])))
    scratch = {"name": "s", "persistentVolumeClaim": {"claimName": "scratch"}}
    core.create_namespaced_pod(NS, client.V1Pod.model_validate(pod("late", volumes=[scratch])))
    core.create_namespaced_pod(NS, client.V1Pod.model_validate(pod("free")))
    unschedulable(core, "bound", "late", "free")
    agent.run_once()
    pods = reported(queue)
    assert pods["bound"]["volumeZones"] == ["us-east-1b"]
    assert pods["late"]["volumeZones"] == ["us-east-1a", "us-east-1b"]
    assert "volumeZones" not in pods["free"]


def test_zone_spread_and_anti_affinity_are_reported(
    api: client.ApiClient, kube: LocalKubernetes, agent: Agent, queue: Queue,
) -> None:
    core = client.CoreV1Api(api)
    kube.add_instance(SimulatedInstance("i-0web", "m5.large", "us-east-1a",
                                        Resources.from_quantities({"cpu": "2", "memory": "8Gi", "pods": "20"})))
    running = pod("web-0", gpus=0, labels={"app": "web"})
    core.create_namespaced_pod(NS, client.V1Pod.model_validate(running))
    spread = {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
              "labelSelector": {"matchLabels": {"app": "web"}}}
    anyway = {**spread, "whenUnsatisfiable": "ScheduleAnyway", "topologyKey": "kubernetes.io/hostname"}
    apart = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["web"]}]}}
    other = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "db"}}}
    core.create_namespaced_pod(NS, client.V1Pod.model_validate(
        pod("web-1", labels={"app": "web"}, topologySpreadConstraints=[spread, anyway],
            affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [apart, other]}})))
    unschedulable(core, "web-1")
    assert kube_reads.pod_spec(core.read_namespaced_pod("web-0", NS)).node_name
    agent.run_once()
    web = reported(queue)["web-1"]
    assert web["topologySpreadConstraints"] == [
        {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule", "zoneCounts": {"us-east-1a": 1}}]
    assert web["podAntiAffinity"] == [apart]  # the term that matches the pod itself: one per node


def test_dra_claims_are_reported_as_device_requests_or_with_why_not(
    api: client.ApiClient, agent: Agent, queue: Queue,
) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    group, version = "resource.k8s.io", "v1"

    def template(name: str, device_class: str, **exactly: Any) -> None:
        custom.create_namespaced_custom_object(group, version, NS, "resourceclaimtemplates", {
            "apiVersion": f"{group}/{version}", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": device_class, **exactly}}]}}}})

    def claims_pod(name: str, template_name: str) -> dict[str, Any]:
        return pod(name, gpus=0, resourceClaims=[{"name": "gpus", "resourceClaimTemplateName": template_name}])

    template("two-gpus", "gpu.nvidia.com", allocationMode="ExactCount", count=2)
    template("all-gpus", "gpu.nvidia.com", allocationMode="All")
    template("a-nic", "rdma.example.com", count=1)
    for name, template_name in (("before-driver", "two-gpus"), ("every-gpu", "all-gpus"), ("nic", "a-nic")):
        core.create_namespaced_pod(NS, client.V1Pod.model_validate(claims_pod(name, template_name)))
    unschedulable(core, "before-driver", "every-gpu", "nic")
    agent.run_once()
    first = reported(queue)
    assert "nic" not in first  # asks for no GPU, and nothing else makes it a GPU pod
    assert "device class gpu.nvidia.com does not exist in the cluster" in first["before-driver"]["unplannable"]
    assert "asks for all devices of class gpu.nvidia.com" in first["every-gpu"]["unplannable"]

    custom.create_cluster_custom_object(group, version, "deviceclasses", {
        "apiVersion": f"{group}/{version}", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}})
    core.create_namespaced_pod(NS, client.V1Pod.model_validate(claims_pod("trainer", "two-gpus")))
    unschedulable(core, "trainer")
    clock = agent.clock
    assert isinstance(clock, FixedClock)
    clock.advance(timedelta(minutes=1))  # what the agent read of the cluster's classes is read again
    agent.run_once()
    assert reported(queue)["trainer"]["deviceRequests"] == [
        {"deviceClassName": "gpu.nvidia.com", "count": 2, "claim": "two-gpus"}]

"""A node is what its user data and its machine make it: the simulated kubelet and NVIDIA device plugin.

The user data is the project's own rendering (the input under test); the kubelet, the device plugin, its
ConfigMap (the one the project ships) and the MIG manager are the emulator's independent stand-ins. Each
test compares what the node ends up advertising with what the packer planned for it.
"""

from __future__ import annotations

import base64
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from kubernetes import client
from moto import mock_aws

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.config import NodePool, Overhead, parse_config
from gpu_autoscaler.domain.packing.fit import allocatable
from gpu_autoscaler.domain.user_data import ClusterBootstrap, node_setup, render_user_data
from gpu_autoscaler.emulator.device_plugin import OperandTolerations, shipped_config_map
from gpu_autoscaler.emulator.efa_device_plugin import chart_tolerations
from gpu_autoscaler.emulator.kube_objects import CONFIGMAPS, NODES, PODS
from gpu_autoscaler.emulator.kubelet import node_resources
from gpu_autoscaler.emulator.kubelet_user_data import BootstrapError, DevicePluginSettings, KubeletSettings
from gpu_autoscaler.emulator.kubernetes_api import KubeletNodeSide, LocalKubernetes, SimulatedInstance
from gpu_autoscaler.emulator.machines import Gpu, Machine
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.catalog import InstanceType
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint, gang_taint
from tests import kube_reads
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode()
AL2023 = ClusterBootstrap(cluster_name="ml-prod", endpoint="https://EXAMPLE.eks.amazonaws.com", family="AL2023",
                          certificate_authority=CA, service_cidr="10.100.0.0/16")
BOTTLEROCKET = ClusterBootstrap(cluster_name="ml-prod", endpoint="https://EXAMPLE.eks.amazonaws.com",
                                family="Bottlerocket", certificate_authority=CA, service_cidr="10.100.0.0/16")

# The project's catalog view and EC2's view (DescribeInstanceTypes) of the same instance types.
G5_12X = InstanceType(name="g5.12xlarge", vcpu=48, memory_mib=196608, gpus=4, gpu_devices=4, gpu_model="A10G",
                      gpu_manufacturer="NVIDIA", gpu_memory_mib=91552, max_pods=234)
G5_12X_MACHINE = Machine("g5.12xlarge", vcpus=48, memory_mib=196608, gpu=Gpu("A10G", "NVIDIA", 4, 22888),
                         max_enis=8, ipv4_per_eni=30, root_volume_gib=100)
P5 = InstanceType(name="p5.48xlarge", vcpu=192, memory_mib=2097152, gpus=8, gpu_devices=8, gpu_model="H100",
                  gpu_manufacturer="NVIDIA", gpu_memory_mib=652472, efa=True, efa_interfaces=32, max_pods=100)
P4DE = InstanceType(name="p4de.24xlarge", vcpu=96, memory_mib=1179648, gpus=8, gpu_devices=8, gpu_model="A100",
                    gpu_manufacturer="NVIDIA", gpu_memory_mib=655360, max_pods=737)
P4DE_MACHINE = Machine("p4de.24xlarge", vcpus=96, memory_mib=1179648, gpu=Gpu("A100", "NVIDIA", 8, 81920),
                       max_enis=15, ipv4_per_eni=50, root_volume_gib=100)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(datetime(2026, 11, 22, 10, 0, tzinfo=UTC))


@pytest.fixture
def kube(clock: FixedClock) -> Iterator[LocalKubernetes]:
    with LocalKubernetes(clock=clock, run_controllers=False, device_plugin_delay=timedelta(seconds=10),
                         ready_delay=timedelta(seconds=5), cloud_controller_delay=timedelta(seconds=2)) as local:
        config_map = shipped_config_map()
        local.api.create(CONFIGMAPS, config_map["metadata"]["namespace"], config_map)
        yield local


def user_data(pool: NodePool, instance_type: InstanceType, bootstrap: ClusterBootstrap = AL2023,
              capacity_type: str = "on-demand") -> str:
    return render_user_data(bootstrap, node_setup(pool, capacity_type, instance_type=instance_type,  # type: ignore[arg-type]
                                                  claim_id="claim-1"))


def boot(kube: LocalKubernetes, clock: FixedClock, instance: SimulatedInstance) -> dict[str, Any]:
    """Register the node, let the device plugin start, and return the Node as the API serves it."""
    kube.add_instance(instance, boot_delay=timedelta(0))
    kube.reconcile()
    clock.advance(timedelta(seconds=10))
    kube.reconcile()
    return kube.api.get(NODES, "", instance.name)


def test_the_kubelet_registers_what_the_user_data_says_and_gpus_come_later_from_the_device_plugin(
        kube: LocalKubernetes, clock: FixedClock) -> None:
    """As on EKS: the kubelet (`--cloud-provider=external`) registers the Node NotReady, with the uninitialized
    taint and without the cloud's labels; the cloud controller manager initializes it (instance type, zone,
    region; the taint off), the kubelet reports Ready (the not-ready taint off), and the device plugin's GPUs come
    last."""
    pool = NodePool.model_validate({"name": "gpu-burst", "labels": {"team": "vision"},
                                    "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]})
    instance = SimulatedInstance.from_user_data("i-0aaa", G5_12X_MACHINE, "us-east-1b", user_data(pool, G5_12X),
                                                capacity_type="spot")
    kube.add_instance(instance, boot_delay=timedelta(0))
    kube.reconcile()
    with kube.client() as api:
        [node] = client.CoreV1Api(api).list_node().items
    labels = kube_reads.labels(node)
    assert labels["team"] == "vision" and labels[L.NODE_POOL] == "gpu-burst" and labels[L.CLAIM_LABEL] == "claim-1"
    served = kube.api.get(NODES, "", instance.name)
    assert served["spec"]["providerID"] == "aws:///us-east-1b/i-0aaa"  # nodeadm sets it: the cloud provider is external
    assert not {L.INSTANCE_TYPE, L.ZONE, "topology.kubernetes.io/region"} & set(labels)
    # The kubelet registers the deprecated arch and os keys beside the stable ones (kubelet_node_status.go
    # `initialNode`: kubeletapis.LabelOS, LabelArch), which pods of older charts still select.
    assert (labels["beta.kubernetes.io/arch"], labels["beta.kubernetes.io/os"]) == (
        labels[L.ARCH], labels["kubernetes.io/os"]) == ("amd64", "linux")
    assert [(t.key, t.value, t.effect) for t in kube_reads.taints(node)] == [
        ("nvidia.com/gpu", "true", "NoSchedule"), ("node.cloudprovider.kubernetes.io/uninitialized", "true",
                                                   "NoSchedule"), ("node.kubernetes.io/not-ready", None, "NoSchedule")]
    assert [c["status"] for c in served["status"]["conditions"] if c["type"] == "Ready"] == ["False"]
    assert kube_reads.capacity(node)["pods"] == "234"  # maxPods from the NodeConfig

    clock.advance(timedelta(seconds=2))
    kube.reconcile()  # the cloud controller manager initializes it from EC2's description of the instance
    initialized = kube.api.get(NODES, "", instance.name)
    labels = initialized["metadata"]["labels"]
    assert (labels[L.INSTANCE_TYPE], labels[L.ZONE], labels["topology.kubernetes.io/region"]) == (
        "g5.12xlarge", "us-east-1b", "us-east-1")
    # and the deprecated keys beside them (k8s.io/cloud-provider controllers/node: "Adding node label from cloud
    # provider" for the beta instance type, zone and region).
    assert (labels["beta.kubernetes.io/instance-type"], labels["failure-domain.beta.kubernetes.io/zone"],
            labels["failure-domain.beta.kubernetes.io/region"]) == ("g5.12xlarge", "us-east-1b", "us-east-1")
    assert [t["key"] for t in initialized["spec"]["taints"]] == ["nvidia.com/gpu", "node.kubernetes.io/not-ready"]

    clock.advance(timedelta(seconds=3))
    kube.reconcile()  # the kubelet reports Ready; the node lifecycle controller takes the not-ready taint off
    ready = kube.api.get(NODES, "", instance.name)
    assert [c["status"] for c in ready["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
    assert [(t["key"], t["effect"]) for t in ready["spec"]["taints"]] == [("nvidia.com/gpu", "NoSchedule")]
    assert "nvidia.com/gpu" not in ready["status"]["allocatable"]  # Ready, but the device plugin has not run yet

    clock.advance(timedelta(seconds=5))
    kube.reconcile()
    node_after = kube.api.get(NODES, "", instance.name)
    assert node_after["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node_after["metadata"]["labels"]["nvidia.com/gpu.product"] == "A10G"


def test_the_gpu_operator_does_not_run_before_the_node_is_ready_nor_with_the_charts_tolerations_uninitialized(
        kube: LocalKubernetes, clock: FixedClock) -> None:
    """The device plugin's pod uses the pod network, which a NotReady node does not have yet; and the DaemonSet
    controller adds no toleration of the uninitialized taint, so with the chart's own tolerations
    (`nvidia.com/gpu:NoSchedule` alone) a node the cloud controller manager has not initialized gets no GPUs,
    however long ago it registered. (The values the project ships tolerate every taint.)"""
    kube.device_plugin.tolerations = OperandTolerations.from_values({})
    kube.cloud_controller.describe = lambda instance_id: None  # EC2 does not know the instance (yet)
    instance = SimulatedInstance.from_user_data("i-0aaa", G5_12X_MACHINE, "us-east-1a",
                                                user_data(NodePool(name="gpu-burst"), G5_12X))
    kube.kubelets.ready_delay = timedelta(seconds=30)
    node = boot(kube, clock, instance)
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]  # past its delay, but NotReady
    clock.advance(timedelta(seconds=30))
    kube.reconcile()
    node = kube.api.get(NODES, "", instance.name)
    assert [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
    assert [t["key"] for t in node["spec"]["taints"]] == ["node.cloudprovider.kubernetes.io/uninitialized"]
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    kube.cloud_controller.describe = lambda instance_id: ("g5.12xlarge", "us-east-1a")
    kube.reconcile()
    node = kube.api.get(NODES, "", instance.name)
    assert "taints" not in node["spec"] and node["status"]["allocatable"]["nvidia.com/gpu"] == "4"


def test_a_label_the_kubelet_may_not_set_keeps_the_node_from_joining(kube: LocalKubernetes) -> None:
    refused = render_user_data(AL2023, node_setup(NodePool(name="gpu-burst"), "on-demand", instance_type=G5_12X))
    refused = refused.replace("--node-labels=", "--node-labels=node-role.kubernetes.io/gpu=true,")
    with pytest.raises(BootstrapError, match="node-role.kubernetes.io/gpu"):
        SimulatedInstance.from_user_data("i-0aaa", G5_12X_MACHINE, "us-east-1a", refused)


@pytest.mark.parametrize("bootstrap", [AL2023, BOTTLEROCKET], ids=["AL2023", "Bottlerocket"])
@pytest.mark.parametrize(("labels", "taints", "refusal"), [
    ({"workload": "training job"}, (), "invalid node labels: 'workload'"),
    ({"workload": "a" * 64}, (), "invalid node labels: 'workload'"),
    ({"team/a/b": "x"}, (), "invalid node labels: 'team/a/b'"),
    ({}, (Taint(key="dedicated", value="gpu/a100"),), "invalid taint value: gpu/a100"),
    ({}, (Taint(key="bad key", value="v"),), "invalid taint key: bad key"),
    ({}, (Taint(key="nvidia.com/gpu", value="true"), Taint(key="nvidia.com/gpu", value="present")),
     "duplicated taints with the same key and effect"),
], ids=["space", "64-characters", "two-slashes", "taint-value", "taint-key", "duplicate-taint"])
def test_labels_and_taints_outside_kubernetes_syntax_keep_the_node_from_joining(
        bootstrap: ClusterBootstrap, labels: dict[str, str], taints: tuple[Taint, ...], refusal: str) -> None:
    """The real kubelet exits on them (ValidateKubeletFlags, ParseTaints), so no Node appears; the
    configuration refuses them, so the user data is edited here as a newer or hand-made one could be."""
    setup = node_setup(NodePool(name="gpu-burst"), "on-demand", instance_type=G5_12X)
    refused = render_user_data(bootstrap, replace(setup, labels={**setup.labels, **labels},
                                                  taints=setup.taints + taints))
    with pytest.raises(BootstrapError, match=re.escape(refusal)):
        SimulatedInstance.from_user_data("i-0aaa", G5_12X_MACHINE, "us-east-1a", refused)


def test_time_sliced_al2023_nodes_advertise_the_replicas_the_packer_planned(
        kube: LocalKubernetes, clock: FixedClock) -> None:
    """Issue 15, fix 1: the node's user data selects the device plugin's time-slicing config."""
    pool = NodePool.model_validate({"name": "gpu-shared", "gpuSharing": {"mode": "time-slicing", "replicas": 4}})
    node = boot(kube, clock, SimulatedInstance.from_user_data("i-0aaa", G5_12X_MACHINE, "us-east-1a",
                                                               user_data(pool, G5_12X)))
    planned = allocatable(G5_12X, pool, Overhead())
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(planned["nvidia.com/gpu"]) == "16"
    assert node["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "4"


@pytest.mark.parametrize("replicas", [2, 16, 17, 64])
def test_every_replicas_count_a_pool_may_state_is_advertised_on_al2023(
        kube: LocalKubernetes, clock: FixedClock, replicas: int) -> None:
    """The node's label names `time-slicing-<replicas>`; the shipped ConfigMap has every such entry."""
    pool = NodePool.model_validate({"name": "gpu-shared", "gpuSharing": {"mode": "time-slicing",
                                                                         "replicas": replicas}})
    node = boot(kube, clock, SimulatedInstance.from_user_data("i-0aaa", G5_12X_MACHINE, "us-east-1a",
                                                               user_data(pool, G5_12X)))
    assert node["status"]["allocatable"].get("nvidia.com/gpu") == str(allocatable(G5_12X, pool, Overhead())[
        "nvidia.com/gpu"]) == str(4 * replicas)


def test_a_config_label_the_configmap_lacks_stops_the_plugin(kube: LocalKubernetes, clock: FixedClock) -> None:
    """The config-manager fails on a config name the ConfigMap does not have (cmd/config-manager, updateConfigName)."""
    instance = SimulatedInstance("i-0aaa", "g5.12xlarge", "us-east-1a", capacity=Resources.from_quantities(
        {"cpu": "48", "memory": "180Gi", "pods": "50"}), gpu=Gpu("A10G", "NVIDIA", 4, 22888),
        labels={"nvidia.com/device-plugin.config": "time-slicing-65"})
    node = boot(kube, clock, instance)
    assert not {k for k in node["status"]["allocatable"] if k.startswith("nvidia.com/")}


def test_bottlerocket_time_slicing_comes_from_its_settings(kube: LocalKubernetes, clock: FixedClock) -> None:
    """Bottlerocket renames a time-sliced GPU `nvidia.com/gpu.shared` unless the settings say not to."""
    pool = NodePool.model_validate({"name": "gpu-shared", "gpuSharing": {"mode": "time-slicing", "replicas": 4}})
    node = boot(kube, clock, SimulatedInstance.from_user_data("i-0aaa", G5_12X_MACHINE, "us-east-1a",
                                                               user_data(pool, G5_12X, BOTTLEROCKET)))
    planned = allocatable(G5_12X, pool, Overhead())
    gpu_resources = {k: v for k, v in node["status"]["allocatable"].items() if k.startswith("nvidia.com/")}
    assert gpu_resources == {"nvidia.com/gpu": str(planned["nvidia.com/gpu"])} == {"nvidia.com/gpu": "16"}


B200 = InstanceType(name="p6-b200.48xlarge", vcpu=192, memory_mib=2097152, gpus=8, gpu_devices=8, gpu_model="B200",
                    gpu_manufacturer="NVIDIA", gpu_memory_mib=8 * 183359, max_pods=737)
B200_MACHINE = Machine("p6-b200.48xlarge", vcpus=192, memory_mib=2097152, gpu=Gpu("B200", "NVIDIA", 8, 183359),
                       max_enis=15, ipv4_per_eni=50, root_volume_gib=100)


@pytest.mark.parametrize(("instance_type", "machine", "profile", "count"), [
    (P4DE, P4DE_MACHINE, "1g.10gb", 56),
    (B200, B200_MACHINE, "1g.23gb", 56),
])
def test_bottlerocket_mig_nodes_advertise_single_strategy_slices(
        kube: LocalKubernetes, clock: FixedClock, instance_type: InstanceType, machine: Machine, profile: str,
        count: int) -> None:
    """Bottlerocket's MIG manager knows a GPU by its nominal name (`b200.180gb`) and its plugin uses the single
    strategy: slices are `nvidia.com/gpu`."""
    pool = NodePool.model_validate({"name": "gpu-mig", "gpuSharing": {"mode": "mig", "migProfile": profile,
                                                                      "migStrategy": "single"}})
    node = boot(kube, clock, SimulatedInstance.from_user_data("i-0aaa", machine, "us-east-1a",
                                                               user_data(pool, instance_type, BOTTLEROCKET)))
    gpu_resources = {k: v for k, v in node["status"]["allocatable"].items() if k.startswith("nvidia.com/")}
    assert gpu_resources == {"nvidia.com/gpu": str(count)}
    assert allocatable(instance_type, pool, Overhead())["nvidia.com/gpu"] == count


def test_bottlerocket_refuses_mixed_mig_at_configuration_time() -> None:
    from gpu_autoscaler.config import ConfigError, parse_config
    from tests.conftest import example_config_data

    data = example_config_data()
    data["ami"]["family"] = "Bottlerocket"
    data["nodePools"][0]["gpuSharing"] = {"mode": "mig", "migProfile": "1g.10gb"}
    with pytest.raises(ConfigError, match="migStrategy"):
        parse_config(data)


def test_a_pod_asking_for_two_shared_gpus_is_rejected_where_the_plugin_fails_such_requests(
        kube: LocalKubernetes, clock: FixedClock) -> None:
    settings = DevicePluginSettings(sharing_strategy="time-slicing", replicas=4)  # Bottlerocket's defaults
    instance = SimulatedInstance("i-0aaa", "g5.12xlarge", "us-east-1a", capacity=Resources.from_quantities(
        {"cpu": "48", "memory": "180Gi", "pods": "50"}), gpu=Gpu("A10G", "NVIDIA", 4, 22888), device_plugin=settings)
    node = boot(kube, clock, instance)
    assert node["status"]["allocatable"]["nvidia.com/gpu.shared"] == "16"
    pod = {"metadata": {"name": "two"}, "spec": {"containers": [{"name": "main", "image": "x", "resources": {
        "limits": {"nvidia.com/gpu.shared": "2"}}}]}}
    kube.api.create(PODS, "default", pod)
    kube.reconcile()
    status = kube.api.get(PODS, "default", "two")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "UnexpectedAdmissionError")


@pytest.mark.parametrize("bottlerocket", [False, True])
def test_a_time_slicing_config_of_one_replica_stops_the_plugin(
        kube: LocalKubernetes, clock: FixedClock, bottlerocket: bool) -> None:
    """The device plugin refuses a time-slicing config with fewer than two replicas (k8s-device-plugin
    api/config/v1/replicas.go): the node advertises no GPUs, whether the config comes from the ConfigMap or from
    Bottlerocket's settings."""
    one = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n"
           "        replicas: 1\n")
    kube.api.create(CONFIGMAPS, "gpu-operator", {"metadata": {"name": "one-replica", "namespace": "gpu-operator"},
                                                 "data": {"time-slicing-1": one}})
    kube.device_plugin.config_map = ("gpu-operator", "one-replica")
    settings = DevicePluginSettings(sharing_strategy="time-slicing", replicas=1) if bottlerocket else None
    instance = SimulatedInstance("i-0aaa", "g5.12xlarge", "us-east-1a", capacity=Resources.from_quantities(
        {"cpu": "48", "memory": "180Gi", "pods": "50"}), gpu=Gpu("A10G", "NVIDIA", 4, 22888),
        labels={"nvidia.com/device-plugin.config": "time-slicing-1"}, device_plugin=settings)
    node = boot(kube, clock, instance)
    assert not {k for k in node["status"]["allocatable"] if k.startswith("nvidia.com/")}


@pytest.mark.parametrize(("sharing", "resource", "count"), [
    ({"mode": "mig", "migProfile": "1g.10gb"}, "nvidia.com/mig-1g.10gb", 56),
    ({"mode": "mig", "migProfile": "1g.10gb", "migStrategy": "single"}, "nvidia.com/gpu", 56),
    ({"mode": "mig", "migProfile": "1g.10gb+me", "migStrategy": "mixed"}, "nvidia.com/mig-1g.10gb.me", 8),
    ({"mode": "mig", "migProfile": "3g.40gb", "migStrategy": "mixed"}, "nvidia.com/mig-3g.40gb", 16),
])
def test_mig_nodes_advertise_the_slices_under_the_strategy_the_pool_states(
        kube: LocalKubernetes, clock: FixedClock, sharing: dict[str, str], resource: str, count: int) -> None:
    """Issue 15, fix 2: mig-parted's config names and the device plugin's MIG strategy."""
    pool = NodePool.model_validate({"name": "gpu-mig", "gpuSharing": sharing})
    node = boot(kube, clock, SimulatedInstance.from_user_data("i-0aaa", P4DE_MACHINE, "us-east-1a",
                                                               user_data(pool, P4DE)))
    assert node["metadata"]["labels"]["nvidia.com/mig.config.state"] == "success"
    gpu_resources = {k: v for k, v in node["status"]["allocatable"].items() if k.startswith("nvidia.com/")}
    assert gpu_resources == {resource: str(count)}
    planned = allocatable(P4DE, pool, Overhead())
    assert planned[resource] == count


def test_the_device_plugin_removes_startup_taints_when_it_advertises(kube: LocalKubernetes,
                                                                      clock: FixedClock) -> None:
    kube.device_plugin.startup_taints = ("example.com/gpu-not-ready",)
    pool = NodePool.model_validate({"name": "gpu-burst", "taints": [
        {"key": "example.com/gpu-not-ready", "value": "true", "effect": "NoSchedule"}]})
    instance = SimulatedInstance.from_user_data("i-0aaa", G5_12X_MACHINE, "us-east-1a", user_data(pool, G5_12X))
    kube.add_instance(instance, boot_delay=timedelta(0))
    kube.reconcile()
    assert kube.api.get(NODES, "", instance.name)["spec"]["taints"][0]["key"] == "example.com/gpu-not-ready"
    clock.advance(timedelta(seconds=10))
    kube.reconcile()
    node = kube.api.get(NODES, "", instance.name)
    assert "taints" not in node["spec"] and node["status"]["allocatable"]["nvidia.com/gpu"] == "4"


EXAMPLE = parse_config(example_config_data())


@pytest.mark.parametrize("gang", [None, "train-42"])
@pytest.mark.parametrize("pool_name", [p.name for p in EXAMPLE.node_pools])
def test_the_gpu_operator_as_shipped_runs_on_every_node_we_launch_whatever_its_taints(
        kube: LocalKubernetes, clock: FixedClock, pool_name: str, gang: str | None) -> None:
    """A gang's node registers with `gpu-autoscaler/gang=<id>:NoSchedule`, a pool's with its own taints
    (`gpu-autoscaler/shared=true:NoSchedule` in the example): the GPU Operator's DaemonSets (NFD worker, device
    plugin) run on it only if they tolerate those, or its GPUs are never advertised. The emulator's plugin reads the
    tolerations from the values file the project ships."""
    pool = EXAMPLE.pool(pool_name)
    setup = node_setup(pool, "on-demand", instance_type=G5_12X, claim_id="claim-1", gang=gang)
    node = boot(kube, clock, SimulatedInstance.from_user_data("i-0aaa", G5_12X_MACHINE, "us-east-1a",
                                                               render_user_data(AL2023, setup)))
    assert {t["key"] for t in node["spec"].get("taints") or ()} >= ({"gpu-autoscaler/gang"} if gang else set())
    planned = allocatable(G5_12X, pool, Overhead())["nvidia.com/gpu"]
    assert node["status"]["allocatable"].get("nvidia.com/gpu") == str(planned)


def test_with_the_charts_tolerations_the_plugin_runs_only_where_nvidia_gpu_is_the_only_taint(
        kube: LocalKubernetes, clock: FixedClock) -> None:
    """The GPU Operator chart's defaults: its DaemonSets tolerate `nvidia.com/gpu:NoSchedule` and nothing else
    (deployments/gpu-operator/values.yaml, `daemonsets.tolerations`, `node-feature-discovery.worker.tolerations`)."""
    kube.device_plugin.tolerations = OperandTolerations.from_values({})
    gpu_taint = Taint(key="nvidia.com/gpu", value="true", effect="NoSchedule")
    nodes = {}
    for instance_id, taints in (("i-0aaa", (gpu_taint,)), ("i-0bbb", (gpu_taint, gang_taint("train-42")))):
        nodes[instance_id] = boot(kube, clock, SimulatedInstance(
            instance_id, "g5.12xlarge", "us-east-1a", capacity=Resources.from_quantities(
                {"cpu": "48", "memory": "180Gi", "pods": "50"}), gpu=Gpu("A10G", "NVIDIA", 4, 22888), taints=taints))
    assert nodes["i-0aaa"]["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert "nvidia.com/gpu" not in nodes["i-0bbb"]["status"]["allocatable"]
    assert "nvidia.com/gpu.count" not in nodes["i-0bbb"]["metadata"]["labels"]  # nor GPU Feature Discovery


P5_MACHINE = Machine("p5.48xlarge", vcpus=192, memory_mib=2097152, gpu=Gpu("H100", "NVIDIA", 8, 81559),
                     max_enis=2, ipv4_per_eni=50, root_volume_gib=100, efa_devices=32)


@pytest.mark.parametrize(("bootstrap", "pages"), [(AL2023, 110 * 192 + 1), (BOTTLEROCKET, 110 * 192)])
def test_an_efa_node_advertises_its_efas_and_the_huge_pages_its_ami_reserves_for_them(
        kube: LocalKubernetes, clock: FixedClock, bootstrap: ClusterBootstrap, pages: int) -> None:
    """The EFA device plugin advertises the instance's EFA devices; the AMI pre-allocates 2 MiB huge pages once an
    EFA is attached, which the kubelet reports and takes out of allocatable memory."""
    pool = NodePool(name="training", efa=True)
    node = boot(kube, clock, SimulatedInstance.from_user_data("i-0aaa", P5_MACHINE, "us-east-1a",
                                                              user_data(pool, P5, bootstrap)))
    plain = SimulatedInstance.from_user_data("i-0bbb", replace(P5_MACHINE, efa_devices=0), "us-east-1a",
                                             user_data(pool, P5, bootstrap))
    assert node["status"]["allocatable"]["vpc.amazonaws.com/efa"] == "32"
    assert node["status"]["capacity"]["hugepages-2Mi"] == f"{pages * 2 * 1024}Ki"
    offered = Resources.from_quantities(node["status"]["allocatable"])
    assert plain.allocatable is not None and "hugepages-2Mi" not in plain.capacity.keys()
    assert offered["memory"] == plain.allocatable["memory"] - pages * 2 * 2**20


def test_the_eks_guides_nccl_worker_runs_on_the_efa_node_the_packer_planned_for_it(
        kube: LocalKubernetes, clock: FixedClock) -> None:
    """ml/node-efa.adoc's NCCL worker (8 GPUs, 32 EFAs, hugepages-2Mi 5120Mi, memory 32000Mi) on a p5.48xlarge of an
    `efa: true` pool: the packer plans it there, and the emulator's scheduler binds it and its kubelet runs it."""
    pool = NodePool(name="training", efa=True)
    limits = {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "hugepages-2Mi": "5120Mi", "memory": "32000Mi"}
    assert all(v <= allocatable(P5, pool, Overhead())[k] for k, v in Resources.from_quantities(limits).items())
    boot(kube, clock, SimulatedInstance.from_user_data("i-0aaa", P5_MACHINE, "us-east-1a", user_data(pool, P5)))
    kube.api.create(PODS, "default", {"metadata": {"name": "nccl-worker-0"}, "spec": {"containers": [
        {"name": "worker", "image": "nccl-tests", "resources": {"limits": limits, "requests": limits}}]}})
    kube.reconcile()
    assert kube.api.get(PODS, "default", "nccl-worker-0")["status"]["phase"] == "Running"


def test_without_an_efa_nothing_is_advertised_and_with_the_charts_default_values_not_on_a_gang_node(
        kube: LocalKubernetes, clock: FixedClock) -> None:
    """eks-charts aws-efa-k8s-device-plugin: `tolerations: []` by default (its pod template adds
    CriticalAddonsOnly), so a node tainted for a gang runs no plugin and never advertises its EFAs."""
    kube.efa_device_plugin.tolerations = chart_tolerations({})
    pool = NodePool(name="training", efa=True)
    plain = boot(kube, clock, SimulatedInstance.from_user_data(
        "i-0aaa", replace(P5_MACHINE, efa_devices=0), "us-east-1a", user_data(pool, P5)))
    gang = replace(SimulatedInstance.from_user_data("i-0bbb", P5_MACHINE, "us-east-1a", user_data(pool, P5)),
                   taints=(gang_taint("train-42"),))
    assert "vpc.amazonaws.com/efa" not in plain["status"]["allocatable"]
    assert "vpc.amazonaws.com/efa" not in boot(kube, clock, gang)["status"]["allocatable"]


@mock_aws
def test_an_instance_launched_on_ec2_joins_with_its_user_data_and_karpenters_label_values(
        kube: LocalKubernetes, clock: FixedClock) -> None:
    """Issue 15, fix 8: well-known labels carry Karpenter's values (GPU memory per GPU, kebab-case names)."""
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    template = ec2.create_launch_template(LaunchTemplateName="nodes", LaunchTemplateData={"ImageId": "ami-12c6146b"})
    pool = NodePool(name="gpu-burst")
    launched = ec2.create_fleet(Type="instant", TargetCapacitySpecification={
        "TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"}, LaunchTemplateConfigs=[{
            "LaunchTemplateSpecification": {
                "LaunchTemplateId": template["LaunchTemplate"]["LaunchTemplateId"], "Version": "$Latest",
                "LaunchTemplateSpecificationUserData": base64.b64encode(
                    user_data(pool, G5_12X).encode()).decode()},
            "Overrides": [{"InstanceType": "g5.12xlarge", "SubnetId": subnet["SubnetId"]}]}])
    instance_id = launched["Instances"][0]["InstanceIds"][0]

    class Launched:
        zone = "us-east-1a"
        capacity_type = "on-demand"
        private_dns_name = ""

    Launched.instance_id = instance_id  # type: ignore[attr-defined]
    KubeletNodeSide(kube, ec2).boot(Launched())
    kube.reconcile()
    [registered] = kube.objects("nodes")
    assert L.ZONE not in registered["metadata"]["labels"]
    clock.advance(timedelta(seconds=10))
    kube.reconcile()
    [node] = kube.objects("nodes")
    gpus = ec2.describe_instance_types(InstanceTypes=["g5.12xlarge"])["InstanceTypes"][0]["GpuInfo"]["Gpus"][0]
    labels = node["metadata"]["labels"]
    assert labels[L.INSTANCE_GPU_MEMORY] == str(gpus["MemoryInfo"]["SizeInMiB"])
    assert labels[L.INSTANCE_GPU_NAME] == "a10g" and labels[L.INSTANCE_GPU_COUNT] == str(gpus["Count"])
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node["status"]["capacity"]["cpu"] == "48"
    described = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    assert (labels[L.INSTANCE_TYPE], labels[L.ZONE]) == (described["InstanceType"],
                                                        described["Placement"]["AvailabilityZone"])


@mock_aws
def test_without_max_pods_or_reservations_the_eks_ami_defaults_apply() -> None:
    """nodeadm's defaults: max pods from the default network card's ENIs, kube-reserved from max pods and vCPUs."""
    from gpu_autoscaler.emulator.machines import describe_machine

    ec2 = boto3.client("ec2", region_name="us-east-1")
    reservation = ec2.run_instances(ImageId="ami-12c6146b", InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1)
    machine, _ = describe_machine(ec2, reservation["Instances"][0]["InstanceId"])
    bare = render_user_data(AL2023, node_setup(NodePool(name="gpu"), "on-demand", instance_type="p4d.24xlarge"))
    instance = SimulatedInstance.from_user_data("i-0aaa", machine, "us-east-1a", bare)
    assert instance.capacity["pods"] == 737
    reserved_memory = instance.capacity["memory"] - instance.allocatable["memory"]  # type: ignore[index]
    assert reserved_memory == (11 * 737 + 255) * 2**20 + 100 * 2**20  # kube-reserved + the eviction threshold
    assert instance.capacity["cpu"] - instance.allocatable["cpu"] == 310  # type: ignore[index]


@mock_aws
@pytest.mark.parametrize(("bootstrap", "expected_gib"), [(BOTTLEROCKET, 100), (AL2023, 4)])
def test_the_kubelets_ephemeral_storage_is_the_volume_its_os_keeps_containers_on(
        bootstrap: ClusterBootstrap, expected_gib: int) -> None:
    """Bottlerocket keeps container images and the kubelet's data on its data device (`/dev/xvdb`), not on the
    root device (`/dev/xvda`, the OS partitions: Bottlerocket README, Default Volumes); the EKS AL2023 AMI has
    one volume, the root device."""
    from gpu_autoscaler.emulator.machines import describe_machine

    ec2 = boto3.client("ec2", region_name="us-east-1")
    mappings: list[Any] = [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 4}},
                {"DeviceName": "/dev/xvdb", "Ebs": {"VolumeSize": 100}}]
    reservation = ec2.run_instances(ImageId="ami-12c6146b", InstanceType="g5.12xlarge", MinCount=1, MaxCount=1,
                                    BlockDeviceMappings=mappings)
    machine, _ = describe_machine(ec2, reservation["Instances"][0]["InstanceId"])
    data = render_user_data(bootstrap, node_setup(NodePool(name="gpu"), "on-demand", instance_type=G5_12X))
    instance = SimulatedInstance.from_user_data("i-0aaa", machine, "us-east-1a", data)
    # The filesystem on that volume: a little under its size (its metadata), far from the other volume's.
    assert 0.95 * expected_gib * 2**30 < instance.capacity["ephemeral-storage"] < expected_gib * 2**30


@pytest.mark.parametrize(("family", "volume_gib", "measured_kib"), [
    ("AL2023", 20, 20_959_212),
    ("Bottlerocket", 20, 20_624_592),
])
def test_the_kubelet_reports_no_more_ephemeral_storage_than_a_real_nodes_filesystem(
        family: str, volume_gib: int, measured_kib: int) -> None:
    """The kubelet's ephemeral-storage capacity is the size of the filesystem under its root directory (statfs), not
    the volume's. Measured: an EKS AMI's 20 GiB XFS root, 20,959,212 KiB (`df -k /`, awslabs/amazon-eks-ami PR
    #1126); a Bottlerocket 20 GiB ext4 data volume, `ephemeral-storage: 20624592Ki` (eksctl-io/eksctl #4434,
    bottlerocket-os/bottlerocket #1563). The emulator may report less (its mkfs model takes the larger of what
    the filesystem could use), never more, or a plan too optimistic would pass on it."""
    machine = Machine("g5.xlarge", vcpus=4, memory_mib=16384, root_volume_gib=volume_gib if family == "AL2023" else 4,
                      data_volume_gib=volume_gib if family == "Bottlerocket" else None)
    capacity, _ = node_resources(machine, KubeletSettings(os_family=family))
    assert 0.97 * volume_gib * 2**30 < capacity["ephemeral-storage"] <= measured_kib * 1024

"""Simulated kubelets and the minimal scheduler, stepped by hand on a fixed clock (no background controllers)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from kubernetes import client

from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.catalog import InstanceType
from gpu_autoscaler.models.taints import Taint
from tests import kube_reads
from tests.integration.kubernetes.conftest import functions_client, make_instance, make_pod, pod_condition

if TYPE_CHECKING:
    from collections.abc import Iterator


G5 = InstanceType(name="g5.2xlarge", vcpu=8, memory_mib=32768, gpus=1, gpu_devices=1, gpu_model="A10G",
                  gpu_manufacturer="NVIDIA", gpu_memory_mib=24576, max_pods=58)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(datetime(2026, 11, 22, 10, 0, tzinfo=UTC))


@pytest.fixture
def stepped(clock: FixedClock) -> Iterator[LocalKubernetes]:
    with LocalKubernetes(clock=clock, run_controllers=False, boot_delay=timedelta(seconds=45)) as kube:
        yield kube


@pytest.fixture
def core(stepped: LocalKubernetes) -> Iterator[client.CoreV1Api]:
    with stepped.client() as api:
        yield client.CoreV1Api(api)


def test_an_instance_registers_a_ready_node_after_its_boot_delay(
    stepped: LocalKubernetes, clock: FixedClock, core: client.CoreV1Api,
) -> None:
    instance = make_instance("i-0123456789abcdef0", zone="us-east-1b", labels={"team": "vision"})
    stepped.add_instance(instance)
    stepped.reconcile()
    assert core.list_node().items == []
    clock.advance(timedelta(seconds=45))
    stepped.reconcile()
    [node] = core.list_node().items
    assert kube_reads.name(node) == instance.name and kube_reads.name(node).endswith(".ec2.internal")
    assert kube_reads.node_spec(node).provider_id == "aws:///us-east-1b/i-0123456789abcdef0"
    labels = kube_reads.labels(node)
    assert labels[L.INSTANCE_TYPE] == "g5.2xlarge" and labels[L.ZONE] == "us-east-1b" and labels["team"] == "vision"
    assert [(t.key, t.value, t.effect) for t in kube_reads.taints(node)] == [("nvidia.com/gpu", "true", "NoSchedule")]
    with functions_client(stepped) as api:
        [seen] = KubernetesCluster(api).list_nodes()
    assert seen.ready and seen.instance_id == "i-0123456789abcdef0"


def test_a_terminated_instance_takes_its_node_and_pods(stepped: LocalKubernetes, core: client.CoreV1Api) -> None:
    stepped.add_instance(make_instance("i-0aaa"), boot_delay=timedelta(0))
    stepped.reconcile()
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("trainer")))
    stepped.reconcile()
    assert kube_reads.pod_status(core.read_namespaced_pod("trainer", "default")).phase == "Running"
    assert stepped.remove_instance("i-0aaa") and not stepped.remove_instance("i-0aaa")
    assert core.list_node().items == [] and core.list_pod_for_all_namespaces().items == []


def test_pods_bind_where_they_fit_and_the_rest_are_unschedulable_like_kube_scheduler(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    stepped.add_instance(make_instance("i-0aaa", gpus=1, labels={"workload": "inference"}), timedelta(0))
    stepped.add_instance(make_instance("i-0bbb", gpus=0, taints=()), timedelta(0))
    stepped.reconcile()
    gpu_node = make_instance("i-0aaa").name
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("fits", node_selector={"workload": "inference"})))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("too-big", gpus=2)))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("intolerant", tolerate_gpu=False)))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("elsewhere", affinity_terms=[{"matchExpressions": [
            {"key": L.ZONE, "operator": "In", "values": ["us-east-1c"]}]}])))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("cpu-only", gpus=None, tolerate_gpu=False)))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("gated", gates=["kueue.x-k8s.io/admission"])))
    result = stepped.reconcile()
    assert result.bound == {"default/fits": gpu_node, "default/cpu-only": make_instance("i-0bbb").name}
    assert kube_reads.pod_status(core.read_namespaced_pod("fits", "default")).phase == "Running"
    too_big = pod_condition(core, "too-big")
    assert too_big is not None and (too_big["status"], too_big["reason"]) == ("False", "Unschedulable")
    assert too_big["message"] == ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes "
                                  "are available: 2 Preemption is not helpful for scheduling.")
    intolerant = pod_condition(core, "intolerant")
    assert intolerant is not None and intolerant["message"].startswith(
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {nvidia.com/gpu: "
        "true}.")
    elsewhere = pod_condition(core, "elsewhere")
    assert elsewhere is not None and "2 node(s) didn't match Pod's node affinity/selector" in elsewhere["message"]
    gated = pod_condition(core, "gated")
    assert gated is not None and gated["reason"] == "SchedulingGated"

    version = kube_reads.metadata(core.read_namespaced_pod("too-big", "default")).resource_version
    stepped.reconcile()
    # written once
    assert kube_reads.metadata(core.read_namespaced_pod("too-big", "default")).resource_version == version


def test_cordoned_nodes_take_no_new_pods_and_new_capacity_takes_waiting_ones(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    stepped.add_instance(make_instance("i-0aaa", gpus=8), timedelta(0))
    stepped.reconcile()
    with functions_client(stepped) as api:
        KubernetesCluster(api).cordon(make_instance("i-0aaa").name, Taint(key="gpu-autoscaler/draining",
                                                                          value="true"))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("waiting", gpus=2)))
    stepped.reconcile()
    waiting = pod_condition(core, "waiting")
    assert waiting is not None and "1 node(s) were unschedulable" in waiting["message"]
    stepped.add_instance(make_instance("i-0bbb", gpus=2), timedelta(0))
    result = stepped.reconcile()
    assert result.bound == {"default/waiting": make_instance("i-0bbb").name}
    assert pod_condition(core, "waiting") == {"status": "True", "reason": None, "message": None}


def test_higher_priority_pods_are_placed_first_and_the_fullest_node_is_chosen(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    stepped.add_instance(make_instance("i-0aaa", gpus=4), timedelta(0))
    stepped.add_instance(make_instance("i-0bbb", gpus=2), timedelta(0))
    stepped.reconcile()
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("low", gpus=2, priority=0)))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("high", gpus=4, priority=100)))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("small", gpus=1, priority=50)))
    result = stepped.reconcile()
    assert result.bound == {"default/high": make_instance("i-0aaa").name,
                            "default/small": make_instance("i-0bbb").name}
    assert "default/low" in result.unschedulable


def test_a_coscheduling_gang_binds_all_together_or_not_at_all(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    with stepped.client() as api:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "scheduling.x-k8s.io", "v1alpha1", "default", "podgroups",
            {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "train"},
             "spec": {"minMember": 3}})
    stepped.add_instance(make_instance("i-0aaa", gpus=2), timedelta(0))
    stepped.reconcile()
    for i in range(3):
        core.create_namespaced_pod("default", client.V1Pod.model_validate(
            make_pod(f"train-{i}", labels={"scheduling.x-k8s.io/pod-group": "train"})))
    result = stepped.reconcile()
    assert result.bound == {}
    condition = pod_condition(core, "train-0")
    assert condition is not None and "needs 3 pods, and only 2 can be scheduled" in condition["message"]
    stepped.add_instance(make_instance("i-0bbb", gpus=1), timedelta(0))
    assert sorted(stepped.reconcile().bound) == ["default/train-0", "default/train-1", "default/train-2"]


def test_the_scheduler_scores_as_kube_schedulers_default_profile(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    """LeastAllocated spreads by default (GPU clusters that want packing configure MostAllocated); untolerated
    PreferNoSchedule taints and preferred node affinity steer among the nodes that fit."""
    stepped.add_instance(make_instance("i-0aaa", gpus=4), timedelta(0))
    stepped.add_instance(make_instance("i-0bbb", gpus=4), timedelta(0))
    stepped.reconcile()
    busy, idle = make_instance("i-0aaa").name, make_instance("i-0bbb").name
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("first", cpu="4", memory="8Gi", node_name=busy)))
    stepped.reconcile()
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("spread", cpu="1")))
    assert stepped.reconcile().bound == {"default/spread": idle}

    core.patch_node(idle, {"spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
                                               {"key": "example.com/spot", "effect": "PreferNoSchedule"}]}})
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("avoids-preferred-taint", cpu="100m")))
    assert stepped.reconcile().bound == {"default/avoids-preferred-taint": busy}

    preferring = make_pod("prefers", cpu="100m")
    preferring["spec"]["tolerations"].append({"key": "example.com/spot", "operator": "Exists"})
    preferring["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In",
                                                        "values": [idle]}]}}]}}
    core.create_namespaced_pod("default", client.V1Pod.model_validate(preferring))
    assert stepped.reconcile().bound == {"default/prefers": idle}


def test_init_containers_and_overhead_count_as_kube_scheduler_counts_them(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    stepped.add_instance(make_instance("i-0aaa", gpus=2), timedelta(0))
    stepped.reconcile()
    pod = make_pod("init-heavy", gpus=1)
    pod["spec"]["initContainers"] = [{"name": "warmup", "image": "warmup:1",
                                      "resources": {"limits": {"nvidia.com/gpu": "3"}}}]
    core.create_namespaced_pod("default", client.V1Pod.model_validate(pod))
    result = stepped.reconcile()
    assert "Insufficient nvidia.com/gpu" in result.unschedulable["default/init-heavy"]


def test_a_pod_goes_only_where_its_bound_volume_can_attach_like_volume_binding(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    # Node a is emptier than c (LeastAllocated prefers it): only the PV's node affinity keeps the reader off it.
    stepped.add_instance(make_instance("i-0aaa", zone="us-east-1a", gpus=2), timedelta(0))
    stepped.add_instance(make_instance("i-0ccc", zone="us-east-1c", gpus=2), timedelta(0))
    stepped.reconcile()
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("filler", cpu="4", node_selector={L.ZONE: "us-east-1c"})))
    stepped.reconcile()
    core.create_persistent_volume(client.V1PersistentVolume.model_validate({"metadata": {"name": "pv-c"}, "spec": {
        "capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
        "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0c"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1c"]}]}]}}}}))
    core.create_namespaced_persistent_volume_claim("default", client.V1PersistentVolumeClaim.model_validate({
        "metadata": {"name": "data"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3", "volumeName": "pv-c",
        "resources": {"requests": {"storage": "10Gi"}}}}))
    for name, claim in (("reader", "data"), ("orphan", "gone")):
        pod = make_pod(name)
        pod["spec"]["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]
        core.create_namespaced_pod("default", client.V1Pod.model_validate(pod))
    stepped.reconcile()

    reader = core.read_namespaced_pod("reader", "default")
    assert kube_reads.labels(core.read_node(kube_reads.bound_node(reader)))[L.ZONE] == "us-east-1c"
    assert kube_reads.pod_spec(core.read_namespaced_pod("orphan", "default")).node_name is None
    condition = pod_condition(core, "orphan")
    assert condition is not None and condition["message"] == 'persistentvolumeclaim "gone" not found'


def test_a_spread_on_the_node_counts_every_eligible_node_like_pod_topology_spread(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    # The CPU node b holds no replica and counts (no node selector: every node is a domain; its taints would not
    # matter either, nodeTaintsPolicy Ignore): the global minimum is 0, so the GPU node a takes maxSkew = 1.
    stepped.add_instance(make_instance("i-0aaa", gpus=4), timedelta(0))
    stepped.add_instance(make_instance("i-0bbb", gpus=0, taints=()), timedelta(0))
    stepped.reconcile()
    spread = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app": "llm"}}}]
    for name in ("llm-0", "llm-1"):
        pod = make_pod(name, labels={"app": "llm"})
        pod["spec"]["topologySpreadConstraints"] = spread
        core.create_namespaced_pod("default", client.V1Pod.model_validate(pod))
    result = stepped.reconcile()
    assert result.bound == {"default/llm-0": make_instance("i-0aaa").name}
    assert result.unschedulable["default/llm-1"].startswith(
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match pod topology spread "
        "constraints.")


def test_two_pods_on_one_host_port_never_share_a_node_like_node_ports(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    stepped.add_instance(make_instance("i-0aaa", gpus=4), timedelta(0))
    stepped.reconcile()
    for name, ports in (("web-0", [{"containerPort": 8000, "hostPort": 8000}]),
                        ("web-1", [{"containerPort": 8000, "hostPort": 8000, "hostIP": "10.0.0.1"}]),
                        ("dns", [{"containerPort": 8000, "hostPort": 8000, "protocol": "UDP"}])):
        pod = make_pod(name)
        pod["spec"]["containers"][0]["ports"] = ports
        core.create_namespaced_pod("default", client.V1Pod.model_validate(pod))
    result = stepped.reconcile()
    assert sorted(result.bound) == ["default/dns", "default/web-0"]
    assert result.unschedulable["default/web-1"].startswith(
        "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports.")


def test_anti_affinity_keeps_a_zone_to_one_pod_of_the_group_like_inter_pod_affinity(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    for instance, zone in (("i-0aaa", "us-east-1a"), ("i-0bbb", "us-east-1a"), ("i-0ccc", "us-east-1b")):
        stepped.add_instance(make_instance(instance, zone=zone, gpus=4), timedelta(0))
    stepped.reconcile()
    apart = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": L.ZONE, "labelSelector": {"matchLabels": {"app": "llm"}}, "namespaceSelector": {}}]}}
    core.create_namespace(client.V1Namespace.model_validate({"metadata": {"name": "team-b"}}))
    for name, namespace in (("llm-0", "default"), ("llm-1", "team-b"), ("llm-2", "default")):
        pod = make_pod(name, labels={"app": "llm"})
        pod["spec"]["affinity"] = apart
        core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod))
    result = stepped.reconcile()
    zones = sorted(kube_reads.labels(core.read_node(node))[L.ZONE] for node in result.bound.values())
    assert zones == ["us-east-1a", "us-east-1b"]
    [(late, message)] = result.unschedulable.items()
    assert message.startswith("0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules."), late


@pytest.mark.parametrize(("cpu_zone", "min_domains"), [("us-east-1c", None), (None, 3)])
def test_a_zone_spread_counts_zones_without_the_pod_and_min_domains_like_pod_topology_spread(
    stepped: LocalKubernetes, core: client.CoreV1Api, cpu_zone: str | None, min_domains: int | None,
) -> None:
    # Two GPU nodes in 1a and 1b: the least count is 0 in 1c (a CPU node, eligible: no selector) or below minDomains.
    for instance, zone in (("i-0aaa", "us-east-1a"), ("i-0bbb", "us-east-1b")):
        stepped.add_instance(make_instance(instance, zone=zone, gpus=4), timedelta(0))
    if cpu_zone:
        stepped.add_instance(make_instance("i-0ccc", zone=cpu_zone, gpus=0, taints=()), timedelta(0))
    stepped.reconcile()
    spread = {"maxSkew": 1, "topologyKey": L.ZONE, "whenUnsatisfiable": "DoNotSchedule",
              "labelSelector": {"matchLabels": {"app": "llm"}}}
    if min_domains:
        spread["minDomains"] = min_domains
    for name in ("llm-0", "llm-1", "llm-2"):
        pod = make_pod(name, labels={"app": "llm"})
        pod["spec"]["topologySpreadConstraints"] = [spread]
        core.create_namespaced_pod("default", client.V1Pod.model_validate(pod))
    result = stepped.reconcile()
    zones = sorted(kube_reads.labels(core.read_node(node))[L.ZONE] for node in result.bound.values())
    assert zones == ["us-east-1a", "us-east-1b"]
    [message] = result.unschedulable.values()
    assert "2 node(s) didn't match pod topology spread constraints" in message


def test_pod_affinity_binds_only_beside_the_pods_it_selects_like_inter_pod_affinity(
    stepped: LocalKubernetes, core: client.CoreV1Api,
) -> None:
    for instance, zone in (("i-0aaa", "us-east-1a"), ("i-0bbb", "us-east-1b")):
        stepped.add_instance(make_instance(instance, zone=zone, gpus=4, cpu="32", memory="128Gi"), timedelta(0))
    stepped.reconcile()
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("cache", gpus=None, labels={"app": "cache"}, node_selector={L.ZONE: "us-east-1b"})))
    stepped.reconcile()

    def beside(name: str, key: str, app: str, labels: dict[str, str] | None = None) -> None:
        pod = make_pod(name, labels=labels)
        pod["spec"]["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}}]}}
        core.create_namespaced_pod("default", client.V1Pod.model_validate(pod))

    beside("worker", "kubernetes.io/hostname", "cache")
    beside("orphan", L.ZONE, "absent")
    for name in ("job-0", "job-1", "job-2"):
        beside(name, L.ZONE, "job", labels={"app": "job"})
    result = stepped.reconcile()
    zone_of = {pod: kube_reads.labels(core.read_node(node))[L.ZONE] for pod, node in result.bound.items()}
    assert zone_of["default/worker"] == "us-east-1b"
    assert len({zone_of[f"default/job-{i}"] for i in range(3)}) == 1  # the first anywhere, the others follow it
    assert result.unschedulable["default/orphan"].startswith(
        "0/2 nodes are available: 2 node(s) didn't match pod affinity rules.")

"""Pods get the nodes they can use, on the emulator: a gang keeps its nodes, a pod gets a node where its volume is.

A gang's capacity goes to the gang: two 8-GPU members created together with three 1-GPU pods.

Without a hold, kube-scheduler binds the small pods into the first gang node to join; the gang (all or nothing)
no longer fits, waits another scheduling round and another boot, and a node ends up bought for nothing. With the
hold, the gang's nodes register tainted for the gang (their user data), the agent has the members tolerate it,
and takes it off once the gang is bound. Measured on the emulator's clock (wall time × speed).

Needs the emulator's kubelet to register Nodes with the taints of their user data (`--register-with-taints`),
as a real kubelet does: nothing here or in the emulator sets the gang taint.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.emulator.session import EmulatorSession
from gpu_autoscaler.models.labels import TAG_CLUSTER
from tests import kube_reads
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow

SPEED = 1.0
"""Real time: the pipeline's own latency (agent, queues, functions) counts in full against the budget."""
BOOT_SECONDS = 15.0
NS = "training"
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _pod(name: str, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {
        "tolerations": [TOLERATE_GPU], "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "trainer:1", "resources": {
            "requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}}]}}


@pytest.fixture(scope="module")
def session() -> Iterator[EmulatorSession]:
    data = example_config_data()
    data["scalingWindows"] = []  # nothing warm: every node is bought for these pods
    data["predictive"] = {**data.get("predictive", {}), "enabled": False}
    with EmulatorSession(parse_config(data), speed=SPEED, boot_delay=BOOT_SECONDS, poll_wait_seconds=1,
                         agent_resync_seconds=5) as running:
        yield running


def test_a_gang_created_with_small_pods_binds_after_one_boot_and_no_node_is_wasted(
    session: EmulatorSession,
) -> None:
    with session.kube.client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace.model_validate({"metadata": {"name": NS}}))
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "scheduling.x-k8s.io", "v1alpha1", NS, "podgroups",
            {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "train"},
             "spec": {"minMember": 2}})
        started = time.monotonic()
        for i in range(2):
            core.create_namespaced_pod(NS, client.V1Pod.model_validate(
                _pod(f"train-{i}", 8, {"scheduling.x-k8s.io/pod-group": "train"})))
        for i in range(3):
            core.create_namespaced_pod(NS, client.V1Pod.model_validate(_pod(f"small-{i}", 1)))

        budget = (BOOT_SECONDS + 60) / SPEED
        gang_bound: float | None = None
        deadline = started + budget + 30
        while time.monotonic() < deadline:
            pods = {kube_reads.name(p): kube_reads.pod_spec(p).node_name for p in core.list_namespaced_pod(NS).items}
            if gang_bound is None and pods["train-0"] and pods["train-1"]:
                gang_bound = time.monotonic() - started
            if gang_bound is not None and all(pods.values()):
                break
            time.sleep(0.1)
        assert gang_bound is not None, f"the gang was never bound: {pods}"
        assert all(pods.values()), f"not every pod was bound: {pods}"
        assert gang_bound * SPEED <= BOOT_SECONDS + 60, f"gang bound after {gang_bound * SPEED:.0f} emulated s"

        nodes = {kube_reads.name(n): n for n in core.list_node().items}
        used = set(pods.values())
        # What EC2 says is running for the cluster (claim tags are added just after a gang's launch, so the
        # emulator's snapshot of an instance taken at launch may not hold them yet).
        reservations = session.aws.clients.client("ec2").describe_instances(Filters=[
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [session.config.cluster_name]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"]
        launched = [i for r in reservations for i in r["Instances"]]
        assert len(launched) == len(nodes), "every instance launched has joined"
        assert set(nodes) == used, f"nodes launched and left unused: {sorted(set(nodes) - used)}"
        assert pods["train-0"] != pods["train-1"]
        assert not any(t.key == "gpu-autoscaler/gang" for n in core.list_node().items for t in kube_reads.taints(n))


def test_a_pod_with_a_zonal_volume_gets_a_node_in_the_volumes_zone(session: EmulatorSession) -> None:
    with session.kube.client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace.model_validate({"metadata": {"name": "data"}}))
        core.create_persistent_volume(client.V1PersistentVolume.model_validate({
            "metadata": {"name": "pv-features"}, "spec": {
            "capacity": {"storage": "500Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0feature"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1c"]}]}]}}}}))
        core.create_namespaced_persistent_volume_claim("data", client.V1PersistentVolumeClaim.model_validate({
            "metadata": {"name": "features"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3", "volumeName": "pv-features",
            "resources": {"requests": {"storage": "500Gi"}}}}))
        reader = _pod("reader", 1)
        reader["spec"]["volumes"] = [{"name": "features", "persistentVolumeClaim": {"claimName": "features"}}]
        core.create_namespaced_pod("data", client.V1Pod.model_validate(reader))

        def node() -> Any:
            name = kube_reads.pod_spec(core.read_namespaced_pod("reader", "data")).node_name
            return core.read_node(name) if name else None

        deadline = time.monotonic() + (BOOT_SECONDS + 60) / SPEED
        while (found := node()) is None:
            assert time.monotonic() < deadline, "the pod was never bound"
            time.sleep(0.2)
        assert kube_reads.labels(found)["topology.kubernetes.io/zone"] == "us-east-1c"

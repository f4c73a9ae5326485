"""VolumeAttachments and taints on the local API: the attach/detach controller keeps the attachments, the adapter
reads them, a drain terminates the instance only once its volumes are detached (issue 15 item 6), and the
adapter adds and removes consolidation's taint (item 5)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubernetes import client

from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.adapters.memory.queues import MemoryDrainQueue
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.drain import DRAIN_TAINT
from gpu_autoscaler.emulator.kube_storage import DETACH_TIME
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.messages import DrainRequest
from gpu_autoscaler.services.drain import DrainService
from tests.integration.kubernetes.conftest import functions_client, make_instance, make_pod, node_names, wait_for

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def _pod_with_volume(core: client.CoreV1Api, node: str, zone: str | None = None) -> None:
    """An EBS CSI volume (in `zone`: the node affinity the driver writes), its claim bound to it, and a pod on
    `node` using the claim."""
    affinity = {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": [zone]}]}]}}} if zone else {}
    core.create_persistent_volume(client.V1PersistentVolume.model_validate({"metadata": {"name": "pv-data"}, "spec": {
        "capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteOnce"],
        "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0abc"},
        "claimRef": {"namespace": "default", "name": "data"}, **affinity}}))
    core.create_namespaced_persistent_volume_claim("default", client.V1PersistentVolumeClaim.model_validate({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-data",
                 "resources": {"requests": {"storage": "100Gi"}}}}))
    pod = make_pod("db-0", node_name=node)
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    core.create_namespaced_pod("default", client.V1Pod.model_validate(pod))


def test_the_attach_detach_controller_attaches_a_pods_volume_and_detaches_it_once_the_pod_is_gone() -> None:
    clock = FixedClock(NOW)
    with LocalKubernetes(cluster_name="ml-prod", clock=clock) as kube, kube.client() as api:
        core, cluster = client.CoreV1Api(api), KubernetesCluster(functions_client(kube))
        kube.add_instance(make_instance())
        node = wait_for(lambda: node_names(core), what="node")[0]
        _pod_with_volume(core, node)
        (attachment,) = wait_for(lambda: cluster.volume_attachments(node), what="volume attached")
        assert attachment.persistent_volume == "pv-data" and attachment.claim == "default/data"
        assert attachment.name.startswith("csi-")
        assert cluster.volume_attachments("another-node") == []
        core.delete_namespaced_pod("db-0", "default")
        wait_for(lambda: kube.objects("volumeattachments")[0]["metadata"].get("deletionTimestamp"), what="detaching")
        assert len(cluster.volume_attachments(node)) == 1  # still attached while the driver detaches
        clock.advance(DETACH_TIME)
        wait_for(lambda: cluster.volume_attachments(node) == [], what="volume detached")


def test_the_functions_read_the_zone_a_bound_pods_volume_attaches_in() -> None:
    """With the shipped role (it lists claims and volumes), the adapter gives a bound pod the zones its volume
    attaches in, which its replacement or its move must keep."""
    with LocalKubernetes(cluster_name="ml-prod", clock=FixedClock(NOW)) as kube, kube.client() as api:
        core, cluster = client.CoreV1Api(api), KubernetesCluster(functions_client(kube))
        kube.add_instance(make_instance())
        node = wait_for(lambda: node_names(core), what="node")[0]
        _pod_with_volume(core, node, zone="us-east-1a")
        (pod,) = cluster.list_pods(node)
        assert pod.volume_claims == ("data",) and pod.volume_zones == ("us-east-1a",)


def test_a_drain_terminates_the_instance_only_once_its_volumes_are_detached() -> None:
    """The volume takes DETACH_TIME to detach after its pod is gone: the drain waits for it, then terminates."""
    clock = FixedClock(NOW)
    with LocalKubernetes(cluster_name="ml-prod", clock=clock) as kube, kube.client() as api:
        core, cluster = client.CoreV1Api(api), KubernetesCluster(functions_client(kube))
        kube.add_instance(make_instance())
        node = wait_for(lambda: node_names(core), what="node")[0]
        _pod_with_volume(core, node)
        wait_for(lambda: cluster.volume_attachments(node), what="volume attached")
        _drain(kube, cluster, clock, node)


def _drain(kube: LocalKubernetes, cluster: KubernetesCluster, clock: FixedClock, node: str) -> None:
    store = MemoryStateStore("ml-prod", clock)
    store.create_claim(NodeClaim(cluster="ml-prod", id="c-1", pool="gpu", capacity_type="on-demand",
                                 zones=("us-east-1a",), instance_types=("g5.2xlarge",), price_per_hour=1.2,
                                 created_at=NOW - timedelta(hours=1), state=ClaimState.REGISTERED,
                                 instance_id="i-0aaa", instance_type="g5.2xlarge", zone="us-east-1a", node_name=node))
    attached_at_termination: list[int] = []

    class Fleet:
        def terminate(self, claim: NodeClaim, reason: str) -> object:
            attached_at_termination.append(len(kube.objects("volumeattachments")))
            return store.transition(store.get_claim(claim.id) or claim, ClaimState.TERMINATED, reason)

        def instance_gone(self, claim: NodeClaim) -> bool:
            return True

    def sleep(seconds: float) -> None:
        clock.advance(timedelta(seconds=seconds))
        kube.reconcile()  # the controllers act meanwhile: the pod goes, then its volume is detached

    drainer = DrainService("ml-prod", store, cluster, Fleet(), MemoryDrainQueue(clock), clock=clock, sleep=sleep)
    request = DrainRequest(cluster="ml-prod", node_name=node, instance_id="i-0aaa", claim_id="c-1", reason="drift",
                           deadline=NOW + timedelta(minutes=10))
    outcome = drainer.drain(request, budget=timedelta(minutes=2))
    assert outcome.status == "finished" and outcome.evicted == ["default/db-0"]
    assert attached_at_termination == [0] and clock.now() >= NOW + DETACH_TIME


def test_consolidations_taint_keeps_new_pods_off_and_comes_off_again(
        core: client.CoreV1Api, kube: LocalKubernetes, cluster: KubernetesCluster) -> None:
    """The disrupted taint through the adapter: other taints kept, the node schedulable for tolerating pods."""
    kube.add_instance(make_instance())
    node = wait_for(lambda: node_names(core), what="node")[0]
    cluster.taint(node, DRAIN_TAINT)
    cluster.taint(node, DRAIN_TAINT)  # once only
    seen = next(n for n in cluster.list_nodes() if n.name == node)
    assert [t.key for t in seen.taints].count(DRAIN_TAINT.key) == 1 and not seen.unschedulable
    assert len(seen.taints) == 2  # the GPU taint is still there
    cluster.untaint(node, DRAIN_TAINT)
    cluster.untaint("gone-node", DRAIN_TAINT)  # a node already gone is no error
    assert DRAIN_TAINT not in next(n for n in cluster.list_nodes() if n.name == node).taints


def test_consolidations_untaint_leaves_the_taint_of_a_node_cordoned_on_its_fresh_read(
        core: client.CoreV1Api, kube: LocalKubernetes, cluster: KubernetesCluster) -> None:
    """Consolidation decides from a list read seconds before; a drain cordoning meanwhile owns the
    taint (`is_drained_by_us`), so `unless_cordoned` reads the node again and leaves it (Karpenter's
    RequireNoScheduleTaint leaves a node the termination controller owns). The patch carries the read's
    resourceVersion: a cordon between the read and the write is a 409, read again."""
    kube.add_instance(make_instance())
    node = wait_for(lambda: node_names(core), what="node")[0]
    cluster.taint(node, DRAIN_TAINT)
    cluster.cordon(node, DRAIN_TAINT)
    cluster.untaint(node, DRAIN_TAINT, unless_cordoned=True)
    seen = next(n for n in cluster.list_nodes() if n.name == node)
    assert seen.unschedulable and DRAIN_TAINT in seen.taints
    core.patch_node(node, {"spec": {"unschedulable": False}})
    cluster.untaint(node, DRAIN_TAINT, unless_cordoned=True)
    assert DRAIN_TAINT not in next(n for n in cluster.list_nodes() if n.name == node).taints

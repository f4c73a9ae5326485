"""Evictions against PodDisruptionBudgets, DaemonSet pods, and deletions — through `KubernetesCluster`."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests import kube_reads
from tests.integration.kubernetes.conftest import make_budget, make_instance, make_pod, node_names, wait_for

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
    from gpu_autoscaler.models.cluster import ClusterPod


def _running(core: client.CoreV1Api, *names: str) -> None:
    for name in names:
        def running(n: str = name) -> bool:
            return kube_reads.pod_status(core.read_namespaced_pod(n, "default")).phase == "Running"

        wait_for(running, what=f"{name} running")


def _pod(cluster: KubernetesCluster, name: str) -> ClusterPod:
    return next(p for p in cluster.list_pods() if p.name == name)


def test_an_eviction_blocked_by_a_budget_is_429_until_the_budget_allows_it(
    core: client.CoreV1Api, kube: LocalKubernetes, cluster: KubernetesCluster, api: client.ApiClient,
) -> None:
    kube.add_instance(make_instance(gpus=4))
    for name in ("web-0", "web-1"):
        core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod(name, labels={"app": "web"})))
    _running(core, "web-0", "web-1")
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", make_budget("web", {"matchLabels": {"app": "web"}}, minAvailable=2))
    outcome = cluster.evict(_pod(cluster, "web-0"))
    assert (outcome.evicted, outcome.blocked, outcome.gone) == (False, True, False)
    assert "needs 2 healthy pods and has 2 currently" in outcome.message

    with pytest.raises(ApiException) as raw:  # the Status body, as the real API server writes it
        core.create_namespaced_pod_eviction("web-0", "default",
                                            client.V1Eviction.model_validate({"metadata": {"name": "web-0"}}))
    status = kube_reads.refusal(raw.value)
    assert (raw.value.status, status["reason"], status["details"]["causes"][0]["reason"]) == (
        429, "TooManyRequests", "DisruptionBudget")

    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("web-2", labels={"app": "web"})))  # a replacement comes up
    _running(core, "web-2")
    assert cluster.evict(_pod(cluster, "web-0")).evicted  # terminating; gone once its kubelet has stopped it
    wait_for(lambda: sorted(p.name for p in cluster.list_pods()) == ["web-1", "web-2"], what="web-0 gone")
    assert cluster.evict(_pod(cluster, "web-1")).blocked  # the budget is spent again
    wait_for(lambda: kube_reads.disruptions_allowed(
        client.PolicyV1Api(api).read_namespaced_pod_disruption_budget("web", "default")) == 0, what="budget status")


def test_a_percentage_budget_and_a_pending_pod(core: client.CoreV1Api, kube: LocalKubernetes,
                                               cluster: KubernetesCluster, api: client.ApiClient) -> None:
    kube.add_instance(make_instance(gpus=4))
    for name in ("a", "b", "c", "d"):
        core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod(name, labels={"app": "batch"})))
    _running(core, "a", "b", "c", "d")
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("queued", labels={"app": "batch"}, gpus=8)))
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", make_budget("batch", {"matchLabels": {"app": "batch"}}, maxUnavailable="50%"))
    # 5 selected, 50 % rounds up to 3 unavailable, so 2 must stay healthy: 4 healthy allow 2 evictions.
    assert [cluster.evict(_pod(cluster, n)).evicted for n in ("a", "b", "c")] == [True, True, False]
    assert cluster.evict(_pod(cluster, "queued")).evicted  # Pending pods are evicted without a budget check


def test_a_pod_already_gone_or_replaced_under_its_name_is_reported_gone(
    core: client.CoreV1Api, cluster: KubernetesCluster,
) -> None:
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("p")))
    old = _pod(cluster, "p")
    core.delete_namespaced_pod("p", "default")
    assert cluster.evict(old).gone
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("p")))  # same name, new uid
    assert cluster.evict(old).gone
    cluster.delete_pod(old)  # only the old uid may be deleted: the new pod stays
    assert [p.name for p in cluster.list_pods()] == ["p"]
    cluster.delete_pod(_pod(cluster, "p"))
    assert cluster.list_pods() == []


def test_daemonset_pods_run_on_every_eligible_node_and_are_owned_by_it(
    core: client.CoreV1Api, kube: LocalKubernetes, cluster: KubernetesCluster, api: client.ApiClient,
) -> None:
    kube.add_instance(make_instance("i-0aaa"))
    kube.add_instance(make_instance("i-0bbb"))
    kube.add_instance(make_instance("i-0ccc", labels={"role": "cpu"}, taints=(), gpus=0))
    wait_for(lambda: len(node_names(core)) == 3, what="three nodes")
    template = {"metadata": {"labels": {"app": "dcgm"}},
                "spec": {"containers": [{"name": "exporter", "image": "dcgm:3",
                                         "resources": {"requests": {"cpu": "100m"}}}],
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [
                                 {"key": "role", "operator": "DoesNotExist"}]}]}}}}}
    apps = client.AppsV1Api(api)
    apps.create_namespaced_daemon_set("default", client.V1DaemonSet.model_validate({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "dcgm"},
        "spec": {"selector": {"matchLabels": {"app": "dcgm"}}, "template": template}}))
    gpu_nodes = [make_instance("i-0aaa").name, make_instance("i-0bbb").name]

    def daemon_pods() -> list[ClusterPod]:
        return [p for p in cluster.list_pods() if p.owner_kind == "DaemonSet" and p.phase == "Running"]

    wait_for(lambda: len(daemon_pods()) == 2, what="two daemon pods running")
    assert sorted((p.node_name for p in daemon_pods()), key=str) == sorted(gpu_nodes)  # key: an unbound one fails
    assert [p.name for p in cluster.list_pods(gpu_nodes[0])] == [
        p.name for p in daemon_pods() if p.node_name == gpu_nodes[0]]
    def all_ready() -> bool:
        status = apps.read_namespaced_daemon_set("dcgm", "default").status
        return status is not None and status.number_ready == 2

    wait_for(all_ready, what="DaemonSet status")

    kube.remove_instance("i-0aaa")  # the node goes, and its daemon pod with it
    wait_for(lambda: [p.node_name for p in daemon_pods()] == [gpu_nodes[1]], what="pod gone with its node")
    apps.delete_namespaced_daemon_set("dcgm", "default")  # garbage collection through ownerReferences
    assert wait_for(lambda: not daemon_pods(), what="daemon pods collected")


def test_delete_node_removes_it_and_its_pods(core: client.CoreV1Api, kube: LocalKubernetes,
                                             cluster: KubernetesCluster) -> None:
    kube.add_instance(make_instance())
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("p")))
    _running(core, "p")
    name = node_names(core)[0]
    cluster.delete_node(name)
    cluster.delete_node(name)  # already gone: not an error
    assert cluster.list_nodes() == [] and cluster.list_pods() == []


def test_pods_are_deleted_gracefully_and_finalizers_hold_pods_and_nodes(
    core: client.CoreV1Api, kube: LocalKubernetes,
) -> None:
    kube.kubelets.container_stop_time = timedelta(seconds=30)  # containers that take their time to exit
    instance = make_instance(gpus=4)
    kube.add_instance(instance)
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("slow")))
    core.create_namespaced_pod("default", client.V1Pod.model_validate({**make_pod("held"), "metadata": {
        "name": "held", "finalizers": ["example.com/keep"]}}))
    _running(core, "slow", "held")

    core.delete_namespaced_pod("slow", "default", grace_period_seconds=20)
    terminating = core.read_namespaced_pod("slow", "default")
    assert kube_reads.metadata(terminating).deletion_timestamp is not None
    assert kube_reads.metadata(terminating).deletion_grace_period_seconds == 20
    core.delete_namespaced_pod("slow", "default", grace_period_seconds=60)  # a longer grace never extends it
    assert kube_reads.metadata(core.read_namespaced_pod("slow", "default")).deletion_grace_period_seconds == 20
    core.delete_namespaced_pod("slow", "default", grace_period_seconds=0)  # forced: gone at once
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("slow", "default")
    assert missing.value.status == 404

    core.delete_namespaced_pod("held", "default", grace_period_seconds=0)
    assert kube_reads.metadata(core.read_namespaced_pod("held", "default")).deletion_timestamp is not None
    core.patch_namespaced_pod("held", "default", {"metadata": {"finalizers": None}})
    wait_for(lambda: not any(kube_reads.name(p) == "held" for p in core.list_namespaced_pod("default").items),
             what="held gone once its finalizer is removed")

    core.patch_node(instance.name, {"metadata": {"finalizers": ["karpenter.sh/termination"]}})
    core.delete_node(instance.name)
    assert kube_reads.metadata(core.read_node(instance.name)).deletion_timestamp is not None
    core.patch_node(instance.name, {"metadata": {"finalizers": None}})
    wait_for(lambda: not core.list_node().items, what="node gone once its finalizer is removed")


def test_an_unscheduled_pod_is_deleted_at_once(core: client.CoreV1Api, kube: LocalKubernetes) -> None:
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("nowhere", gpus=64)))
    core.delete_namespaced_pod("nowhere", "default")
    assert core.list_namespaced_pod("default").items == []


def test_a_pod_under_two_budgets_is_refused_as_blocked_not_failed(
    core: client.CoreV1Api, kube: LocalKubernetes, cluster: KubernetesCluster, api: client.ApiClient,
) -> None:
    """The eviction subresource answers 500 for a pod more than one budget selects; Karpenter's eviction queue
    takes that answer as it takes a 429 (the pod is retried, the drain goes on), so a drain — an involuntary one
    whose deadline ends it, or one with a terminationGracePeriod — is not failed by it."""
    kube.add_instance(make_instance(gpus=4))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("web-0", labels={"app": "web", "tier": "gold"})))
    _running(core, "web-0")
    for name, selector in (("web", {"app": "web"}), ("gold", {"tier": "gold"})):
        client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
            "default", make_budget(name, {"matchLabels": selector}, maxUnavailable=1))
    outcome = cluster.evict(_pod(cluster, "web-0"))
    assert (outcome.evicted, outcome.blocked, outcome.gone) == (False, True, False)
    assert "more than one PodDisruptionBudget" in outcome.message


def test_an_eviction_in_a_terminating_namespace_is_refused_for_that_cause_and_taken_as_blocked(
    core: client.CoreV1Api, kube: LocalKubernetes, cluster: KubernetesCluster,
) -> None:
    """The NamespaceLifecycle admission plugin refuses every create in a namespace being deleted, an Eviction
    included: 403 Forbidden with the cause `NamespaceTerminating` (k8s.io/apiserver
    pkg/admission/plugin/namespace/lifecycle/admission.go). kubectl's drain retries such a pod until the namespace
    controller has deleted it (k8s.io/kubectl pkg/drain/drain.go, `evictPods`): a blocked eviction, not refused
    access."""
    kube.add_instance(make_instance(gpus=4))
    core.create_namespace(client.V1Namespace.model_validate(
        {"metadata": {"name": "team-a", "finalizers": ["example.com/hold"]}}))  # held: it stays terminating
    core.create_namespaced_pod("team-a", client.V1Pod.model_validate(make_pod("infer-0")))
    wait_for(lambda: kube_reads.pod_status(core.read_namespaced_pod("infer-0", "team-a")).phase == "Running",
             what="infer-0 running")
    core.delete_namespace("team-a")
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("team-a", client.V1Pod.model_validate(make_pod("late")))
    status = kube_reads.refusal(refused.value)
    assert refused.value.status == 403 and status["reason"] == "Forbidden"
    assert [c["reason"] for c in status["details"]["causes"]] == ["NamespaceTerminating"]
    assert "because it is being terminated" in status["message"]
    outcome = cluster.evict(_pod(cluster, "infer-0"))
    assert (outcome.evicted, outcome.blocked, outcome.gone) == (False, True, False)
    assert "being terminated" in outcome.message


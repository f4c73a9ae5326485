"""The local Kubernetes API through the real client: discovery, reads, selectors, writes, concurrency, access."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from tests import kube_reads
from tests.integration.kubernetes.conftest import make_instance, make_pod, node_names, wait_for

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster


def test_discovery_names_the_groups_and_resources_clients_look_for(api: client.ApiClient) -> None:
    assert client.VersionApi(api).get_code().major == "1"
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    groups: dict[str, str | None] = {}
    for group in client.ApisApi(api).get_api_versions().groups:
        assert group.preferred_version is not None, group.name  # what a client picks the version to use from
        groups[group.name] = group.preferred_version.group_version
    assert groups.items() >= {"apps": "apps/v1", "policy": "policy/v1",
                              "scheduling.x-k8s.io": "scheduling.x-k8s.io/v1alpha1",
                              "storage.k8s.io": "storage.k8s.io/v1", "resource.k8s.io": "resource.k8s.io/v1"}.items()
    core = {r.name for r in client.CoreV1Api(api).get_api_resources().resources}
    assert {"nodes", "pods", "pods/eviction", "pods/status", "pods/binding"} <= core
    policy = {r.name: r.kind for r in client.PolicyV1Api(api).get_api_resources().resources}
    assert policy["poddisruptionbudgets"] == "PodDisruptionBudget"


def test_the_kubeconfig_it_writes_connects_with_its_token(kube: LocalKubernetes) -> None:
    kube.add_instance(make_instance())
    with config.new_client_from_config(config_file=str(kube.kubeconfig_path)) as api_client:
        core = client.CoreV1Api(api_client)
        assert wait_for(lambda: node_names(core), what="node") == [make_instance().name]
    document = json.loads(kube.kubeconfig_path.read_text())
    assert document["clusters"][0]["cluster"]["server"] == kube.url.replace("http://", "https://")
    assert document["users"][0]["user"]["token"] == kube.token


def test_a_wrong_token_is_unauthorized_and_no_token_is_an_anonymous_user_rbac_forbids() -> None:
    with LocalKubernetes() as kube:
        with kube.client() as good, kube.client(token="not-the-token") as bad:
            assert client.CoreV1Api(good).list_node().items == []
            with pytest.raises(ApiException) as refused:
                client.CoreV1Api(bad).list_node()
            assert refused.value.status == 401
        anonymous = client.Configuration()
        anonymous.host = kube.url
        with client.ApiClient(anonymous) as nobody, pytest.raises(ApiException) as missing:
            client.CoreV1Api(nobody).list_node()
        assert missing.value.status == 403
        assert 'User "system:anonymous" cannot list' in json.loads(missing.value.body or "{}")["message"]


def test_label_and_field_selectors_filter_lists(core: client.CoreV1Api, kube: LocalKubernetes) -> None:
    kube.add_instance(make_instance())
    node = wait_for(lambda: node_names(core), what="node")[0]
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("web-1", labels={"app": "web", "tier": "a"})))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("web-2", labels={"app": "web", "tier": "b"}, gpus=4)))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(
        make_pod("db-1", labels={"app": "db"}, gpus=None)))
    wait_for(lambda: kube_reads.pod_status(core.read_namespaced_pod("web-1", "default")).phase == "Running",
             what="web-1 running")

    def names(label_selector: str | None = None, field_selector: str | None = None) -> list[str]:
        listed = core.list_namespaced_pod("default", label_selector=label_selector, field_selector=field_selector)
        return sorted(kube_reads.name(p) for p in listed.items)

    assert names(label_selector="app=web") == ["web-1", "web-2"]
    assert names(label_selector="app in (web,db),tier!=b") == ["db-1", "web-1"]
    assert names(label_selector="!tier") == ["db-1"]
    assert names(field_selector=f"spec.nodeName={node}") == sorted(
        p for p in ("db-1", "web-1") if kube_reads.pod_spec(core.read_namespaced_pod(p, "default")).node_name == node)
    assert names(field_selector="spec.nodeName=,status.phase!=Succeeded") == ["web-2"]
    assert names(field_selector="status.phase=Running") == ["db-1", "web-1"]
    assert [kube_reads.name(n) for n in core.list_node(field_selector="spec.unschedulable=false").items] == [node]
    with pytest.raises(ApiException) as refused:
        core.list_namespaced_pod("default", field_selector="spec.containers=x")
    assert refused.value.status == 400
    assert "field label not supported" in kube_reads.refusal(refused.value)["message"]


def test_lists_page_with_limit_and_continue(core: client.CoreV1Api) -> None:
    for i in range(7):
        core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod(f"p-{i}", gpus=None)))
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        page = core.list_namespaced_pod("default", limit=3, _continue=token)
        seen += [kube_reads.name(p) for p in page.items]
        pages += 1
        assert page.metadata is not None  # every list has one
        token = page.metadata._continue
        if not token:
            break
    assert pages == 3
    assert seen == [f"p-{i}" for i in range(7)]


def test_create_generates_names_and_refuses_duplicates(core: client.CoreV1Api) -> None:
    made = core.create_namespaced_pod("default", client.V1Pod.model_validate({"metadata": {"generateName": "job-"},
                                                  "spec": {"containers": [{"name": "c", "image": "x"}]}}))
    assert kube_reads.name(made).startswith("job-") and len(kube_reads.name(made)) == len("job-") + 5
    assert kube_reads.uid(made) and kube_reads.pod_status(made).phase == "Pending"
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("once")))
    with pytest.raises(ApiException) as duplicate:
        core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("once")))
    assert duplicate.value.status == 409
    assert kube_reads.refusal(duplicate.value)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as invalid:
        core.create_namespaced_pod("default", client.V1Pod.model_validate(
            {"metadata": {"name": "empty"}, "spec": {"containers": []}}))
    assert invalid.value.status == 422


def test_patches_in_each_format_the_client_sends(core: client.CoreV1Api, kube: LocalKubernetes) -> None:
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("p", labels={"a": "1", "b": "2"})))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": None, "c": "3"}}})  # strategic merge
    assert kube_reads.metadata(core.read_namespaced_pod("p", "default")).labels == {"b": "2", "c": "3"}
    core.patch_namespaced_pod("p", "default", [{"op": "add", "path": "/metadata/labels/d", "value": "4"},
                                               {"op": "remove", "path": "/metadata/labels/b"}])  # JSON patch
    assert kube_reads.metadata(core.read_namespaced_pod("p", "default")).labels == {"c": "3", "d": "4"}
    core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"x": "y"}}},
                              _content_type="application/merge-patch+json")
    assert kube_reads.metadata(core.read_namespaced_pod("p", "default")).annotations == {"x": "y"}
    # Strategic merge merges named lists by key: one container patched, none lost.
    core.patch_namespaced_pod("p", "default", {"spec": {"containers": [{"name": "main", "image": "trainer:2"}]}})
    containers = kube_reads.pod_spec(core.read_namespaced_pod("p", "default")).containers
    assert [(c.name, c.image, c.resources.limits if c.resources else None) for c in containers] == [
        ("main", "trainer:2", {"nvidia.com/gpu": "1"})]
    with pytest.raises(ApiException) as failed_test:
        core.patch_namespaced_pod("p", "default", [{"op": "test", "path": "/metadata/labels/c", "value": "9"}])
    assert failed_test.value.status == 422


def test_pods_are_defaulted_and_refused_as_a_real_api_server_does(core: client.CoreV1Api) -> None:
    """Requests defaulted from limits; a GPU request without a limit and a changed node selector refused (422)."""
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("p")))
    container = kube_reads.pod_spec(core.read_namespaced_pod("p", "default")).containers[0]
    assert container.resources is not None and container.resources.requests == {
        "cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
    gpu_requested = make_pod("q")
    gpu_requested["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("default", client.V1Pod.model_validate(gpu_requested))
    assert refused.value.status == 422 and "Limit must be set for non overcommitable resources" in str(
        refused.value.body)
    with pytest.raises(ApiException) as immutable:
        core.patch_namespaced_pod("p", "default", {"spec": {"nodeSelector": {"a": "b"}}})
    assert immutable.value.status == 422 and "pod updates may not change fields other than" in str(
        immutable.value.body)


def test_status_is_written_through_its_subresource_only(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("p")))
    core.patch_namespaced_pod("p", "default", {"status": {"phase": "Failed"}, "metadata": {"labels": {"x": "1"}}})
    pod = core.read_namespaced_pod("p", "default")
    assert kube_reads.pod_status(pod).phase == "Pending" and kube_reads.metadata(pod).labels == {"x": "1"}
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Succeeded"},
                                                      "metadata": {"labels": {"y": "2"}}})
    pod = core.read_namespaced_pod("p", "default")
    assert kube_reads.pod_status(pod).phase == "Succeeded" and kube_reads.metadata(pod).labels == {"x": "1"}


def test_stale_writes_conflict_and_no_op_writes_keep_the_version(core: client.CoreV1Api) -> None:
    quiet = make_pod("p")
    quiet["spec"]["schedulerName"] = "nobody"  # no scheduler writes its conditions between our reads and writes
    created = core.create_namespaced_pod("default", client.V1Pod.model_validate(quiet))
    stale = kube_reads.metadata(created).resource_version
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"v": "2"}}})
    body = core.read_namespaced_pod("p", "default").to_dict()
    body["metadata"]["resourceVersion"] = stale
    body["metadata"]["labels"] = {"v": "3"}
    replacement = client.V1Pod.from_dict(body)
    assert replacement is not None  # from a dict, never None
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_pod("p", "default", replacement)
    assert conflict.value.status == 409
    current = kube_reads.metadata(core.read_namespaced_pod("p", "default")).resource_version
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"v": "2"}}})
    assert kube_reads.metadata(core.read_namespaced_pod("p", "default")).resource_version == current
    with pytest.raises(ApiException) as precondition:
        core.delete_namespaced_pod("p", "default", body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid="someone-else")))
    assert precondition.value.status == 409
    core.delete_namespaced_pod("p", "default")
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod("p", "default")
    assert gone.value.status == 404
    assert kube_reads.refusal(gone.value)["reason"] == "NotFound"


def test_cordon_sets_unschedulable_and_adds_the_taint_once(
    core: client.CoreV1Api, kube: LocalKubernetes, cluster: KubernetesCluster,
) -> None:
    from gpu_autoscaler.models.taints import Taint

    kube.add_instance(make_instance())
    name = wait_for(lambda: node_names(core), what="node")[0]
    ours = Taint(key="gpu-autoscaler/draining", value="true", effect="NoSchedule")
    cluster.cordon(name, ours)
    version = kube_reads.metadata(core.read_node(name)).resource_version
    cluster.cordon(name, ours)
    node = core.read_node(name)
    assert kube_reads.node_spec(node).unschedulable is True
    assert [(t.key, t.value, t.effect) for t in kube_reads.taints(node)] == [
        ("nvidia.com/gpu", "true", "NoSchedule"), ("gpu-autoscaler/draining", "true", "NoSchedule")]
    assert kube_reads.metadata(node).resource_version == version  # the second cordon changed nothing
    listed = {n.name: n for n in cluster.list_nodes()}[name]
    assert listed.unschedulable and ours in listed.taints and listed.ready


def test_cordon_takes_the_node_out_of_external_load_balancers_and_untaint_puts_back_only_ours(
    core: client.CoreV1Api, kube: LocalKubernetes, cluster: KubernetesCluster,
) -> None:
    """The service controller and the AWS Load Balancer Controller drop a node for this label, not for
    `spec.unschedulable` or our taint (kubernetes/cloud-provider controllers/service/controller.go
    `nodeIncludedPredicate`); Karpenter's terminator sets it with its taint (terminator.go)."""
    from gpu_autoscaler.domain.drain import DRAIN_TAINT, LOAD_BALANCER_EXCLUSION

    key, ours = LOAD_BALANCER_EXCLUSION
    kube.add_instance(make_instance())
    name = wait_for(lambda: node_names(core), what="node")[0]
    cluster.cordon(name, DRAIN_TAINT)
    assert (kube_reads.metadata(core.read_node(name)).labels or {}).get(key) == ours
    cluster.untaint(name, DRAIN_TAINT)
    assert key not in (kube_reads.metadata(core.read_node(name)).labels or {})
    core.patch_node(name, {"metadata": {"labels": {key: "true"}}})  # the operator's own, before ours
    cluster.cordon(name, DRAIN_TAINT)
    cluster.untaint(name, DRAIN_TAINT)
    labels = kube_reads.metadata(core.read_node(name)).labels or {}
    assert labels.get(key) == "true"  # not ours to remove (NTH's removeLabelIfValueMatches)


def test_a_restart_drops_connections_and_keeps_objects(core: client.CoreV1Api, kube: LocalKubernetes) -> None:
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("kept")))
    port = kube.port
    kube.restart()
    assert kube.port == port
    assert [kube_reads.name(p) for p in core.list_namespaced_pod("default").items] == ["kept"]

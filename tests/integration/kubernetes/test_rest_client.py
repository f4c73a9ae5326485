"""The functions' small Kubernetes client against the local Kubernetes API (real HTTP): what it sends is what
the server reads (paths, selectors, pages, patch types, DeleteOptions, the bearer token), and every error
status reaches the caller as the status the server answered (issue 17)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.adapters.kubernetes.rest import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    KubernetesHttpError,
    KubernetesRest,
    path,
)
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from gpu_autoscaler.errors import KubernetesApiError
from tests.integration.kubernetes.conftest import make_instance, make_pod, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

NODES = path("api", "v1", "nodes")
PODS = path("api", "v1", "namespaces", "default", "pods")
BUDGETS = path("apis", "policy", "v1", "namespaces", "default", "poddisruptionbudgets")


@pytest.fixture
def rest(kube: LocalKubernetes) -> Iterator[KubernetesRest]:
    with KubernetesRest(kube.url, authorization=lambda: f"Bearer {kube.token}") as small:
        yield small


def _raw(item: dict[str, Any]) -> dict[str, Any]:
    return item


def _node(rest: KubernetesRest, kube: LocalKubernetes) -> str:
    kube.add_instance(make_instance())
    [node] = wait_for(lambda: rest.list_items(NODES, _raw), what="node")
    name: str = node["metadata"]["name"]
    return name


def _running(rest: KubernetesRest, *names: str) -> None:
    def running(name: str) -> bool:
        phase: str = rest.get(f"{PODS}/{name}")["status"]["phase"]
        return phase == "Running"

    for name in names:
        wait_for(lambda n=name: running(n), what=f"{name} running")  # type: ignore[misc]


def _status_of(call: Any) -> KubernetesHttpError:
    with pytest.raises(KubernetesHttpError) as raised:
        call()
    return raised.value


def test_lists_are_paged_and_selected_by_the_server(rest: KubernetesRest, kube: LocalKubernetes) -> None:
    node = _node(rest, kube)
    for i in range(3):
        rest.post(PODS, make_pod(f"bound-{i}", labels={"app": "web"}, node_name=node))
    rest.post(PODS, make_pod("elsewhere", labels={"app": "batch"}, node_name="node-x"))
    first = rest.get(path("api", "v1", "pods"), {"limit": 2})
    assert len(first["items"]) == 2 and first["metadata"]["continue"]
    everything = rest.list_items(path("api", "v1", "pods"), _raw, page_size=1)
    assert sorted(p["metadata"]["name"] for p in everything) == ["bound-0", "bound-1", "bound-2", "elsewhere"]
    on_node = rest.list_items(path("api", "v1", "pods"), _raw, field_selector=f"spec.nodeName={node}", page_size=2)
    assert sorted(p["metadata"]["name"] for p in on_node) == ["bound-0", "bound-1", "bound-2"]
    batch = rest.list_items(PODS, _raw, label_selector="app in (batch)")
    assert [p["metadata"]["name"] for p in batch] == ["elsewhere"]


def test_the_cluster_wide_pod_list_leaves_finished_pods_out_and_a_nodes_list_keeps_them(
        rest: KubernetesRest) -> None:
    """The API server selects by `status.phase` (its status written through the status subresource, as the
    kubelet writes it); a pod bound to a node nothing runs keeps the phase given."""
    for name, phase in (("done", "Succeeded"), ("crashed", "Failed"), ("serving", None)):
        rest.post(PODS, make_pod(name, node_name="node-x"))
        if phase:
            rest.patch(f"{PODS}/{name}/status", {"status": {"phase": phase}}, MERGE_PATCH)
    cluster = KubernetesCluster(rest, page_size=1)
    assert [p.name for p in cluster.list_pods()] == ["serving"]
    assert sorted(p.name for p in cluster.list_pods("node-x")) == ["crashed", "done", "serving"]


def test_each_patch_type_is_sent_as_the_api_reads_it(rest: KubernetesRest, kube: LocalKubernetes) -> None:
    node = _node(rest, kube)
    target = f"{NODES}/{node}"
    rest.patch(target, {"metadata": {"labels": {"team": "ml"}}}, STRATEGIC_MERGE_PATCH)
    rest.patch(target, {"metadata": {"labels": {"tier": "gpu"}}}, MERGE_PATCH)
    labels = rest.get(target)["metadata"]["labels"]
    assert labels["team"] == "ml" and labels["tier"] == "gpu"  # maps merge under both
    rest.patch(target, {"metadata": {"labels": {"tier": None}}}, MERGE_PATCH)  # RFC 7386: null deletes
    assert "tier" not in rest.get(target)["metadata"]["labels"]
    rest.patch(target, [{"op": "add", "path": "/spec/unschedulable", "value": True}], JSON_PATCH)
    assert rest.get(target)["spec"]["unschedulable"] is True
    refused = _status_of(lambda: rest.patch(target, {"spec": {"unschedulable": False}}, JSON_PATCH))
    assert refused.status == 400  # a JSON patch is a list of operations: the type reached the server as given
    with pytest.raises(ValueError, match="not a Kubernetes patch type"):
        rest.patch(target, {}, "application/json")


def test_error_statuses_reach_the_caller_with_the_servers_status(rest: KubernetesRest,
                                                                  kube: LocalKubernetes) -> None:
    missing = _status_of(lambda: rest.get(f"{NODES}/no-such-node"))
    assert (missing.status, missing.status_body["reason"]) == (404, "NotFound")
    assert isinstance(missing, KubernetesApiError) and "GET /api/v1/nodes/no-such-node: HTTP 404" in str(missing)
    node = _node(rest, kube)
    stale = {"metadata": {"resourceVersion": "1"}, "spec": {"unschedulable": True}}
    conflict = _status_of(lambda: rest.patch(f"{NODES}/{node}", stale, STRATEGIC_MERGE_PATCH))
    assert (conflict.status, conflict.status_body["reason"]) == (409, "Conflict")
    pod = rest.post(PODS, make_pod("web-0", labels={"app": "web"}))
    exists = _status_of(lambda: rest.post(PODS, make_pod("web-0")))
    assert (exists.status, exists.status_body["reason"]) == (409, "AlreadyExists")
    wrong_uid = _status_of(lambda: rest.delete(f"{PODS}/web-0", {"preconditions": {"uid": "not-its-uid"}}))
    assert wrong_uid.status == 409 and pod["metadata"]["uid"] in wrong_uid.message


def test_an_eviction_a_budget_refuses_is_429_with_the_budgets_cause_and_two_budgets_are_500(
    rest: KubernetesRest, kube: LocalKubernetes
) -> None:
    kube.add_instance(make_instance(gpus=4))
    for name in ("web-0", "web-1"):
        rest.post(PODS, make_pod(name, labels={"app": "web"}))
    _running(rest, "web-0", "web-1")
    rest.post(BUDGETS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
                        "spec": {"selector": {"matchLabels": {"app": "web"}}, "minAvailable": 2}})
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-0", "namespace": "default"}}
    blocked = _status_of(lambda: rest.post(f"{PODS}/web-0/eviction", eviction))
    assert (blocked.status, blocked.status_body["reason"]) == (429, "TooManyRequests")
    assert "needs 2 healthy pods and has 2 currently" in blocked.message
    rest.post(BUDGETS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "all"},
                        "spec": {"selector": {}, "maxUnavailable": 5}})
    failed = _status_of(lambda: rest.post(f"{PODS}/web-0/eviction", eviction))
    assert failed.status == 500  # the API server refuses a pod under two budgets
    [pod] = [p for p in KubernetesCluster(rest).list_pods() if p.name == "web-0"]
    outcome = KubernetesCluster(rest).evict(pod)  # blocked while both budgets select it, retried as a 429 is
    assert outcome.blocked and not outcome.evicted and "more than one PodDisruptionBudget" in outcome.message


def test_the_token_is_asked_for_before_every_request_and_without_one_the_request_is_anonymous() -> None:
    with LocalKubernetes(cluster_name="ml-prod") as kube:
        asked: list[int] = []

        def authorization() -> str:
            asked.append(1)
            return f"Bearer {kube.token}"

        with KubernetesRest(kube.url, authorization=authorization) as rest:
            rest.get(NODES)
            rest.get(NODES)
        assert len(asked) == 2
        with KubernetesRest(kube.url) as anonymous:
            assert _status_of(lambda: anonymous.get(NODES)).status == 403
        with KubernetesRest.of(kube.client()) as as_the_kubernetes_client_would:  # its host and bearer token
            assert as_the_kubernetes_client_would.get(NODES)["kind"] == "NodeList"


def test_an_unreachable_server_is_an_api_error_without_a_status() -> None:
    with KubernetesRest("http://127.0.0.1:9", timeout=(0.5, 0.5)) as nowhere:
        with pytest.raises(KubernetesApiError) as raised:
            nowhere.get(NODES)
    assert raised.value.status is None and not isinstance(raised.value, KubernetesHttpError)
    assert "unreachable" in str(raised.value)


def test_a_certificate_authority_that_cannot_be_read_is_an_api_error() -> None:
    with pytest.raises(KubernetesApiError, match="TLS settings"):
        KubernetesRest("https://k8s.example", ca_pem="not a certificate")

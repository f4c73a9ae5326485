"""PodDisruptionBudgets read through the real `kubernetes` client from the local Kubernetes API: the pods a
consolidation must leave alone because an eviction would be refused now."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.adapters.kubernetes.disruption_budgets import KubernetesDisruptionBudgets
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from gpu_autoscaler.models.pods import selects
from tests import kube_reads
from tests.integration.kubernetes.conftest import functions_client, make_budget, make_instance, make_pod, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def kube() -> Iterator[LocalKubernetes]:
    with LocalKubernetes(cluster_name="ml-prod", bookmark_interval=0.2) as local:
        yield local


def test_pods_of_a_spent_budget_are_blocked_and_no_others(kube: LocalKubernetes) -> None:
    api = kube.client()
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    kube.add_instance(make_instance(gpus=4))
    for name, app in (("db-0", "db"), ("db-1", "db"), ("web-0", "web")):
        core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod(name, labels={"app": app})))
    cluster = KubernetesCluster(functions_client(kube))
    wait_for(lambda: sum(p.phase == "Running" for p in cluster.list_pods()) == 3, what="pods running")
    policy.create_namespaced_pod_disruption_budget("default", make_budget("db", {"matchLabels": {"app": "db"}},
                                                                     minAvailable=2))
    policy.create_namespaced_pod_disruption_budget("default", make_budget("web", {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["web"]}]}, maxUnavailable=1))
    wait_for(lambda: kube_reads.disruptions_allowed(
        policy.read_namespaced_pod_disruption_budget("web", "default")) == 1, what="budget status")
    pods = cluster.list_pods()
    blocked = KubernetesDisruptionBudgets(api).blocked(pods)
    assert {p.name for p in pods if p.uid in blocked} == {"db-0", "db-1"}


def test_label_selectors_follow_kubernetes() -> None:
    labels = {"app": "db", "tier": "gold"}
    assert selects({}, labels)  # empty: every pod of the namespace
    assert not selects(None, labels)  # missing: none
    assert selects({"matchLabels": {"app": "db"}}, labels)
    assert not selects({"matchLabels": {"app": "web"}}, labels)
    assert selects({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"},
                                         {"key": "tier", "operator": "NotIn", "values": ["bronze"]}]}, labels)
    assert not selects({"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["x"]}]}, labels)


def _unready(core: client.CoreV1Api, name: str) -> None:
    """The pod's readiness probe failing: Running, its Ready condition False."""
    core.patch_namespaced_pod_status(name, "default", {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "ReadinessProbeFailed"}]}})


def test_what_the_budgets_say_is_what_the_eviction_api_does_with_several_budgets_and_unready_pods(
        kube: LocalKubernetes) -> None:
    """The eviction subresource refuses (500) a pod more than one budget selects, whatever they allow (Kubernetes
    "API-initiated eviction"; Karpenter's `isEvictable` holds such a pod unevictable), and lets a running pod that
    is not Ready go past a spent budget with `unhealthyPodEvictionPolicy: AlwaysAllow`, or with the default
    `IfHealthyBudget` while the budget's healthy pods still meet it ("Specifying a Disruption Budget"). The local
    API server, which implements those rules on its own, is the witness: each pod said blocked is refused, each
    other pod evicted."""
    api = kube.client()
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    kube.add_instance(make_instance(gpus=0, cpu="16"))
    pods = {"both-0": {"app": "both", "tier": "gold"}, "always-0": {"app": "always"}, "always-1": {"app": "always"},
            "healthy-0": {"app": "healthy"}, "healthy-1": {"app": "healthy"}, "healthy-2": {"app": "healthy"}}
    for name, labels in pods.items():
        core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod(name, gpus=None, labels=labels)))
    cluster = KubernetesCluster(functions_client(kube))
    wait_for(lambda: sum(p.phase == "Running" for p in cluster.list_pods()) == len(pods), what="pods running")
    for budget in (make_budget("both", {"matchLabels": {"app": "both"}}, maxUnavailable=1),
                   make_budget("gold", {"matchLabels": {"tier": "gold"}}, maxUnavailable=1),
                   make_budget("always", {"matchLabels": {"app": "always"}}, minAvailable=2,
                               unhealthyPodEvictionPolicy="AlwaysAllow"),
                   make_budget("healthy", {"matchLabels": {"app": "healthy"}}, minAvailable=2)):
        policy.create_namespaced_pod_disruption_budget("default", budget)
    _unready(core, "always-1")
    _unready(core, "healthy-2")
    wait_for(lambda: kube_reads.disruptions_allowed(
        policy.read_namespaced_pod_disruption_budget("healthy", "default")) == 0
        and kube_reads.disruptions_allowed(policy.read_namespaced_pod_disruption_budget("both", "default")) == 1,
        what="budget status")
    listed = {p.name: p for p in cluster.list_pods()}
    assert not listed["always-1"].ready and listed["always-0"].ready
    uids = KubernetesDisruptionBudgets(api).blocked(list(listed.values()))
    blocked = {name for name, p in listed.items() if p.uid in uids}
    assert blocked == {"both-0", "always-0", "healthy-0", "healthy-1"}

    refused: dict[str, int] = {}
    for name in sorted(listed, key=lambda n: n not in blocked):  # the refusals first: they change nothing
        try:
            core.create_namespaced_pod_eviction(name, "default", client.V1Eviction.model_validate(
                {"metadata": {"name": name, "namespace": "default"}}))
        except ApiException as error:
            refused[name] = error.status
    assert refused == {"both-0": 500, "always-0": 429, "healthy-0": 429, "healthy-1": 429}

"""PodDisruptionBudgets read through the real `kubernetes` client from the local Kubernetes API: the pods a
consolidation must leave alone because an eviction would be refused now."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from kubernetes import client

from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.adapters.kubernetes.disruption_budgets import KubernetesDisruptionBudgets, selector_matches
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from tests import kube_reads
from tests.integration.kubernetes.conftest import make_budget, make_instance, make_pod, wait_for

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
    cluster = KubernetesCluster(api)
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
    assert selector_matches({}, labels)  # empty: every pod of the namespace
    assert not selector_matches(None, labels)  # missing: none
    assert selector_matches({"matchLabels": {"app": "db"}}, labels)
    assert not selector_matches({"matchLabels": {"app": "web"}}, labels)
    assert selector_matches({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"},
                                                  {"key": "tier", "operator": "NotIn", "values": ["bronze"]}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["x"]}]}, labels)

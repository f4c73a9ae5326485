"""The Deployment the user applies matches what the agent reads and serves, and asks for no more than it needs."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpu_autoscaler_agent.settings import ENVIRONMENT, load_settings
from tests.conftest import ROOT

DEPLOY = ROOT / "agent" / "deploy"


def documents() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                out[doc["kind"]] = doc
    return out


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    return documents()


def test_every_resource_is_present_and_listed_in_the_kustomization(manifests: dict[str, Any]) -> None:
    assert set(manifests) == {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"}
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def test_the_role_reads_and_patches_only_pods_and_nodes(manifests: dict[str, Any]) -> None:
    rules = manifests["ClusterRole"]["rules"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]} in rules
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]} in rules
    writes = [rule["resources"] for rule in rules if set(rule["verbs"]) - {"get", "list", "watch"}]
    assert writes == [["pods"], ["nodes"]] and all(
        set(rule["verbs"]) - {"get", "list", "watch"} <= {"patch"} for rule in rules)
    groups = {g for rule in rules for g in rule["apiGroups"]}
    assert groups == {"", "storage.k8s.io", "resource.k8s.io", "batch", "jobset.x-k8s.io", "scheduling.x-k8s.io",
                      "scheduling.run.ai", "scheduling.volcano.sh"}
    subject = manifests["ClusterRoleBinding"]["subjects"][0]
    account = manifests["ServiceAccount"]["metadata"]
    assert (subject["name"], subject["namespace"]) == (account["name"], account["namespace"])


def test_the_container_is_non_root_read_only_limited_and_probed(manifests: dict[str, Any]) -> None:
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(container["resources"]["requests"]) == set(container["resources"]["limits"]) == {"cpu", "memory"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["serviceAccountName"] == manifests["ServiceAccount"]["metadata"]["name"]


def test_the_environment_names_are_the_ones_the_agent_reads(manifests: dict[str, Any]) -> None:
    [container] = manifests["Deployment"]["spec"]["template"]["spec"]["containers"]
    names = {e["name"] for e in container["env"]}
    assert names <= set(ENVIRONMENT.values())
    assert {"CLUSTER_NAME", "QUEUE_URL"} <= names
    port = next(e["value"] for e in container["env"] if e["name"] == "HEALTH_PORT")
    assert int(port) == container["ports"][0]["containerPort"]


def test_setting_the_queue_url_alone_makes_an_agent_of_the_queues_region(manifests: dict[str, Any]) -> None:
    """The kustomization asks for the image, the cluster name and the queue URL: a queue of eu-west-1 must not
    leave the agent sending to us-east-1."""
    [container] = manifests["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert load_settings(env).region == "us-east-1"  # the sample's queue
    queue = "https://sqs.eu-west-1.amazonaws.com/123456789012/ml-prod-gpu-autoscaler-pending-pods.fifo"
    assert load_settings({**env, "QUEUE_URL": queue}).region == "eu-west-1"

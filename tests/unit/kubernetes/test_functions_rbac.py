"""The functions' Kubernetes permissions are shipped, not left to the reader: `agent/deploy/functions-rbac.yaml`
grants the group the stack maps the functions' roles to every request the Kubernetes adapters make.

EKS access policies other than AmazonEKSClusterAdminPolicy grant nothing on nodes, PersistentVolumes or
VolumeAttachments (EKS User Guide, access policy permissions), and an access entry with neither a policy nor a
group is authorized for API discovery only: without this ClusterRole every drain, cordon and consolidation is
refused with 403 on a real cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpu_autoscaler.naming import FUNCTIONS_KUBERNETES_GROUP

ROOT = Path(__file__).resolve().parents[3]
RBAC = ROOT / "agent" / "deploy" / "functions-rbac.yaml"
GROUP = FUNCTIONS_KUBERNETES_GROUP
"""The group the stack's access entries put the functions' roles in: the binding must name exactly it."""

# (API group, resource, verb): each request of gpu_autoscaler/adapters/kubernetes, with where it is made.
REQUESTS = {
    ("", "nodes", "list"): "cluster.py list_nodes",
    ("", "nodes", "get"): "cluster.py _read_node, before each cordon or taint",
    ("", "nodes", "patch"): "cluster.py _patch_taints",
    ("", "nodes", "delete"): "cluster.py delete_node",
    ("", "pods", "list"): "cluster.py list_pods (field selector spec.nodeName)",
    ("", "pods", "delete"): "cluster.py delete_pod",
    ("", "pods/eviction", "create"): "cluster.py evict",
    ("policy", "poddisruptionbudgets", "list"): "disruption_budgets.py",
    ("storage.k8s.io", "volumeattachments", "list"): "cluster.py volume_attachments",
    ("", "persistentvolumes", "get"): "cluster.py _claim_of",
    ("", "persistentvolumes", "list"): "cluster.py list_pods, the zones of bound pods' volumes",
    ("", "persistentvolumeclaims", "list"): "cluster.py list_pods, the volumes of bound pods' claims",
    ("", "events", "create"): "events.py",
    ("", "events", "get"): "events.py, after a 409",
    ("", "events", "patch"): "events.py, a repeat",
}


def _documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RBAC.read_text()) if isinstance(d, dict)]


def _grants(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", []) and verb in r.get("verbs", [])
               for r in rules)


def test_the_functions_cluster_role_grants_every_request_they_make_and_is_bound_to_their_group() -> None:
    documents = _documents()
    [role] = [d for d in documents if d["kind"] == "ClusterRole"]
    [binding] = [d for d in documents if d["kind"] == "ClusterRoleBinding"]
    missing = [f"{g or 'core'}/{res} {verb} ({where})" for (g, res, verb), where in REQUESTS.items()
               if not _grants(role["rules"], g, res, verb)]
    assert not missing
    granted = {(g, res, verb) for r in role["rules"] for g in r["apiGroups"] for res in r["resources"]
               for verb in r["verbs"]}
    assert granted == set(REQUESTS), "grants beyond what the functions request"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": GROUP}]


def test_the_agent_install_applies_it() -> None:
    kustomization = yaml.safe_load((ROOT / "agent" / "deploy" / "kustomization.yaml").read_text())
    assert "functions-rbac.yaml" in kustomization["resources"]

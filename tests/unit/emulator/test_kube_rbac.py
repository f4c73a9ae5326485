"""Request attributes as the API server works them out (requestinfo.go), and RBAC rules as rbac.go matches them."""

from __future__ import annotations

import pytest

from gpu_autoscaler.emulator.kube_authn import UserInfo
from gpu_autoscaler.emulator.kube_rbac import Attributes, attributes, forbidden
from gpu_autoscaler.emulator.kube_rbac import _allows as allows


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("GET", "/api/v1/nodes/n1", {}, Attributes("get", True, "/api/v1/nodes/n1", "", "nodes", "", "", "n1")),
    ("GET", "/api/v1/pods", {}, Attributes("list", True, "/api/v1/pods", "", "pods")),
    ("GET", "/api/v1/pods", {"watch": "true"}, Attributes("watch", True, "/api/v1/pods", "", "pods")),
    ("POST", "/api/v1/namespaces/a/pods/p/eviction", {},
     Attributes("create", True, "/api/v1/namespaces/a/pods/p/eviction", "", "pods", "eviction", "a", "p")),
    ("PUT", "/apis/apps/v1/namespaces/a/daemonsets/d",
     {}, Attributes("update", True, "/apis/apps/v1/namespaces/a/daemonsets/d", "apps", "daemonsets", "", "a", "d")),
    ("PATCH", "/api/v1/nodes/n1", {}, Attributes("patch", True, "/api/v1/nodes/n1", "", "nodes", "", "", "n1")),
    ("DELETE", "/api/v1/nodes/n1", {}, Attributes("delete", True, "/api/v1/nodes/n1", "", "nodes", "", "", "n1")),
    ("DELETE", "/api/v1/namespaces/a/pods", {},
     Attributes("deletecollection", True, "/api/v1/namespaces/a/pods", "", "pods", "", "a")),
    ("DELETE", "/api/v1/namespaces/a", {},
     Attributes("delete", True, "/api/v1/namespaces/a", "", "namespaces", "", "a", "a")),
    ("GET", "/apis/policy/v1", {}, Attributes("get", False, "/apis/policy/v1")),
    ("GET", "/version", {}, Attributes("get", False, "/version")),
])
def test_the_attributes_of_a_request_come_from_its_method_and_path(method: str, path: str, query: dict[str, str],
                                                                   expected: Attributes) -> None:
    assert attributes(method, path, query) == expected


def test_rules_match_subresources_wildcards_names_and_paths() -> None:
    evict = attributes("POST", "/api/v1/namespaces/a/pods/p/eviction", {})
    assert allows({"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}, evict)
    assert not allows({"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}, evict)
    assert allows({"apiGroups": [""], "resources": ["pods/*"], "verbs": ["*"]}, evict)
    assert allows({"apiGroups": ["*"], "resources": ["*/eviction"], "verbs": ["create"]}, evict)
    assert not allows({"apiGroups": ["policy"], "resources": ["pods/eviction"], "verbs": ["create"]}, evict)
    named = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"], "resourceNames": ["n1"]}
    assert allows(named, attributes("GET", "/api/v1/nodes/n1", {}))
    assert not allows(named, attributes("GET", "/api/v1/nodes", {})) and not allows(
        named, attributes("GET", "/api/v1/nodes/n2", {}))
    discovery = {"nonResourceURLs": ["/api", "/apis/*"], "verbs": ["get"]}
    assert allows(discovery, attributes("GET", "/apis/policy/v1", {}))
    assert not allows(discovery, attributes("GET", "/version", {}))


def test_a_refusal_reads_as_the_api_servers() -> None:
    user = UserInfo("someone", ("system:authenticated",))
    pdbs = forbidden(user, attributes("GET", "/apis/policy/v1/poddisruptionbudgets", {}))
    assert (pdbs.code, pdbs.reason) == (403, "Forbidden")
    assert pdbs.message == ('poddisruptionbudgets.policy is forbidden: User "someone" cannot list resource '
                            '"poddisruptionbudgets" in API group "policy" at the cluster scope')
    evict = forbidden(user, attributes("POST", "/api/v1/namespaces/a/pods/p/eviction", {}))
    assert evict.message == ('pods "p" is forbidden: User "someone" cannot create resource "pods/eviction" in API '
                             'group "" in the namespace "a"')
    path = forbidden(user, attributes("GET", "/metrics", {}))
    assert path.message == 'forbidden: User "someone" cannot get path "/metrics"'

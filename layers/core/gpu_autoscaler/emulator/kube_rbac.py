"""RBAC for the local Kubernetes API server: the request's attributes, the stored roles, the 403 it answers.

Written from kubernetes.io "Using RBAC Authorization" and "Authorization" (request attributes and verbs) and the
API server's code it describes: the attributes of a request are worked out from its path and method alone, before
the server knows whether the resource exists (k8s.io/apiserver pkg/endpoints/request/requestinfo.go: GET of one
object → get, of a collection → list, with `watch=true` → watch; POST → create; PUT → update; PATCH → patch; DELETE
of one → delete, of a collection → deletecollection; the subresource after the name, `pods/eviction`; the API group
from `/apis/<group>`; the namespace from `/namespaces/<ns>/`); a path outside `/api/<v>/…` and `/apis/<g>/<v>/…`
is a non-resource request, its verb the lower-cased method. A request is allowed when a rule of a role bound to the
user or one of its groups matches: a ClusterRoleBinding's role anywhere, a RoleBinding's (Role or ClusterRole) in
its namespace; `*` matches any verb, group or resource; `<resource>/*` any subresource, `*/<subresource>` that
subresource of any resource; `resourceNames` only requests naming one of them; `nonResourceURLs` a path exactly or
by a trailing `*` prefix (rbac/v1 PolicyRule; plugin/pkg/auth/authorizer/rbac/rbac.go, `RuleAllows`).

The bootstrap roles the authorizer needs are stored as a new API server stores them (plugin/pkg/auth/authorizer/
rbac/bootstrappolicy/policy.go): `cluster-admin` bound to `system:masters`, `system:discovery` (discovery paths) to
`system:authenticated`, `system:public-info-viewer` (health and version) to everyone. A refusal is 403 Forbidden
with the API server's message (apiserver pkg/endpoints/handlers/responsewriters/errors.go `forbiddenMessage`,
apimachinery `NewForbidden`). Not modelled: privilege-escalation prevention on writing roles and bindings
(`escalate`, `bind`), aggregated ClusterRoles, impersonation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.kube_objects import CLUSTERROLEBINDINGS, CLUSTERROLES, ROLEBINDINGS, ROLES, ApiError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.emulator.kube_apiserver import ApiServer
    from gpu_autoscaler.emulator.kube_authn import UserInfo
    from gpu_autoscaler.emulator.kube_objects import ResourceType

__all__ = ["Attributes", "Authorizer", "attributes", "bootstrap_policy", "forbidden"]

log = logging.getLogger(__name__)

_GROUP = "rbac.authorization.k8s.io"
_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@dataclass(frozen=True)
class Attributes:
    """What the authorizer decides on (kubernetes.io, "Authorization", "Review your request attributes")."""

    verb: str
    resource_request: bool
    path: str
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def attributes(method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """requestinfo.go `NewRequestInfo`, for the paths this server serves."""
    parts = [p for p in path.split("/") if p]
    nonresource = Attributes(method.lower(), False, path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return nonresource
    rest = parts[1:]
    group = ""
    if parts[0] == "apis":
        if len(rest) < 3:
            return nonresource
        group, rest = rest[0], rest[1:]
    rest = rest[1:]  # the version
    verb = _VERBS.get(method, method.lower())
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch") in ("true", "1") else "list"
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(verb, True, path, group, resource, subresource, namespace, name)


class Authorizer:
    """RBAC over the roles and bindings in the server's store."""

    def __init__(self, api: ApiServer) -> None:
        self._api = api

    def authorize(self, user: UserInfo, request: Attributes) -> None:
        """Return when some bound rule allows the request; ApiError 403 (the API server's Status) otherwise.
        `system:masters` is allowed everything before RBAC is asked, as kube-apiserver's privileged-groups
        authorizer does (pkg/kubeapiserver/authorizer: NewPrivilegedGroups(user.SystemPrivilegedGroup))."""
        if "system:masters" in user.groups:
            return
        if not any(_allows(rule, request) for rule in self._rules(user, request.namespace)):
            refusal = forbidden(user, request)
            log.info("RBAC refused: %s", refusal.message)  # a missing permission shows in the emulator's log
            raise refusal

    def _rules(self, user: UserInfo, namespace: str) -> list[dict[str, Any]]:
        """The rules of every role bound to the user: cluster-wide, and in the request's namespace."""
        bound: list[tuple[dict[str, Any], str]] = [
            (b, "") for b in self._api.select(CLUSTERROLEBINDINGS, None) if _binds(b, user, "")]
        if namespace:
            bound += [(b, namespace) for b in self._api.select(ROLEBINDINGS, namespace) if _binds(b, user, namespace)]
        if not bound:
            return []
        cluster_roles = {r["metadata"]["name"]: r for r in self._api.select(CLUSTERROLES, None)}
        rules: list[dict[str, Any]] = []
        for binding, scope in bound:
            ref = binding.get("roleRef") or {}
            name = ref.get("name", "")
            if ref.get("kind") == "ClusterRole":
                role = cluster_roles.get(name)
            else:
                role = next((r for r in self._api.select(ROLES, scope) if r["metadata"]["name"] == name), None)
            rules += (role or {}).get("rules") or []
        return rules


def _binds(binding: dict[str, Any], user: UserInfo, namespace: str) -> bool:
    """rbac.go `appliesTo`: a User subject by name, a Group by one of the user's groups, a ServiceAccount by
    `system:serviceaccount:<namespace>:<name>` (a RoleBinding's own namespace when the subject names none)."""
    for subject in binding.get("subjects") or ():
        kind, name = subject.get("kind"), subject.get("name", "")
        if kind == "User" and name == user.name:
            return True
        if kind == "Group" and name in user.groups:
            return True
        if kind == "ServiceAccount" and user.name == (
                f"system:serviceaccount:{subject.get('namespace') or namespace}:{name}"):
            return True
    return False


def _allows(rule: Mapping[str, Any], request: Attributes) -> bool:
    verbs = rule.get("verbs") or ()
    if not ("*" in verbs or request.verb in verbs):
        return False
    if not request.resource_request:
        return any(url == "*" or url == request.path or (url.endswith("*") and request.path.startswith(url[:-1]))
                   for url in rule.get("nonResourceURLs") or ())
    groups = rule.get("apiGroups") or ()
    if not ("*" in groups or request.api_group in groups):
        return False
    resources = rule.get("resources") or ()
    combined = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    if not any(r in ("*", combined) or (request.subresource and r in (f"{request.resource}/*",
                                                                      f"*/{request.subresource}"))
               for r in resources):
        return False
    names = rule.get("resourceNames") or ()
    return not names or request.name in names


def forbidden(user: UserInfo, request: Attributes) -> ApiError:
    """The API server's 403 for a request RBAC does not allow."""
    if not request.resource_request:
        return ApiError(403, "Forbidden", f'forbidden: User "{user.name}" cannot {request.verb} path '
                        f'"{request.path}"')
    resource = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    scope = f'in the namespace "{request.namespace}"' if request.namespace else "at the cluster scope"
    reason = (f'User "{user.name}" cannot {request.verb} resource "{resource}" in API group "{request.api_group}" '
              f"{scope}")
    qualified = f"{request.resource}.{request.api_group}" if request.api_group else request.resource
    message = f'{qualified} "{request.name}" is forbidden: {reason}' if request.name else (
        f"{qualified} is forbidden: {reason}")
    details = {"kind": request.resource, **({"name": request.name} if request.name else {}),
               **({"group": request.api_group} if request.api_group else {})}
    return ApiError(403, "Forbidden", message, details)


def bootstrap_policy() -> list[tuple[ResourceType, dict[str, Any]]]:
    """The roles and bindings a new API server creates that this authorizer needs (bootstrappolicy/policy.go)."""
    discovery = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz",
                 "/version", "/version/"]
    public = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
    roles = {
        "cluster-admin": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                          {"nonResourceURLs": ["*"], "verbs": ["*"]}],
        "system:discovery": [{"nonResourceURLs": discovery, "verbs": ["get"]}],
        "system:public-info-viewer": [{"nonResourceURLs": public, "verbs": ["get"]}],
    }
    bindings = {
        "cluster-admin": ["system:masters"],
        "system:discovery": ["system:authenticated"],
        "system:public-info-viewer": ["system:authenticated", "system:unauthenticated"],
    }
    labels = {"kubernetes.io/bootstrapping": "rbac-defaults"}
    objects: list[tuple[ResourceType, dict[str, Any]]] = []
    for name, rules in roles.items():
        objects.append((CLUSTERROLES, {"metadata": {"name": name, "labels": labels}, "rules": rules}))
        objects.append((CLUSTERROLEBINDINGS, {
            "metadata": {"name": name, "labels": labels},
            "roleRef": {"apiGroup": _GROUP, "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": _GROUP, "kind": "Group", "name": group} for group in bindings[name]]}))
    return objects

"""The resource types the local Kubernetes API serves, its errors as `Status` objects, and small helpers.

Objects are kept as the JSON the real API server would send (dicts, camelCase, quantity strings), so the
real client deserializes them exactly as it would a cluster's, and nothing here needs the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from datetime import datetime

__all__ = [
    "CLUSTERROLEBINDINGS",
    "CLUSTERROLES",
    "CONFIGMAPS",
    "DAEMONSETS",
    "EVENTS",
    "NAMESPACES",
    "NODES",
    "PDBS",
    "PODGROUPS",
    "PODS",
    "RESOURCES",
    "ROLEBINDINGS",
    "ROLES",
    "SERVICEACCOUNTS",
    "VOLUMEATTACHMENTS",
    "ApiError",
    "ResourceType",
    "format_quantity",
    "format_time",
    "remove_taints",
    "status_body",
]


@dataclass(frozen=True)
class ResourceType:
    """One REST resource: where it lives, what it is called, and which fields its field selectors accept."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    field_labels: frozenset[str] = frozenset()
    subresources: tuple[str, ...] = ("status",)
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def selectable(self, field: str) -> bool:
        """`metadata.name` (and `metadata.namespace` when namespaced) always; the rest per resource, as in k8s."""
        return field == "metadata.name" or (self.namespaced and field == "metadata.namespace") or (
            field in self.field_labels
        )


NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", False, frozenset({"status.phase"}),
                          short_names=("ns",))
NODES = ResourceType("", "v1", "nodes", "Node", False, frozenset({"spec.unschedulable"}), short_names=("no",))
PODS = ResourceType(
    "", "v1", "pods", "Pod", True,
    frozenset({"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
               "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"}),
    subresources=("status", "eviction", "binding"), short_names=("po",),
)
EVENTS = ResourceType(
    "", "v1", "events", "Event", True,
    frozenset({"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
               "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
               "reason", "reportingComponent", "source", "type"}),
    subresources=(), short_names=("ev",),
)
CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap", True, subresources=(), short_names=("cm",))
DAEMONSETS = ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, short_names=("ds",))
PDBS = ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, short_names=("pdb",))
PODGROUPS = ResourceType("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", True, short_names=("pg",))
# Volumes: the attach/detach controller (`kube_storage`) acts on PVs, PVCs and VolumeAttachments; the agent reads
# a pending pod's volumes' zones, its gang's workload and its DRA claims, stored and served as written.
VOLUMEATTACHMENTS = ResourceType("storage.k8s.io", "v1", "volumeattachments", "VolumeAttachment", False)
PVS = ResourceType("", "v1", "persistentvolumes", "PersistentVolume", False, short_names=("pv",))
PVCS = ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, short_names=("pvc",))
STORAGECLASSES = ResourceType("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, subresources=(),
                              short_names=("sc",))
JOBS = ResourceType("batch", "v1", "jobs", "Job", True)
JOBSETS = ResourceType("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", True)
KAI_PODGROUPS = ResourceType("scheduling.run.ai", "v2alpha2", "podgroups", "PodGroup", True)
RESOURCECLAIMS = ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True)
RESOURCECLAIMTEMPLATES = ResourceType("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate",
                                      True, subresources=())
DEVICECLASSES = ResourceType("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False, subresources=())
# Access: the ServiceAccounts tokens are issued for, and the RBAC objects the authorizer (`kube_rbac`) reads.
SERVICEACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, subresources=(),
                               short_names=("sa",))
_RBAC = "rbac.authorization.k8s.io"
CLUSTERROLES = ResourceType(_RBAC, "v1", "clusterroles", "ClusterRole", False, subresources=())
CLUSTERROLEBINDINGS = ResourceType(_RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", False, subresources=())
ROLES = ResourceType(_RBAC, "v1", "roles", "Role", True, subresources=())
ROLEBINDINGS = ResourceType(_RBAC, "v1", "rolebindings", "RoleBinding", True, subresources=())

RESOURCES: tuple[ResourceType, ...] = (
    NAMESPACES, NODES, PODS, EVENTS, CONFIGMAPS, DAEMONSETS, PDBS, PODGROUPS,
    PVS, PVCS, STORAGECLASSES, JOBS, JOBSETS, KAI_PODGROUPS, RESOURCECLAIMS, RESOURCECLAIMTEMPLATES, DEVICECLASSES,
    VOLUMEATTACHMENTS, SERVICEACCOUNTS, CLUSTERROLES, CLUSTERROLEBINDINGS, ROLES, ROLEBINDINGS,
)


class ApiError(Exception):
    """An API failure, rendered as the `Status` object the real server sends with the same code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    @classmethod
    def not_found(cls, resource: ResourceType, name: str) -> ApiError:
        return cls(404, "NotFound", f'{resource.plural} "{name}" not found',
                   {"name": name, "kind": resource.plural, **_group(resource)})

    @classmethod
    def already_exists(cls, resource: ResourceType, name: str) -> ApiError:
        return cls(409, "AlreadyExists", f'{resource.plural} "{name}" already exists',
                   {"name": name, "kind": resource.plural, **_group(resource)})

    @classmethod
    def conflict(cls, resource: ResourceType, name: str, why: str) -> ApiError:
        return cls(409, "Conflict", f'Operation cannot be fulfilled on {resource.plural} "{name}": {why}',
                   {"name": name, "kind": resource.plural, **_group(resource)})

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)

    @classmethod
    def invalid(cls, resource: ResourceType, name: str, message: str) -> ApiError:
        return cls(422, "Invalid", f'{resource.kind} "{name}" is invalid: {message}',
                   {"name": name, "kind": resource.kind, **_group(resource)})

    @classmethod
    def gone(cls, message: str = "too old resource version") -> ApiError:
        return cls(410, "Expired", message)

    def status(self) -> dict[str, Any]:
        return status_body(self.code, self.reason, self.message, self.details, success=False)


def _group(resource: ResourceType) -> dict[str, str]:
    return {"group": resource.group} if resource.group else {}


def status_body(code: int, reason: str = "", message: str = "", details: Mapping[str, Any] | None = None,
                *, success: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Success" if success else "Failure", "code": code}
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details:
        body["details"] = dict(details)
    return body


def format_time(moment: datetime) -> str:
    """RFC 3339 to the second in UTC, as `metav1.Time` is written."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def format_quantity(name: str, value: int) -> str:
    """A canonical integer (millicores for cpu, bytes for memory) as the quantity string kubelet reports."""
    if name == "cpu":
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    if name in ("memory", "ephemeral-storage", "hugepages-2Mi", "hugepages-1Gi") and value and value % 1024 == 0:
        return f"{value // 1024}Ki"
    return str(value)


def remove_taints(node: dict[str, Any], drop: Callable[[Mapping[str, Any]], bool]) -> None:
    """Take the taints `drop` names off a Node object (its `spec.taints` gone when none is left, as the API
    server leaves an untainted Node)."""
    spec = node.setdefault("spec", {})
    taints = [t for t in spec.get("taints") or () if not drop(t)]
    if taints:
        spec["taints"] = taints
    else:
        spec.pop("taints", None)

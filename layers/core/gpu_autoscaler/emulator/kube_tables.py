"""What kubectl asks of an API server beyond the REST objects: Table output and OpenAPI v3 documents.

`kubectl get` asks for `as=Table` and prints the server's columns (`STATUS`, `NODE`, `READY`…); without
them it prints names only. `kubectl create`/`apply` validate through the server (`fieldValidation`) once
the OpenAPI v3 document says PATCH takes that parameter; without a document they refuse to run. Both
are served here, for the resources the local API has, with the columns the real server prints.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.kube_objects import DAEMONSETS, NODES, PDBS, PODS, RESOURCES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.emulator.kube_objects import ResourceType

__all__ = ["openapi_document", "openapi_index", "table", "wants_table"]

Row = Callable[[dict[str, Any], datetime], list[Any]]


def wants_table(accept: str | None) -> bool:
    return bool(accept) and "as=Table" in accept  # type: ignore[operator]


def _age(created: str | None, now: datetime) -> str:
    """kubectl's short duration: 45s, 3m12s, 5h, 2d."""
    if not created:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    seconds = max(int((now - then).total_seconds()), 0)
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    return f"{hours}h" if hours < 48 else f"{hours // 24}d"


def _column(name: str, kind: str = "string", priority: int = 0, fmt: str = "") -> dict[str, Any]:
    return {"name": name, "type": kind, "format": fmt, "description": name, "priority": priority}


def _pod_row(pod: dict[str, Any], now: datetime) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    containers = spec.get("containers") or ()
    statuses = status.get("containerStatuses") or ()
    ready = sum(1 for c in statuses if c.get("ready"))
    phase = status.get("reason") or status.get("phase") or "Pending"
    if pod["metadata"].get("deletionTimestamp"):
        phase = "Terminating"
    elif phase == "Pending" and any(c.get("reason") == "SchedulingGated" for c in status.get("conditions") or ()):
        phase = "SchedulingGated"
    return [pod["metadata"]["name"], f"{ready}/{len(containers)}", phase, 0,
            _age(pod["metadata"].get("creationTimestamp"), now), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>", "<none>"]


def _node_row(node: dict[str, Any], now: datetime) -> list[Any]:
    status = node.get("status") or {}
    ready = next((c.get("status") for c in status.get("conditions") or () if c.get("type") == "Ready"), None)
    state = "Ready" if ready == "True" else "NotReady" if ready == "False" else "Unknown"
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = node["metadata"].get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    info = status.get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or ()}
    return [node["metadata"]["name"], state, ",".join(roles) or "<none>",
            _age(node["metadata"].get("creationTimestamp"), now), info.get("kubeletVersion", ""),
            addresses.get("InternalIP") or "<none>", addresses.get("ExternalIP") or "<none>",
            info.get("osImage", ""), info.get("kernelVersion", ""), info.get("containerRuntimeVersion", "")]


def _pdb_row(budget: dict[str, Any], now: datetime) -> list[Any]:
    spec, status = budget.get("spec") or {}, budget.get("status") or {}
    return [budget["metadata"]["name"], str(spec.get("minAvailable", "N/A")), str(spec.get("maxUnavailable", "N/A")),
            status.get("disruptionsAllowed", 0), _age(budget["metadata"].get("creationTimestamp"), now)]


def _daemonset_row(daemonset: dict[str, Any], now: datetime) -> list[Any]:
    status = daemonset.get("status") or {}
    selector = ((daemonset.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector") or {}
    return [daemonset["metadata"]["name"], status.get("desiredNumberScheduled", 0),
            status.get("currentNumberScheduled", 0), status.get("numberReady", 0),
            status.get("updatedNumberScheduled", 0), status.get("numberAvailable", 0),
            ",".join(f"{k}={v}" for k, v in selector.items()) or "<none>",
            _age(daemonset["metadata"].get("creationTimestamp"), now)]


def _default_row(obj: dict[str, Any], now: datetime) -> list[Any]:
    return [obj["metadata"]["name"], _age(obj["metadata"].get("creationTimestamp"), now)]


_NAME = _column("Name", fmt="name")
_AGE = _column("Age")
_TABLES: dict[ResourceType, tuple[list[dict[str, Any]], Row]] = {
    PODS: ([_NAME, _column("Ready"), _column("Status"), _column("Restarts", "integer"), _AGE,
            _column("IP", priority=1), _column("Node", priority=1), _column("Nominated Node", priority=1),
            _column("Readiness Gates", priority=1)], _pod_row),
    NODES: ([_NAME, _column("Status"), _column("Roles"), _AGE, _column("Version"),
             _column("Internal-IP", priority=1), _column("External-IP", priority=1),
             _column("OS-Image", priority=1), _column("Kernel-Version", priority=1),
             _column("Container-Runtime", priority=1)], _node_row),
    PDBS: ([_NAME, _column("Min Available"), _column("Max Unavailable"),
            _column("Allowed Disruptions", "integer"), _AGE], _pdb_row),
    DAEMONSETS: ([_NAME, _column("Desired", "integer"), _column("Current", "integer"),
                  _column("Ready", "integer"), _column("Up-to-date", "integer"), _column("Available", "integer"),
                  _column("Node Selector"), _AGE], _daemonset_row),
}


def table(resource: ResourceType, items: list[dict[str, Any]], now: datetime, *, version: str = "",
          include_object: str = "Metadata", columns: bool = True, token: str = "") -> dict[str, Any]:
    """A `meta.k8s.io/v1` Table; `columns=False` for watch events after the first, as the server sends them."""
    definitions, row = _TABLES.get(resource, ([_NAME, _AGE], _default_row))
    metadata: dict[str, Any] = {"resourceVersion": version} if version else {}
    if token:
        metadata["continue"] = token
    rows = []
    for item in items:
        entry: dict[str, Any] = {"cells": row(item, now)}
        if include_object == "Object":
            entry["object"] = item
        elif include_object != "None":
            entry["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                               "metadata": item["metadata"]}
        rows.append(entry)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
            "columnDefinitions": definitions if columns else [], "rows": rows}


def _prefix(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_index() -> dict[str, Any]:
    """`/openapi/v3`: one document per group version."""
    versions = sorted({(r.group, r.version) for r in RESOURCES})
    return {"paths": {_prefix(g, v): {"serverRelativeURL": f"/openapi/v3/{_prefix(g, v)}?hash=local"}
                      for g, v in versions}}


def openapi_document(path: str) -> dict[str, Any] | None:
    """`/openapi/v3/<api/v1|apis/g/v>`: the operations kubectl checks, each taking `fieldValidation`."""
    chosen = [r for r in RESOURCES if _prefix(r.group, r.version) == path]
    if not chosen:
        return None
    paths: dict[str, Any] = {}
    for resource in chosen:
        base = f"/{path}/namespaces/{{namespace}}/{resource.plural}" if resource.namespaced else (
            f"/{path}/{resource.plural}")
        gvk = {"group": resource.group, "version": resource.version, "kind": resource.kind}
        parameters = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
                      {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]

        def operation(action: str, gvk: Mapping[str, str] = gvk, params: list[Any] = parameters) -> dict[str, Any]:
            return {"operationId": f"{action}{gvk['kind']}", "parameters": params,
                    "responses": {"200": {"description": "OK"}}, "x-kubernetes-action": action,
                    "x-kubernetes-group-version-kind": dict(gvk)}

        paths[base] = {"post": operation("post"), "get": operation("list")}
        paths[f"{base}/{{name}}"] = {"get": operation("get"), "put": operation("put"), "patch": operation("patch"),
                                     "delete": operation("delete")}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.31.0"}, "paths": paths,
            "components": {"schemas": {}}}

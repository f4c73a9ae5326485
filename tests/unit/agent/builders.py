"""Pods in their Kubernetes JSON shape, built with keyword overrides: `make_pod(gpus=4)`."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

_versions = itertools.count(100)


def unschedulable_condition() -> dict[str, Any]:
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        "lastTransitionTime": "2026-11-22T09:59:31Z",
    }


def make_pod(
    *,
    name: str = "train-0",
    namespace: str = "team-a",
    uid: str | None = None,
    resource_version: str | None = None,
    gpus: int | str | None = 1,
    gpu_in: str = "requests",
    cpu: str = "8",
    memory: str = "64Gi",
    extra_requests: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    node_selector: dict[str, str] | None = None,
    affinity_terms: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    unschedulable: bool = True,
    condition: dict[str, Any] | None = None,
    phase: str = "Pending",
    node_name: str | None = None,
    nominated_node: str | None = None,
    deleting: bool = False,
    owner_kind: str | None = None,
    overhead: dict[str, str] | None = None,
    pod_resources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`gpu_in`: `requests` puts the GPUs in requests and limits (as the API server stores a pod), `limits` in
    limits alone (as a user may write it)."""
    if containers is None:
        requests = {"cpu": cpu, "memory": memory, **(extra_requests or {})}
        resources: dict[str, Any] = {"requests": requests}
        if gpus is not None:  # an extended resource has a limit, and its request is the limit or absent
            resources["limits"] = {"nvidia.com/gpu": str(gpus)}
            if gpu_in == "requests":
                requests["nvidia.com/gpu"] = str(gpus)
        containers = [{"name": "main", "image": "trainer:1", "resources": resources}]
    affinity = None
    if affinity_terms is not None:
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": affinity_terms}}}
    optional_spec = {"initContainers": init_containers, "tolerations": tolerations, "nodeSelector": node_selector,
                     "affinity": affinity, "priority": priority, "nodeName": node_name, "overhead": overhead,
                     "resources": pod_resources}
    spec: dict[str, Any] = {"containers": containers, "schedulerName": "default-scheduler"}
    spec.update({k: v for k, v in optional_spec.items() if v is not None})
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or str(uuid.uuid4()),
        "resourceVersion": resource_version or str(next(_versions)),
        "creationTimestamp": "2026-11-22T09:59:30Z",
    }
    owners = [{"apiVersion": "apps/v1", "kind": owner_kind, "name": "owner", "uid": "o-1"}] if owner_kind else None
    optional_metadata = {"labels": labels, "annotations": annotations, "ownerReferences": owners,
                         "deletionTimestamp": "2026-11-22T10:00:00Z" if deleting else None}
    metadata.update({k: v for k, v in optional_metadata.items() if v is not None})
    status: dict[str, Any] = {"phase": phase}
    if condition is not None:
        status["conditions"] = [condition]
    elif unschedulable:
        status["conditions"] = [unschedulable_condition()]
    if nominated_node is not None:
        status["nominatedNodeName"] = nominated_node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def container(name: str, restart_policy: str | None = None, **requests: str) -> dict[str, Any]:
    """A container requesting `cpu=..., memory=..., gpu=...` (gpu names nvidia.com/gpu, limited to as many: the
    API server refuses an extended resource's request without a limit)."""
    named = {("nvidia.com/gpu" if k == "gpu" else k.replace("_", "-")): v for k, v in requests.items()}
    resources: dict[str, Any] = {"requests": named}
    if "nvidia.com/gpu" in named:
        resources["limits"] = {"nvidia.com/gpu": named["nvidia.com/gpu"]}
    out: dict[str, Any] = {"name": name, "image": "x", "resources": resources}
    if restart_policy is not None:
        out["restartPolicy"] = restart_policy
    return out

"""A Pod, as the API server sends it, to one entry of the pending-pods document (DESIGN.md).

Fields are copied in their Kubernetes shapes and quantity strings. The one computed field is `requests`:
the scheduler's view of what the whole pod needs (containers, init containers, sidecars, overhead), so the
packer sizes nodes as the scheduler will judge them. Every entry is checked against `PendingPod` before it
leaves, so a pod the packer would reject is caught here, logged, and not sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.models.pod_spec import effective_requests, preferred_node_affinity, required_node_affinity
from gpu_autoscaler.models.pods import PendingPod

if TYPE_CHECKING:
    from gpu_autoscaler.models.pods import PodGroup

__all__ = [
    "COPIED_ANNOTATION_PREFIXES",
    "SCHEMA_VERSION",
    "effective_requests",
    "envelope",
    "format_timestamp",
    "pending_pod",
]

SCHEMA_VERSION = 1

COPIED_ANNOTATION_PREFIXES = ("karpenter.sh/", "karpenter.k8s.aws/", "gpu-autoscaler/")
"""Only annotations the autoscaler acts on travel: others (kubectl's last-applied-configuration, say) can
be tens of kilobytes and would crowd pods out of a message."""

Pod = Mapping[str, Any]


def pending_pod(pod: Pod, group: PodGroup | None = None, context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One `pods[]` entry, validated; raises ValueError (pydantic's ValidationError) naming what is wrong.

    `context`: what the agent learnt about the pod from other objects (its volumes' zones, its zone spread with
    counts, its DRA device requests, why it cannot be planned), as optional document fields."""
    metadata = pod.get("metadata", {})
    spec = pod.get("spec", {})
    entry: dict[str, Any] = {
        "uid": metadata.get("uid", ""),
        "namespace": metadata.get("namespace") or "default",
        "name": metadata.get("name", ""),
    }
    if created := metadata.get("creationTimestamp"):
        entry["createdAt"] = created
    entry["requests"] = effective_requests(spec)
    if node_selector := spec.get("nodeSelector"):
        entry["nodeSelector"] = dict(node_selector)
    if terms := required_node_affinity(spec):
        entry["requiredNodeAffinity"] = terms
    if preferred := preferred_node_affinity(spec):
        entry["preferredNodeAffinity"] = preferred
    if tolerations := spec.get("tolerations"):
        entry["tolerations"] = list(tolerations)
    entry["priority"] = int(spec.get("priority") or 0)
    if group is not None:
        entry["podGroup"] = group.model_dump(by_alias=True)
    annotations = {
        k: v for k, v in (metadata.get("annotations") or {}).items() if k.startswith(COPIED_ANNOTATION_PREFIXES)
    }
    if annotations:
        entry["annotations"] = annotations
    entry.update({k: v for k, v in (context or {}).items() if v is not None})
    PendingPod.model_validate(entry)
    return entry


def format_timestamp(moment: datetime) -> str:
    """UTC with milliseconds, always the same width, so a message's size is known before it is stamped."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def envelope(cluster: str, sent_at: datetime, pods: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schemaVersion": SCHEMA_VERSION, "cluster": cluster, "sentAt": format_timestamp(sent_at), "pods": pods}


"""A Pod, as the API server sends it, to one entry of the pending-pods document (DESIGN.md).

Fields are copied in their Kubernetes shapes and quantity strings. The one computed field is `requests`:
the scheduler's view of what the whole pod needs (containers, init containers, sidecars, overhead), so the
packer sizes nodes as the scheduler will judge them. Every entry is checked against `PendingPod` before it
leaves, so a pod the packer would reject is caught here, logged, and not sent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.models.pods import PendingPod, PodGroup
from gpu_autoscaler.models.resources import CPU, parse_quantity

if TYPE_CHECKING:
    from decimal import Decimal

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


class _Amount:
    """A quantity kept both exact (to add and compare) and as the user wrote it (to copy when not summed)."""

    __slots__ = ("text", "value")

    def __init__(self, value: Decimal, text: str | None) -> None:
        self.value = value
        self.text = text

    @classmethod
    def parse(cls, quantity: object) -> _Amount:
        return cls(parse_quantity(quantity), quantity if isinstance(quantity, str) else None)  # type: ignore[arg-type]

    def __add__(self, other: _Amount) -> _Amount:
        if other.value == 0:
            return self
        if self.value == 0:
            return other
        return _Amount(self.value + other.value, None)

    def render(self, name: str) -> str:
        if self.text is not None:
            return self.text
        if self.value == self.value.to_integral_value():
            return str(int(self.value))
        if name == CPU:
            return f"{math.ceil(self.value * 1000)}m"
        return str(math.ceil(self.value))


Vector = dict[str, _Amount]


def _container_requests(container: Mapping[str, Any]) -> Vector:
    """Requests, defaulted from limits as the API server does (extended resources often set limits only)."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: _Amount.parse(q) for name, q in merged.items()}


def _add(a: Vector, b: Vector) -> Vector:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out[name] + amount if name in out else amount
    return out


def _max(a: Vector, b: Vector) -> Vector:
    out = dict(a)
    for name, amount in b.items():
        if name not in out or amount.value > out[name].value:
            out[name] = amount
    return out


def _sum(vectors: Iterable[Vector]) -> Vector:
    total: Vector = {}
    for vector in vectors:
        total = _add(total, vector)
    return total


def effective_requests(spec: Mapping[str, Any]) -> dict[str, str]:
    """The scheduler's formula: max(app containers + sidecars, each init container + sidecars started before
    it), plus pod overhead; pod-level requests (spec.resources) replace the containers' for what they name."""
    sidecars: Vector = {}
    init_peak: Vector = {}
    for init in spec.get("initContainers") or ():
        requests = _container_requests(init)
        if init.get("restartPolicy") == "Always":
            sidecars = _add(sidecars, requests)
        else:
            init_peak = _max(init_peak, _add(requests, sidecars))
    total = _max(_add(_sum(_container_requests(c) for c in spec.get("containers") or ()), sidecars), init_peak)
    pod_level = spec.get("resources")
    if pod_level:
        total.update(_container_requests({"resources": pod_level}))
    total = _add(total, {name: _Amount.parse(q) for name, q in (spec.get("overhead") or {}).items()})
    return {name: amount.render(name) for name, amount in total.items() if amount.value > 0}


def _required_terms(spec: Mapping[str, Any]) -> list[Any]:
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or ())


def pending_pod(pod: Pod, group: PodGroup | None = None) -> dict[str, Any]:
    """One `pods[]` entry, validated; raises ValueError (pydantic's ValidationError) naming what is wrong."""
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
    if terms := _required_terms(spec):
        entry["requiredNodeAffinity"] = terms
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
    PendingPod.model_validate(entry)
    return entry


def format_timestamp(moment: datetime) -> str:
    """UTC with milliseconds, always the same width, so a message's size is known before it is stamped."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def envelope(cluster: str, sent_at: datetime, pods: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schemaVersion": SCHEMA_VERSION, "cluster": cluster, "sentAt": format_timestamp(sent_at), "pods": pods}


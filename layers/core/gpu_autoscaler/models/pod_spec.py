"""What a Pod, in its Kubernetes JSON shape, asks of a node.

The agent (to describe a pending pod), the cluster adapter (to size pods already bound) and the local
Kubernetes API's scheduler (to place pods) all read raw Pod objects; the formulas live here once, so the
three agree with each other and with kube-scheduler on what a pod needs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.models.resources import CPU, parse_quantity

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from decimal import Decimal

__all__ = ["effective_requests", "preferred_node_affinity", "required_node_affinity", "required_pod_terms"]


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


_Vector = dict[str, _Amount]


def _container_requests(container: Mapping[str, Any]) -> _Vector:
    """Requests, defaulted from limits as the API server does (extended resources often set limits only)."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: _Amount.parse(q) for name, q in merged.items()}


def _add(a: _Vector, b: _Vector) -> _Vector:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out[name] + amount if name in out else amount
    return out


def _max(a: _Vector, b: _Vector) -> _Vector:
    out = dict(a)
    for name, amount in b.items():
        if name not in out or amount.value > out[name].value:
            out[name] = amount
    return out


def _sum(vectors: Iterable[_Vector]) -> _Vector:
    total: _Vector = {}
    for vector in vectors:
        total = _add(total, vector)
    return total


def _resized(container: Mapping[str, Any], statuses: Mapping[str, Mapping[str, Any]], infeasible: bool) -> _Vector:
    """A running container's requests during an in-place resize: what the kubelet holds as well as what the spec
    asks, max(spec requests, status requests, allocatedResources), or only what it holds when the resize is
    infeasible (k8s.io/component-helpers resource/helpers.go `determineContainerReqs`, which kube-scheduler and
    Karpenter's `resources.Ceiling` use for a bound pod)."""
    requests = _container_requests(container)
    status = statuses.get(container.get("name") or "")
    if status is None or status.get("resources") is None:
        return requests
    held = _max({n: _Amount.parse(q) for n, q in ((status.get("resources") or {}).get("requests") or {}).items()},
                {n: _Amount.parse(q) for n, q in (status.get("allocatedResources") or {}).items()})
    return held if infeasible else _max(requests, held)


def effective_requests(spec: Mapping[str, Any], status: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The scheduler's formula: max(app containers + sidecars, each init container + sidecars started before
    it), plus pod overhead; pod-level requests (spec.resources) replace the containers' for what they name.
    With a bound pod's `status`, its app containers and sidecars count what an in-place resize holds
    (`_resized`)."""
    statuses = {c.get("name") or "": c for key in ("containerStatuses", "initContainerStatuses")
                for c in (status or {}).get(key) or ()}
    infeasible = any(c.get("type") == "PodResizePending" and c.get("reason") == "Infeasible"
                     for c in (status or {}).get("conditions") or ())
    sidecars: _Vector = {}
    init_peak: _Vector = {}
    for init in spec.get("initContainers") or ():
        if init.get("restartPolicy") == "Always":
            sidecars = _add(sidecars, _resized(init, statuses, infeasible))
        else:
            init_peak = _max(init_peak, _add(_container_requests(init), sidecars))
    containers = (_resized(c, statuses, infeasible) for c in spec.get("containers") or ())
    total = _max(_add(_sum(containers), sidecars), init_peak)
    pod_level = spec.get("resources")
    if pod_level:
        total.update(_container_requests({"resources": pod_level}))
    total = _add(total, {name: _Amount.parse(q) for name, q in (spec.get("overhead") or {}).items()})
    return {name: amount.render(name) for name, amount in total.items() if amount.value > 0}


def required_node_affinity(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """`requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`, as written (ORed terms)."""
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or ())


def preferred_node_affinity(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """`preferredDuringSchedulingIgnoredDuringExecution`, as written (weighted terms)."""
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    return list(affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ())


def required_pod_terms(spec: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    """`kind`'s (`podAffinity`, `podAntiAffinity`) `requiredDuringSchedulingIgnoredDuringExecution` terms, as
    written: the agent reads pending pods' terms through it, the cluster adapter bound pods'."""
    affinity = (spec.get("affinity") or {}).get(kind) or {}
    return list(affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or ())

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

__all__ = ["effective_requests", "required_node_affinity"]


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


def effective_requests(spec: Mapping[str, Any]) -> dict[str, str]:
    """The scheduler's formula: max(app containers + sidecars, each init container + sidecars started before
    it), plus pod overhead; pod-level requests (spec.resources) replace the containers' for what they name."""
    sidecars: _Vector = {}
    init_peak: _Vector = {}
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


def required_node_affinity(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """`requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`, as written (ORed terms)."""
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or ())

"""Why a pod cannot be placed, in the words a platform engineer would use.

"no offering in pool gpu-burst has 8 × H100 in us-east-1a" says what the pod asked for in the terms of
its own spec (GPU count, the GPU model and zone it selected), so the fix is obvious: another pool, another
zone, fewer GPUs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.resources import CPU, EPHEMERAL_STORAGE, GPU, MEMORY, MIG_PREFIX, PODS, mig_profile

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpu_autoscaler.domain.packing.classes import PodClass
    from gpu_autoscaler.models.taints import Taint

__all__ = ["describe_need", "format_quantity", "pinned_values", "untolerated"]


def format_quantity(name: str, value: int) -> str:
    if name == CPU:
        return f"{value / 1000:g}" if value % 1000 == 0 else f"{value}m"
    if name in (MEMORY, EPHEMERAL_STORAGE) or name.startswith("hugepages-"):
        for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value >= size:
                return f"{value / size:.4g}{unit}"
        return str(value)
    return str(value)


def pinned_values(cls: PodClass, key: str) -> list[str]:
    """Values a pod pins a label to (nodeSelector, or an `In` its every affinity term shares)."""
    for selector_key, value in cls.node_selector:
        if selector_key == key:
            return [value]
    per_term: list[set[str]] = []
    for term in cls.affinity:
        values: set[str] | None = None
        for requirement in term.match_expressions:
            if requirement.key == key and requirement.operator == "In":
                values = set(requirement.values) if values is None else values & set(requirement.values)
        if values is None:
            return []
        per_term.append(values)
    return sorted(set().union(*per_term)) if per_term else []


def describe_need(cls: PodClass, short: Iterable[str] = ()) -> str:
    """`8 × H100 in us-east-1a`, or the resources that do not fit (`cpu 200, memory 2Ti`)."""
    requests = cls.requests
    models = [m.upper() for m in pinned_values(cls, L.INSTANCE_GPU_NAME)]
    model = " or ".join(models) if models else None
    parts: list[str] = []
    gpus = requests[GPU]
    if gpus:
        parts.append(f"{gpus} × {model}" if model else f"{gpus} GPU{'s' if gpus > 1 else ''}")
    for name, value in sorted(requests.items()):
        if (profile := mig_profile(name)) is not None and value:
            parts.append(f"{value} × MIG {profile}" + (f" of {model}" if model else ""))
    shortfall = [name for name in short if name not in (GPU, PODS) and not name.startswith(MIG_PREFIX)]
    if shortfall or not parts:
        names = shortfall or [n for n in (CPU, MEMORY) if requests[n]]
        parts.append(", ".join(f"{name} {format_quantity(name, requests[name])}" for name in names))
    text = " with ".join(p for p in parts if p)
    zones = pinned_values(cls, L.ZONE)
    if zones:
        text += " in " + " or ".join(zones)
    return text


def untolerated(tolerations: Iterable[object], taints: Iterable[Taint]) -> list[str]:
    """The pool taints the pod does not tolerate, as `key=value:Effect`."""
    tols = list(tolerations)
    out = []
    for taint in taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(t.tolerates(taint) for t in tols):  # type: ignore[attr-defined]
            out.append(f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}")
    return out


def describe_constraints(cls: PodClass, pool_labels: Mapping[str, str]) -> str:
    """The pod's node selector and affinity, compactly, for 'nothing matches' reasons."""
    parts = [f"{k}={v}" for k, v in cls.node_selector]
    for term in cls.affinity:
        exprs = []
        for r in term.match_expressions:
            values = ",".join(r.values)
            exprs.append(f"{r.key} {r.operator} {values}".strip())
        if exprs:
            parts.append("(" + " and ".join(exprs) + ")")
    return "; ".join(parts) if parts else "no node constraints"

"""Why pods were left unplaced, in words a user acts on: one reason per pool, naming what is missing.

("no offering in pool gpu-burst has 8 × H100 in us-east-1a"; "pool training: taint … not tolerated"; a gang
that no zone holds whole.) Each pod the pass could not place gets its class's reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.domain.packing.fractional import OPT_IN_KEYS
from gpu_autoscaler.domain.packing.reasons import describe_constraints, describe_need, untolerated
from gpu_autoscaler.domain.packing.results import Unschedulable
from gpu_autoscaler.models.resources import DRA_PREFIX, EFA, GPU, HUGEPAGES_2MI, NVIDIA_GPU_CLASS, mig_profile

if TYPE_CHECKING:
    from gpu_autoscaler.domain.packing.classes import PodClass
    from gpu_autoscaler.domain.packing.gangs import Gang
    from gpu_autoscaler.domain.packing.nodes import PoolView
    from gpu_autoscaler.domain.packing.solve_pass import SolvePass

__all__ = ["class_reason", "explain_unplaced", "leave_unplaced"]


def explain_unplaced(state: SolvePass, gangs: list[Gang]) -> None:
    """Every pod still unplaced after all tiers becomes unschedulable with its gang's or its class's reason."""
    for gang in gangs:
        if gang.placed:
            continue
        parts = gang.failures or [class_reason(state, c) for c in gang.classes[:1]]
        size = int(sum(state.rem[c] for c in gang.classes))
        reason = f"gang {gang.name} ({size} pods) cannot be placed whole: " + "; ".join(parts)
        for c in gang.classes:
            _unplaced(state, c, reason)
    for c in range(len(state.classes)):
        if state.rem[c] > 0:
            _unplaced(state, c, class_reason(state, c))


def leave_unplaced(state: SolvePass, reason: str) -> None:
    """Every pod still unplaced becomes unschedulable with `reason` (no node was to be opened for it)."""
    for c in range(len(state.classes)):
        if state.rem[c] > 0:
            _unplaced(state, c, reason)


def _unplaced(state: SolvePass, c: int, reason: str) -> None:
    for pod in state.take(c, int(state.rem[c])):
        state.unschedulable.append(Unschedulable(pod.uid, pod.key, reason))


def class_reason(state: SolvePass, c: int) -> str:
    """Why no pool holds a pod of class `c`: per pool, the first rule that rules it out."""
    cls = state.classes[c]
    idx = state.idx
    parts = []
    for view in state.s.pools:
        name = view.pool.name
        blocked = untolerated(cls.tolerations, view.pool.taints)
        if blocked:
            parts.append(f"pool {name}: taint {', '.join(blocked)} not tolerated")
            continue
        allowed = view.base & state.s.selector_mask(view, cls)
        fractional = np.zeros_like(allowed)
        if state.s.excludes_fractional(view, cls):
            fractional = allowed & state.s.partitioned
            allowed = allowed & ~state.s.partitioned
        matrix = state.matrices[view.position]
        fits = (matrix >= state.req[c]).all(axis=1)[idx.type_of]
        if not (allowed & fits).any() and (fractional & fits).any():
            parts.append(
                f"pool {name}: only fractional-GPU types ({state.s.fractional.describe()}) have "
                f"{describe_need(cls)}, and they serve only pods that select on "
                f"{' or '.join(sorted(OPT_IN_KEYS))}, or pools whose requirements ask for them"
            )
            continue
        if not allowed.any():
            parts.append(
                f"pool {name}: no offering matches the pod's node constraints "
                f"({describe_constraints(cls, view.fixed_labels)}) within the pool's requirements"
            )
            continue
        if not (allowed & fits).any():
            types = np.unique(idx.type_of[allowed])
            short = [n for r, n in enumerate(state.names) if state.req[c][r] > matrix[types, r].max()]
            parts.append(f"no offering in pool {name} has {describe_need(cls, short)}{_sharing_hint(view, cls)}")
            continue
        if not (allowed & fits & state.available).any():
            parts.append(
                f"pool {name}: every offering with {describe_need(cls)} is marked unavailable "
                "(insufficient capacity) for now"
            )
            continue
        failure = state.failures.get((view.position, c))
        parts.append(failure or f"pool {name}: no room left in its reservations")
    return "; ".join(parts) if parts else "no node pools are configured"


def _sharing_hint(view: PoolView, cls: PodClass) -> str:
    sharing = view.pool.gpu_sharing
    dra = [n.removeprefix(DRA_PREFIX) for n in cls.requests if n.startswith(DRA_PREFIX)]
    others = [d for d in dra if d != NVIDIA_GPU_CLASS]
    if others:
        return f" (DRA devices are planned for class {NVIDIA_GPU_CLASS} only, not {', '.join(others)})"
    if dra and sharing.mode != "none":
        return (f" (pool {view.pool.name} shares or partitions its GPUs; DRA devices of class {NVIDIA_GPU_CLASS} "
                "are whole GPUs)")
    if sharing.mode == "mig" and cls.requests[GPU]:
        if sharing.mig_strategy == "single":
            return (f" (pool {view.pool.name} advertises MIG {sharing.mig_profile} slices as {GPU}: each one a pod "
                    "asks for is a slice)")
        return f" (pool {view.pool.name} partitions GPUs into MIG {sharing.mig_profile} slices)"
    if cls.requests[EFA] and not view.pool.efa:
        return f" (only pools with efa: true launch nodes with {EFA})"
    if cls.requests[HUGEPAGES_2MI] and not view.pool.efa:
        return f" (only nodes of pools with efa: true pre-allocate {HUGEPAGES_2MI})"
    wants_mig = [p for n in cls.requests if (p := mig_profile(n)) is not None]
    if wants_mig and (sharing.mode != "mig" or sharing.mig_profile not in wants_mig):
        return f" (pool {view.pool.name} does not partition GPUs into MIG {', '.join(wants_mig)})"
    return ""

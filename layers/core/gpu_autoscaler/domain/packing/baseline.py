"""A Karpenter-like packer, for comparison: first-fit decreasing, then the cheapest type that fits.

Karpenter's scheduler sorts pods by CPU then memory, largest first, and puts each on the first node
being planned whose remaining instance types can still hold it, opening a new node (with every type
the pod's constraints allow) when none can; each new node then launches the cheapest type that fits
what it holds. Used as `Solver(..., packer=first_fit_decreasing)`, every other rule (pools, capacity
order, gangs, limits) stays the same, so the benchmarks measure the packing method alone; the simulator
uses it for its `karpenter-like` policy.
"""

from __future__ import annotations

import numpy as np

from gpu_autoscaler.domain.packing.binpack import Kinds, Opened

__all__ = ["first_fit_decreasing"]

_CPU, _MEMORY = 0, 1
"""Positions of cpu and memory on the solver's resource axes (`fit.BASE_RESOURCES`)."""


def first_fit_decreasing(demand: np.ndarray, req: np.ndarray, kinds: Kinds) -> list[Opened]:
    """Pods by CPU, then memory, descending; each onto the first planned node that can still take it."""
    n_classes = req.shape[0]
    order = sorted(range(n_classes), key=lambda c: (-int(req[c, _CPU]), -int(req[c, _MEMORY]), c))
    left = kinds.limit.astype(np.int64).copy() if kinds.limit is not None else None
    open_kinds = np.ones(len(kinds), bool) if left is None else left > 0
    used: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    for c in order:
        # Nodes that could not take a pod of this class never can later (they only fill up), so each class
        # resumes where its previous pod was placed: first fit in O(nodes + pods) per class.
        start = 0
        for _ in range(int(demand[c])):
            placed = False
            for i in range(start, len(used)):
                mask = masks[i] & kinds.feasible[c] & (kinds.cap >= used[i] + req[c]).all(axis=1)
                if mask.any():
                    masks[i] = mask
                    used[i] = used[i] + req[c]
                    counts[i][c] += 1
                    start = i
                    placed = True
                    break
            if placed:
                continue
            mask = open_kinds & kinds.feasible[c] & (kinds.cap >= req[c]).all(axis=1)
            if not mask.any():
                break
            masks.append(mask)
            used.append(req[c].copy())
            row = np.zeros(n_classes, np.int64)
            row[c] = 1
            counts.append(row)
            start = len(used) - 1
    opened = []
    for mask, row in zip(masks, counts, strict=True):
        allowed = mask if left is None else mask & (left > 0)
        if not allowed.any():
            continue
        kind = int(np.where(allowed, kinds.price, np.inf).argmin())
        if left is not None:
            left[kind] -= 1
        opened.append(Opened(kind, row, 1))
    return opened

"""The cheapest nodes for identical pods, exactly: the tier packer's case of one class."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.domain.packing.kinds import Opened

if TYPE_CHECKING:
    from gpu_autoscaler.domain.packing.kinds import Kinds

__all__ = ["EXACT_SPAN", "single_class"]

EXACT_SPAN = 4096
"""Largest remainder `single_class` covers by dynamic programming (see there)."""


def single_class(c: int, n: int, req: np.ndarray, kinds: Kinds) -> list[Opened]:
    """The cheapest nodes for `n` identical pods, exactly: a covering knapsack over pod counts.

    `cost[m]` is the least price holding `m` pods (a node of kind k holds up to `fit[k]`). Let b be the
    kind of lowest price per pod, holding `f_b`. Some cheapest cover has fewer than `f_b` nodes of other
    kinds: among any `f_b` of them a subset holds a multiple of `f_b` pods (pigeonhole on prefix sums),
    and that many pods on b nodes cost no more. So all but `(f_b − 1) × max fit` pods go on b nodes, and
    the dynamic programme covers the rest: the work is bounded by the node sizes, not by `n`. (Past
    `EXACT_SPAN` pods of rest, which takes nodes of hundreds of pods, the rest is cut to twice the
    largest fit and the answer is no longer proven optimal.)
    """
    need = req[c] > 0
    if need.any():
        fit = np.where(kinds.feasible[c], (kinds.cap[:, need] // req[c, need]).min(axis=1), 0)
    else:
        fit = np.where(kinds.feasible[c], n, 0)
    fit = np.minimum(fit, n)
    usable = fit > 0
    if not usable.any():
        return []
    ratio = np.where(usable, kinds.price / np.maximum(fit, 1), np.inf)
    bulk_kind = int(ratio.argmin())
    per_bulk = int(fit[bulk_kind])
    span = (per_bulk - 1) * int(fit.max()) + per_bulk
    if span > EXACT_SPAN:
        span = 2 * int(fit.max())
    bulk = max(0, -(-(n - span) // per_bulk)) if n > span else 0
    rest = n - bulk * per_bulk
    # Kinds another kind beats on both size and price never enter a cheapest cover.
    options: list[tuple[int, float, int]] = []
    for k in sorted(np.flatnonzero(usable).tolist(), key=lambda k: (-int(fit[k]), float(kinds.price[k]), k)):
        if not options or float(kinds.price[k]) < options[-1][1]:
            options.append((int(fit[k]), float(kinds.price[k]), k))
    options.sort(key=lambda o: o[2])
    cost = [0.0] * (rest + 1)
    choice = [0] * (rest + 1)
    for m in range(1, rest + 1):
        best_cost, best_kind = float("inf"), -1
        for f, price, k in options:
            value = price + cost[m - f if m > f else 0]
            if value < best_cost:
                best_cost, best_kind = value, k
        cost[m], choice[m] = best_cost, best_kind
    opened: dict[tuple[int, int], int] = {}
    if bulk:
        opened[(bulk_kind, per_bulk)] = bulk
    m = rest
    while m > 0:
        k = choice[m]
        take = int(min(fit[k], m))
        opened[(k, take)] = opened.get((k, take), 0) + 1
        m -= take
    return [Opened(k, _one(req.shape[0], c, take), copies) for (k, take), copies in opened.items()]


def _one(size: int, c: int, count: int) -> np.ndarray:
    row = np.zeros(size, np.int64)
    row[c] = count
    return row

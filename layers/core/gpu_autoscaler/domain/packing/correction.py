"""Sequential value correction: pack again with class weights learnt from the last plan.

The greedy (`binpack.pack`) ranks patterns by price per unit of class weight, and a class's first weight
is what its pods would cost on the cheapest kind filled perfectly. That undervalues a class whose pods
end up on dear nodes because nothing else fits them, and overvalues small pods that could ride along in
room left over. Cutting-stock heuristics correct this by pricing each class at what it actually cost:
every node's price is shared among its pods in proportion to the room they take (the sum of their shares
of each resource), each class's weight moves halfway to its average share, and the tier is packed again.
The cheapest plan that holds as many pods wins; the first plan stays when no round beats it.

The rounds cost a pack each, so they are spent only on tiers small enough (pods × classes up to
`CORRECTION_WORK`) that the whole pass stays within the planning budget (a 10,000-pod burst keeps the
single greedy pass), and whose first plan is not already within `CLOSE_ENOUGH` (3 %) of a lower bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.domain.packing.kinds import Kinds, Opened

__all__ = ["CLOSE_ENOUGH", "CORRECTION_WORK", "ROUNDS", "corrected", "lower_bound", "pod_floor", "worth_more_work"]

ROUNDS = 3
CORRECTION_WORK = 6_000
"""Pods × classes of a tier up to which the correction rounds run."""
CLOSE_ENOUGH = 0.03
"""A first plan within this of `lower_bound` is kept without correction rounds: most tiers are, and on
the randomised scenarios the rounds never gained more than 0.3 % on one that was."""


def corrected(first: list[Opened], demand: np.ndarray, req: np.ndarray, kinds: Kinds, weights: np.ndarray,
              repacks: Sequence[Callable[[np.ndarray], list[Opened]]], rounds: int = ROUNDS) -> list[Opened]:
    """The cheapest of `first` and the plans each of `repacks` makes with corrected weights.

    Each repack runs its own rounds from the first plan's weights: the first (the greedy that made
    `first`) from the weights `first` paid; the others (wider searches) from `weights` themselves.
    The caller has asked `worth_more_work` first (it also decides on `pairs` from the same answer).
    `rounds`: of the first repack (the others get one more); `regroup` spends one on each group it tries.
    """
    best, best_cost = first, _cost(first, kinds)
    goal = _held(first, demand.size)
    cap = kinds.cap.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(req[None, :, :] == 0, 0.0, req[None, :, :] / cap[:, None, :]).sum(axis=2)  # [K, C]
    for n, repack in enumerate(repacks):
        w = weights.astype(np.float64).copy()
        current = first
        for round_ in range(rounds + (n > 0)):
            if round_ or n == 0:
                w = _reweighed(current, w, share, kinds)
            current = repack(w)
            if (_held(current, demand.size) >= goal).all():
                cost = _cost(current, kinds)
                if cost < best_cost - 1e-9:
                    best, best_cost = current, cost
    return best


def worth_more_work(first: Sequence[Opened], demand: np.ndarray, req: np.ndarray, kinds: Kinds) -> bool:
    """Whether a tier's first plan gets the correction rounds (and `pairs`): a small tier without
    reservations, of two classes or more, whose first plan is more than `CLOSE_ENOUGH` above the bound."""
    live = int(np.count_nonzero(demand))
    if kinds.limit is not None or live < 2 or int(demand.sum()) * live > CORRECTION_WORK:
        return False
    return _cost(first, kinds) > lower_bound(demand, req, kinds) * (1 + CLOSE_ENOUGH)


def _reweighed(plan: Sequence[Opened], w: np.ndarray, share: np.ndarray, kinds: Kinds) -> np.ndarray:
    """Each class's weight halfway to what its pods paid in `plan` (a node's price shared by room taken)."""
    paid = np.zeros(w.size)
    pods = np.zeros(w.size)
    for e in plan:
        with np.errstate(invalid="ignore"):  # 0 pods × the infinite share of a class the kind cannot hold
            part = np.where(e.counts > 0, e.counts * share[e.kind], 0.0)
        total = part.sum()
        if total > 0:
            paid += e.copies * kinds.price[e.kind] * part / total
            pods += e.copies * e.counts
    return np.where(pods > 0, 0.5 * w + 0.5 * paid / np.maximum(pods, 1), w)


def lower_bound(demand: np.ndarray, req: np.ndarray, kinds: Kinds) -> float:
    """No plan holding `demand` costs less: in any one resource, every pod needs at least its share of a
    node, which costs at least that share of the price of the kind where it is cheapest (`pod_floor`)."""
    per_pod = pod_floor(req, kinds)
    wanted = demand > 0
    if not wanted.any() or not np.isfinite(per_pod[wanted]).all():
        return 0.0
    return float((demand[wanted, None] * per_pod[wanted]).sum(axis=0).max())


def pod_floor(req: np.ndarray, kinds: Kinds) -> np.ndarray:
    """[C, R] the least one pod of each class pays for its share of each resource: that share of the
    price of the kind where it is cheapest (inf for a class no kind holds). `lower_bound` is the largest
    over the resources of these summed over the pods, so callers bounding many sets of pods compute it once."""
    cap = kinds.cap.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(req[None, :, :] == 0, 0.0, req[None, :, :] / cap[:, None, :])  # [K, C, R]
    fits = (req[None, :, :] <= kinds.cap[:, None, :]).all(axis=2) & kinds.feasible.T  # [K, C]
    return np.where(fits[:, :, None], share * kinds.price[:, None, None], np.inf).min(axis=0)


def _held(opened: Sequence[Opened], size: int) -> np.ndarray:
    return sum((e.counts * e.copies for e in opened), np.zeros(size, np.int64))


def _cost(opened: Sequence[Opened], kinds: Kinds) -> float:
    return float(sum(kinds.price[e.kind] * e.copies for e in opened))

"""After the pair split: the nodes of three patterns of the plan packed again as a tier of their own.

A pattern greedy decides in bulk. On scenario s14 it opens seven 1.22 USD/h nodes, each holding one 220 GiB
pod, beside 8-GPU 4.14 nodes holding small pods and two of the 220 GiB ones. The optimum puts six of those
pods three to a 4-GPU 3.92 node, each beside one small pod, and a third one on the 8-GPU nodes: two of those
and the seven small nodes (three patterns, nine nodes, 16.84 USD/h) become four nodes (16.11). No split of
two nodes (`pairs`) leads there, and the correction rounds pack the whole tier, where the other classes
steer the greedy the same way again; the pods of those three patterns packed as a tier of their own go
where the optimum puts them.

This pass does that for groups of three patterns of the plan (all their nodes), and keeps a group's new
nodes when they cost less. Each try is a small pack (the greedy and one correction round, see `try_group`),
so the tries are bounded (`GROUP_BUDGET` per call) and spent on the groups most above their lower bound,
relatively, first; a group that saved nothing is not tried again while its patterns stand. Plans of fewer
than `MIN_PATTERNS` patterns are left alone: there three patterns are most of the tier, which the
correction rounds have just packed as a whole (on the Alibaba replay's 827 tiers that get correction rounds,
all of 2 to 16 pods, no group of three of four patterns packed cheaper).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.domain.packing.correction import corrected, pod_floor, worth_more_work
from gpu_autoscaler.domain.packing.kinds import Opened
from gpu_autoscaler.domain.packing.single import single_class

if TYPE_CHECKING:
    from gpu_autoscaler.domain.packing.kinds import Kinds

__all__ = ["GROUP", "GROUP_BUDGET", "MAX_PATTERNS", "MIN_PATTERNS", "regroup", "try_group"]

Greedy = Callable[[np.ndarray, np.ndarray], list[Opened]]
"""(demand [C], class weights [C]) → the pattern greedy's nodes for that demand (`binpack._greedy`)."""

GROUP = 3
"""Patterns packed again together."""
GROUP_BUDGET = 16
"""Groups packed again per call at most (each is two greedy passes of its pods: a few milliseconds)."""
MIN_PATTERNS = 5
"""Plans of fewer patterns are left as they are."""
MAX_PATTERNS = 40
"""Of a plan of more patterns, groups are drawn from the 40 most above their own lower bound, relatively
(C(40, 3) = 9,880 groups ranked at once), so ranking stays a few milliseconds however large the plan."""
_EPS = 1e-9


def regroup(opened: list[Opened], req: np.ndarray, kinds: Kinds, weights: np.ndarray, greedy: Greedy,
            ) -> list[Opened]:
    """`opened` with groups of patterns packed again while that saves money; `opened` itself when nothing
    does (a new list otherwise; `opened` is unchanged). `weights`: the tier's first class weights."""
    entries = [Opened(e.kind, e.counts.copy(), e.copies) for e in opened if e.copies > 0]
    if kinds.limit is not None or len(entries) < MIN_PATTERNS:
        return opened
    floor = pod_floor(req, kinds)
    # Every class on the plan fits some kind; an infinite row is a class absent from it (0 pods × inf).
    floor = np.where(np.isfinite(floor), floor, 0.0)
    ids = list(range(len(entries)))
    next_id = len(entries)
    tried: set[frozenset[int]] = set()
    budget = GROUP_BUDGET
    moved = False
    while budget > 0 and len(entries) >= MIN_PATTERNS:
        found = None
        for group in _ranked(entries, floor, kinds):
            key = frozenset(ids[i] for i in group)
            if key in tried:
                continue
            budget -= 1
            pods = sum((entries[i].counts * entries[i].copies for i in group), np.zeros(req.shape[0], np.int64))
            price = sum(float(kinds.price[entries[i].kind]) * entries[i].copies for i in group)
            found = try_group(pods, price, req, kinds, weights, greedy)
            if found is not None:
                break
            tried.add(key)
            if budget == 0:
                break
        if found is None:
            break
        entries = [e for i, e in enumerate(entries) if i not in group]
        ids = [x for i, x in enumerate(ids) if i not in group]
        for e in found:
            same = next((i for i, old in enumerate(entries)
                         if old.kind == e.kind and np.array_equal(old.counts, e.counts)), None)
            if same is None:
                entries.append(Opened(e.kind, e.counts.copy(), e.copies))
                ids.append(next_id)
            else:
                # A pattern whose copies change is a new one: groups it was in may save now.
                entries[same].copies += e.copies
                ids[same] = next_id
            next_id += 1
        moved = True
    return entries if moved else opened


def try_group(pods: np.ndarray, price: float, req: np.ndarray, kinds: Kinds, weights: np.ndarray,
              greedy: Greedy) -> list[Opened] | None:
    """Nodes holding `pods` for less than `price`, or None if this pack finds none.

    `pods` packed as a tier: one class exactly (`single_class`); else the greedy from the tier's first
    weights and, unless that is within `CLOSE_ENOUGH` of the bound, one correction round (weights halfway to
    what the first plan paid). More rounds, the wide search or the pair split inside each try found a few
    more optima on the benchmark scenarios, none that mattered to the worst, at two to four times the time."""
    wanted = np.flatnonzero(pods)
    if wanted.size == 1:
        plan = single_class(int(wanted[0]), int(pods[wanted[0]]), req, kinds)
    else:
        plan = greedy(pods, weights)
        if worth_more_work(plan, pods, req, kinds):
            plan = corrected(plan, pods, req, kinds, weights, (lambda w: greedy(pods, w),), rounds=1)
    held = sum((e.counts * e.copies for e in plan), np.zeros_like(pods))
    cost = sum(float(kinds.price[e.kind]) * e.copies for e in plan)
    return plan if (held == pods).all() and cost < price - _EPS else None


def _ranked(entries: list[Opened], floor: np.ndarray, kinds: Kinds) -> list[tuple[int, ...]]:
    """Groups of `GROUP` patterns (indices into `entries`), the furthest above their lower bound relatively
    first: 1 − bound / price, the bound being `lower_bound` of the group's pods (linear in the pods per
    resource, so each pattern's part is computed once and groups add them up)."""
    need = np.stack([e.counts * e.copies for e in entries]) @ floor  # [P, R]
    price = np.array([float(kinds.price[e.kind]) * e.copies for e in entries])
    if len(entries) > MAX_PATTERNS:
        alone = 1.0 - need.max(axis=1) / price
        keep = np.sort(np.argsort(-alone, kind="stable")[:MAX_PATTERNS])
    else:
        keep = np.arange(len(entries))
    groups = np.array(list(combinations(keep.tolist(), GROUP)), np.int64)
    if groups.size == 0:
        return []
    room = 1.0 - need[groups].sum(axis=1).max(axis=1) / price[groups].sum(axis=1)
    order = np.argsort(-room, kind="stable")
    return [tuple(g) for g in groups[order][room[order] > _EPS].tolist()]

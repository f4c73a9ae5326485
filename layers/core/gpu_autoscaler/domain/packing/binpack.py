"""Variable-size vector bin packing over pod classes: which nodes to open, and what each holds.

The problem of one tier (a pool and a capacity type): classes with a count and a request vector; kinds
of node with an allocatable vector, a price, and which classes each may hold. Open the cheapest set of
nodes holding every pod. It is NP-hard; the method here is a greedy over *patterns*:

1. Each class gets a weight: what its pods would cost on the cheapest kind if nodes could be filled
   perfectly in the class's scarcest resource (a fractional lower bound on its share of the bill).
2. Repeatedly, for every kind at once (numpy, one pass per class), fill a node from the remaining
   demand, largest weight first; the best pattern is the one with the lowest price per unit of weight
   it holds. The few best kinds are filled again in order of weight per unit of their own bottleneck,
   which suits mixes of CPU-heavy and GPU-heavy pods. In the wider search of the correction rounds a
   kind is refilled only if an upper bound on what one of its nodes can hold (a fractional knapsack per
   resource) could beat the best pattern so far, which prunes without changing the answer. The chosen
   pattern is opened as many times as the remaining demand repeats it, so 10,000 replicas cost a handful
   of iterations.
3. Each opened node is moved to the cheapest kind its contents fit, and groups of nodes are merged into
   one when one node of some kind holds them all for less (each such merge as often as it repeats).
4. Nodes whose pods all fit in the room the others leave are emptied into it (see `relocate`).
5. Small tiers whose plan is more than 3 % above a lower bound are packed again with corrected class
   weights, and with a wider search of fills (see `correction`); then pairs of nodes are split again
   over two cheaper ones (see `pairs`), and the nodes of groups of three patterns packed again as a tier
   of their own (see `regroup`).

The benchmarks compare the result with an exact MILP on the same offerings.
"""

from __future__ import annotations

import math

import numpy as np

from gpu_autoscaler.domain.packing.correction import corrected, worth_more_work
from gpu_autoscaler.domain.packing.kinds import Kinds, Opened
from gpu_autoscaler.domain.packing.pairs import resplit_pairs
from gpu_autoscaler.domain.packing.regroup import regroup
from gpu_autoscaler.domain.packing.relocate import empty_into_holes
from gpu_autoscaler.domain.packing.single import single_class

__all__ = ["Kinds", "Opened", "cheapest_kind", "class_weights", "pack"]

_REFINE = 2
"""Kinds whose fill is redone in their own bottleneck order each iteration."""
_LEADERS = 3
"""How many of a kind's bulkiest classes lead a fill of their own, for the best kind of each iteration."""
_SMALL = 16
"""Up to this many candidate classes a residual fill steps in plain Python (see `_residual_steps`)."""
_RUN = 8
"""Steps of a one-pod-at-a-time fill first scored at once when the same class keeps being picked."""
_RUN_MAX = 256
"""The span doubles while the class keeps winning, up to this many steps."""
_TIE = 1e-9
"""Relative difference below which two fill scores are equal (the first class wins)."""
_ABSORB_ROUNDS = 64
"""At most this many groups of nodes are merged per pass (each round merges one group)."""
_EPS = 1e-9


def class_weights(req: np.ndarray, kinds: Kinds) -> np.ndarray:
    """[C] the fractional cost of one pod of each class on its cheapest kind (inf if it fits none)."""
    cap = kinds.cap.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = req[:, None, :] / cap[None, :, :]
    share = np.where(req[:, None, :] == 0, 0.0, share)
    share = np.where(np.isnan(share), np.inf, share)
    dominant = share.max(axis=2)
    fits = (dominant <= 1.0) & kinds.feasible
    cost = np.where(fits, dominant * kinds.price[None, :], np.inf)
    if cost.shape[1] == 0:
        return np.full(req.shape[0], np.inf)
    return cost.min(axis=1)


def _fill_all(order: np.ndarray, rem: np.ndarray, req: np.ndarray, kinds: Kinds, nz: list[np.ndarray],
              rows: np.ndarray | None = None) -> np.ndarray:
    """[K, C] one node of every kind (or of the kinds in `rows`) filled from `rem`, classes taken in `order`."""
    cap = kinds.cap if rows is None else kinds.cap[rows]
    feasible = kinds.feasible if rows is None else kinds.feasible[:, rows]
    free = cap.copy()
    counts = np.zeros((cap.shape[0], req.shape[0]), np.int64)
    # Only classes with pods left that one of these kinds may hold take room (a refill after a class ran
    # out typically concerns a few kinds and a few classes).
    for c in order[(rem[order] > 0) & feasible[order].any(axis=1)]:
        need = nz[c]
        if need.size:
            room = (free[:, need] // req[c, need]).min(axis=1)
            np.minimum(room, rem[c], out=room)
        else:
            room = np.full(cap.shape[0], rem[c], np.int64)
        room[~feasible[c]] = 0
        counts[:, c] = room
        free -= room[:, None] * req[c]
    return counts


def _fill_one(k: int, order: np.ndarray, rem: np.ndarray, req: np.ndarray, kinds: Kinds,
              nz: list[np.ndarray]) -> np.ndarray:
    """One node of kind `k` filled from `rem`, classes taken in `order`, each as many pods as still fit."""
    counts = np.zeros(req.shape[0], np.int64)
    order = order[(rem[order] > 0) & kinds.feasible[order, k]]
    for c, n in _take_in_order(order, req, rem, kinds.cap[k].copy(), nz):
        counts[c] = n
    return counts


def _take_in_order(order: np.ndarray, req: np.ndarray, limit: np.ndarray, free: np.ndarray,
                   nz: list[np.ndarray] | None = None) -> list[tuple[int, int]]:
    """Rows of `req` in `order`, each taken as many times as still fits in `free` (at most `limit`), as
    (row, times) pairs; `free` is used up in place. `nz[i]` are row i's non-zero columns, when known.

    Room only shrinks, so a row that does not fit now never will: the next row to take is the first
    later one that fits, found for all of them at once rather than by visiting each.
    """
    taken: list[tuple[int, int]] = []
    rows = req[order]
    at = 0
    while at < order.size:
        fitting = np.flatnonzero((rows[at:] <= free).all(axis=1))
        if fitting.size == 0:
            break
        at += int(fitting[0])
        i = int(order[at])
        need = nz[i] if nz is not None else np.flatnonzero(req[i])
        room = int((free[need] // req[i, need]).min()) if need.size else int(limit[i])
        n = min(room, int(limit[i]))
        taken.append((i, n))
        free -= n * req[i]
        at += 1
    return taken


def _fills_led_by_each(k: int, w: np.ndarray, rem: np.ndarray, req: np.ndarray, kinds: Kinds, share: np.ndarray,
                       holds: np.ndarray, wide: bool = False) -> list[np.ndarray]:
    """Fills of kind `k` that start with as many pods as fit of one of its bulkiest classes, then the residual.

    A fill that takes the best-scoring pod each step can stop one bulky pod short of a much better node
    (two 220 GiB pods and small ones, where three and small ones fit); leading with each bulky class
    in turn finds those. `wide` also leads with one pod fewer than fit: one 4-GPU pod beside two
    2-GPU 192 GiB pods on an 8-GPU node, where two 4-GPU pods or three 192 GiB ones fill it alone.
    `share`: [C] each class's bottleneck share of the kind's room (`_bottleneck_shares`); `holds`: see
    `_fill_residual`.
    """
    by_share = np.argsort(-share)
    bulky = by_share[((rem > 0) & kinds.feasible[:, k] & (share <= 1.0))[by_share]][:_LEADERS].tolist()
    out = []
    for c in bulky:
        most = min(int(rem[c]), int(1.0 // share[c]) if share[c] > 0 else int(rem[c]))
        for n in (most, most - 1) if wide and most > 1 else (most,):
            lead = np.zeros(req.shape[0], np.int64)
            lead[c] = n
            out.append(_fill_residual(k, w, rem, req, kinds, holds, lead))
    return out


def _fill_residual(k: int, w: np.ndarray, rem: np.ndarray, req: np.ndarray, kinds: Kinds, holds: np.ndarray,
                   start: np.ndarray | None = None) -> np.ndarray:
    """One node of kind `k`, a pod at a time: the pod worth most per share of the room still free.

    Unlike a fixed order, this notices which resource has become binding as the node fills (after three
    220 GiB pods, memory), and then prefers the pods that are light in it. Scores within `_TIE` of the
    best are ties, won by the first class: classes bound by the same resource (MIG slices) score the same
    but for rounding, which must not make the fill alternate between them.

    A node of small pods takes hundreds of steps, mostly the same class again, so once a class has been
    picked twice running the next steps are scored at once for the case that it keeps being picked (a
    span that doubles while the class keeps winning), and the run is taken up to the first step that
    would pick another class. The picks are exactly those of one pod at a time (room is whole numbers,
    exact in float64; a class fits exactly when its share of the free room is at most 1).

    `holds`: [C] the classes an empty node of kind `k` may hold (`_Fills.holds`): only those with pods left
    can ever be picked.
    """
    counts = np.zeros(req.shape[0], np.int64) if start is None else start.copy()
    free = kinds.cap[k].astype(np.float64) - counts @ req
    live = np.flatnonzero(holds & (rem > counts))
    if live.size == 0:
        return counts
    reqf = req[live].astype(np.float64)
    left = (rem - counts)[live]
    value = w[live]
    zero = reqf == 0
    if live.size <= _SMALL:
        taken = _residual_steps(free, left, reqf, value, zero)
        counts[live] += taken
        return counts
    previous = -1
    span = _RUN
    with np.errstate(divide="ignore", invalid="ignore"):
        while True:
            share = np.where(zero, 0.0, reqf / free).max(axis=1)
            fits = (share <= 1.0) & (left > 0)
            if not fits.any():
                return counts
            score = np.where(fits, value / np.maximum(share, _EPS), -np.inf)
            best = score.max()
            i = int((score >= best - _TIE * best).argmax())
            run = 1
            if i == previous:
                more, span = _repeats(i, free, left, reqf, value, zero, span)
                run += more
            else:
                span = _RUN
            previous = i
            counts[live[i]] += run
            left[i] -= run
            free -= run * reqf[i]


def _residual_steps(free: np.ndarray, left: np.ndarray, reqf: np.ndarray, value: np.ndarray, zero: np.ndarray,
                    ) -> np.ndarray:
    """`_fill_residual`'s loop for a few classes, in plain Python floats: [L] pods taken of each.

    With a handful of classes a step is a few dozen float operations, which Python does faster than
    numpy sets up the dozen array operations of a vectorised step. The arithmetic is the same IEEE
    double arithmetic in the same order, so the picks are the same. Short streaks (a class winning a few
    times between others, as MIG pods of different shapes do) are stepped; once a class has won `_RUN`
    times running, the rest of its run goes to `_repeats` as in the vectorised loop.
    """
    rows = [[(r, x) for r, x in enumerate(row) if x > 0] for row in reqf.tolist()]
    room = free.tolist()
    remaining = left.tolist()
    worth = value.tolist()
    n = len(rows)
    taken = [0] * n
    previous = -1
    streak = 0
    span = _RUN
    while True:
        best = -math.inf
        scores = [-math.inf] * n
        for j in range(n):
            if remaining[j] <= 0:
                continue
            share = 0.0
            for r, x in rows[j]:
                f = room[r]
                if x > f:
                    share = math.inf
                    break
                ratio = x / f
                if ratio > share:
                    share = ratio
            if share > 1.0:
                continue
            score = worth[j] / (share if share > _EPS else _EPS)
            scores[j] = score
            if score > best:
                best = score
        if best == -math.inf:
            return np.array(taken, np.int64)
        threshold = best - _TIE * best
        i = next(j for j in range(n) if scores[j] >= threshold)
        run = 1
        streak = streak + 1 if i == previous else 1
        if streak >= _RUN:
            more, span = _repeats(i, np.array(room), np.array(remaining, np.int64), reqf, value, zero, span)
            run += more
        else:
            span = _RUN
        previous = i
        taken[i] += run
        remaining[i] -= run
        for r, x in rows[i]:
            room[r] -= run * x


def _repeats(i: int, free: np.ndarray, left: np.ndarray, reqf: np.ndarray, value: np.ndarray, zero: np.ndarray,
             span: int) -> tuple[int, int]:
    """How many of the next steps after picking class `i` at `free` would pick `i` again (at most `span`),
    and the span to look at next time (twice as far if all of this one did)."""
    need = reqf[i] > 0
    room = int((free[need] // reqf[i][need]).min()) if need.any() else span + 1
    horizon = min(int(left[i]), room, span + 1) - 1
    if horizon <= 0:
        return 0, span
    frees = free[None, :] - np.arange(1, horizon + 1, dtype=np.float64)[:, None] * reqf[i][None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(zero[None, :, :], 0.0, reqf[None, :, :] / frees[:, None, :]).max(axis=2)  # [H, L]
    # Only class i's count changes over the span, and the span never exhausts it.
    fits = (share <= 1.0) & (left > 0)[None, :]
    score = np.where(fits, value[None, :] / np.maximum(share, _EPS), -np.inf)
    best = score.max(axis=1, keepdims=True)
    again = fits.any(axis=1) & ((score >= best - _TIE * best).argmax(axis=1) == i)
    stop = np.flatnonzero(~again)
    if stop.size:
        return int(stop[0]), _RUN
    return horizon, min(2 * span, _RUN_MAX)


def cheapest_kind(counts: np.ndarray, req: np.ndarray, kinds: Kinds, left: np.ndarray | None = None) -> int:
    """The cheapest kind that may hold and fits these contents; −1 when none does."""
    present = counts > 0
    used = counts @ req
    ok = kinds.feasible[present].all(axis=0) & (kinds.cap >= used).all(axis=1)
    if left is not None:
        ok &= left > 0
    if not ok.any():
        return -1
    prices = np.where(ok, kinds.price, np.inf)
    return int(prices.argmin())


def pack(demand: np.ndarray, req: np.ndarray, kinds: Kinds, weights: np.ndarray | None = None) -> list[Opened]:
    """Nodes holding as much of `demand` as the kinds allow; classes that fit no kind stay out.

    With `kinds.limit` (reservations) the nodes are at most the limit of each kind, and what does not fit
    is left for the caller to place elsewhere. Without `weights`, the greedy starts from `class_weights`
    and small tiers are packed again with corrected weights (see `correction`).
    """
    if len(kinds) == 0 or demand.sum() == 0:
        return []
    wanted = np.flatnonzero(demand)
    if wanted.size == 1 and kinds.limit is None:
        return single_class(int(wanted[0]), int(demand[wanted[0]]), req, kinds)
    if weights is not None:
        return _greedy(demand, req, kinds, weights)
    w = class_weights(req, kinds)
    first = _greedy(demand, req, kinds, w)
    if not worth_more_work(first, demand, req, kinds):
        return first
    best = corrected(first, demand, req, kinds, w, (lambda better: _greedy(demand, req, kinds, better),
                                                    lambda better: _greedy(demand, req, kinds, better, wide=True)))
    resplit = resplit_pairs(best, req, kinds)
    best = resplit if _cost(resplit, kinds) < _cost(best, kinds) - _EPS else best
    return regroup(best, req, kinds, w, lambda pods, weights: _greedy(pods, req, kinds, weights))


def _greedy(demand: np.ndarray, req: np.ndarray, kinds: Kinds, w: np.ndarray, *, wide: bool = False,
            ) -> list[Opened]:
    """Steps 2–4 of the module's method with class weights `w`. `wide` searches more fills each round:
    the led fills of every refined kind, not only the best one's, and with one lead pod fewer (see
    `_fills_led_by_each`); the correction rounds of small tiers use it."""
    rem = np.where(np.isfinite(w), demand, 0).astype(np.int64)
    w = np.where(np.isfinite(w), w, 0.0)
    nz = [np.flatnonzero(req[c] > 0) for c in range(req.shape[0])]
    order = np.argsort(-w, kind="stable")
    left = kinds.limit.astype(np.int64).copy() if kinds.limit is not None else None
    opened: list[Opened] = []
    # Fills are cached: demand only shrinks, and a fill stays what it was as long as the remaining demand
    # still covers every pod it took, so each round recomputes only the fills that took a depleted class.
    counts = _fill_all(order, rem, req, kinds, nz)
    fills = _Fills(w, req, kinds, nz, wide)
    while rem.any():
        stale = np.flatnonzero((counts > rem).any(axis=1))
        if stale.size:
            counts[stale] = _fill_all(order, rem, req, kinds, nz, stale)
        value = counts @ w
        usable = value > _EPS
        if left is not None:
            usable &= left > 0
        if not usable.any():
            break
        efficiency = np.where(usable, kinds.price / np.where(usable, value, 1.0), np.inf)
        ranked = np.argsort(efficiency)[:_REFINE]
        best = int(ranked[0])
        best_counts, best_eff = counts[best], efficiency[best]
        for rank, k in enumerate(int(k) for k in ranked):
            if not np.isfinite(efficiency[k]):
                break
            for alt in fills.plain(k, rem, best_eff):
                alt_value = float(alt @ w)
                if alt_value > _EPS and kinds.price[k] / alt_value < best_eff - _EPS:
                    best, best_counts, best_eff = k, alt, kinds.price[k] / alt_value
            for alt in (fills.led(k, rem, best_eff) if rank == 0 or wide else ()):
                alt_value = float(alt @ w)
                if alt_value > _EPS and kinds.price[k] / alt_value < best_eff - _EPS:
                    best, best_counts, best_eff = k, alt, kinds.price[k] / alt_value
        best_counts = best_counts.copy()
        present = best_counts > 0
        copies = int((rem[present] // best_counts[present]).min())
        if left is not None:
            copies = min(copies, int(left[best]))
            left[best] -= copies
            if left[best] == 0:
                counts[best] = 0
        opened.append(Opened(best, best_counts, copies))
        rem -= copies * best_counts
    return _improve(opened, req, kinds)


def _cost(opened: list[Opened], kinds: Kinds) -> float:
    return float(sum(kinds.price[e.kind] * e.copies for e in opened))


class _Fills:
    """Alternative fills of single kinds, cached while the remaining demand still covers them."""

    def __init__(self, w: np.ndarray, req: np.ndarray, kinds: Kinds, nz: list[np.ndarray], wide: bool) -> None:
        self.w, self.req, self.kinds, self.nz, self.wide = w, req, kinds, nz, wide
        self.shares = _bottleneck_shares(req, kinds)
        self._orders: dict[int, np.ndarray] = {}
        self._plain: dict[int, list[np.ndarray]] = {}
        self._led: dict[int, list[np.ndarray]] = {}
        self._bounds: dict[int, tuple[int, float, bool]] = {}
        """Per kind: the demand left when its bound was computed, the bound, whether it counts pods."""
        self._holds: dict[int, np.ndarray] = {}

    def plain(self, k: int, rem: np.ndarray, best_eff: float) -> list[np.ndarray]:
        """A fill in this kind's own density order and a fill by residual score, unless (in a wide search)
        neither could beat `best_eff`."""
        plain = self._plain.get(k)
        if plain is None or _stale(plain, rem):
            if self.wide and not self._may_beat(k, rem, best_eff):
                return []
            plain = [
                _fill_one(k, self._order(k), rem, self.req, self.kinds, self.nz),
                _fill_residual(k, self.w, rem, self.req, self.kinds, self.holds(k)),
            ]
            self._plain[k] = plain
        return plain

    def led(self, k: int, rem: np.ndarray, best_eff: float) -> list[np.ndarray]:
        """The fills led by each bulky class, unless (in a wide search) none could beat `best_eff`."""
        led = self._led.get(k)
        if led is None or _stale(led, rem):
            if self.wide and not self._may_beat(k, rem, best_eff):
                return []
            led = _fills_led_by_each(k, self.w, rem, self.req, self.kinds, self.shares[k], self.holds(k), self.wide)
            self._led[k] = led
        return led

    def holds(self, k: int) -> np.ndarray:
        """[C] the classes an empty node of kind `k` may hold: allowed there and within its room. Fixed for the
        greedy's run, and asked by every residual fill of the kind (hundreds per tier of a large burst)."""
        found = self._holds.get(k)
        if found is None:
            found = self._holds[k] = self.kinds.feasible[:, k] & (self.req <= self.kinds.cap[k]).all(axis=1)
        return found

    def _order(self, k: int) -> np.ndarray:
        """Kind `k`'s density order: it depends only on the weights, fixed for the greedy's run."""
        found = self._orders.get(k)
        if found is None:
            found = self._orders[k] = _density_order(self.w, self.shares[k])
        return found

    def _may_beat(self, k: int, rem: np.ndarray, best_eff: float) -> bool:
        """Whether some fill of kind `k` could be worth more per dollar than `best_eff`: an exact prune by
        an upper bound on its weight (the cheap one first, the one that counts pods if that does not
        settle it), kept per kind while the demand stays the same.

        Only the wide search asks: it makes up to six led fills per refined kind, which the bound often
        spares. The plain search makes at most three per round, and three of every four bounds there
        failed to prune (the 1,000-pod burst: 94 bounds cost as much as the fills they spared, 6 of its
        55 ms); the plans are the same either way."""
        left = int(rem.sum())
        found = self._bounds.get(k)
        if found is not None and found[0] != left and not self._beats(k, found[1], best_eff):
            # Demand only shrinks, and a bound on less demand is never higher: an older bound that cannot
            # beat `best_eff` settles it without being computed again.
            return False
        if found is None or found[0] != left:
            found = (left, _value_bound(k, self.w, rem, self.req, self.kinds, self.holds(k), counted=False), False)
        if self._beats(k, found[1], best_eff) and not found[2]:
            found = (left, _value_bound(k, self.w, rem, self.req, self.kinds, self.holds(k), counted=True), True)
        self._bounds[k] = found
        return self._beats(k, found[1], best_eff)

    def _beats(self, k: int, bound: float, best_eff: float) -> bool:
        bound *= 1 + _TIE
        return bound > _EPS and self.kinds.price[k] / bound < best_eff - _EPS


def _value_bound(k: int, w: np.ndarray, rem: np.ndarray, req: np.ndarray, kinds: Kinds, holds: np.ndarray, *,
                 counted: bool) -> float:
    """An upper bound on the weight one node of kind `k` can hold from `rem` (`holds`: see `_fill_residual`).

    Per resource every class needs (pods always): the node's room in it times the best weight per unit
    of it; with `counted`, the fractional knapsack over that resource alone (classes by weight per unit,
    whole counts until the room runs out, then a fraction). The least over the resources. On a one-GPU
    kind either is the weightiest class that fits, which a fill reaches.
    """
    live = holds & (rem > 0)
    if not live.any():
        return 0.0
    need = req[live]
    usable = (need > 0).all(axis=0)
    if not usable.any():
        return float("inf")
    need = need[:, usable].astype(np.float64)
    value = w[live]
    density = value[:, None] / need
    if not counted:
        return float((density.max(axis=0) * kinds.cap[k][usable]).min())
    count = rem[live].astype(np.float64)
    order = np.argsort(-density, axis=0, kind="stable")  # [L, U]: each resource's classes, best first
    need = need[order, np.arange(need.shape[1])]
    total = need * count[order]
    before = np.cumsum(total, axis=0) - total
    take = np.clip((kinds.cap[k][usable] - before) / need, 0.0, count[order])
    return float((value[order] * take).sum(axis=0).min())


def _stale(fills: list[np.ndarray], rem: np.ndarray) -> bool:
    return any((fill > rem).any() for fill in fills)


def _bottleneck_shares(req: np.ndarray, kinds: Kinds) -> np.ndarray:
    """[K, C] the largest share of a kind's room one pod of each class takes (inf where it has none of a
    resource the class needs)."""
    cap = kinds.cap.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(req[None, :, :] == 0, 0.0, req[None, :, :] / cap[:, None, :])
    return np.where(np.isnan(share), np.inf, share).max(axis=2)


def _density_order(w: np.ndarray, share: np.ndarray) -> np.ndarray:
    """Classes by weight per unit of a kind's room they take (`share`: their bottleneck share of it)."""
    density = np.where(share > 0, w / np.where(share > 0, share, 1.0), 0.0)
    return np.argsort(-density, kind="stable")


def _improve(opened: list[Opened], req: np.ndarray, kinds: Kinds) -> list[Opened]:
    """Downsize each pattern to its cheapest kind, then absorb groups of nodes into one while it saves money."""
    if kinds.limit is not None:
        # Reservations: the greedy already counted its nodes against what is left of each.
        return opened
    entries = [e for e in opened if e.copies > 0]
    if not entries:
        return entries
    facts = _Facts(req, kinds)
    used, share = facts.of(np.stack([e.counts for e in entries]))
    cheaper = facts.cheapest(used, share)
    for e, k in zip(entries, cheaper.tolist(), strict=True):
        if k >= 0 and kinds.price[k] < kinds.price[e.kind] - _EPS:
            e.kind = k
    absorbed = _absorb(entries, facts, used, share)
    emptied = empty_into_holes([(e.kind, e.counts, e.copies) for e in absorbed], req, kinds)
    if emptied is None:
        return absorbed
    relocated = [Opened(k, counts, copies) for k, counts, copies in emptied]
    return relocated if _cost(relocated, kinds) < _cost(absorbed, kinds) - _EPS else absorbed


class _Facts:
    """What a node's contents ask of every kind: room used, and its share of each kind's room."""

    def __init__(self, req: np.ndarray, kinds: Kinds) -> None:
        self.req = req
        self.kinds = kinds
        self.cap = kinds.cap.astype(np.float64)
        self.blocked = (~kinds.feasible).astype(np.int64)

    def of(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[N, R] room used and [N, K] bottleneck share (inf where a kind may not hold the contents)."""
        used = (counts @ self.req).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(used[:, None, :] == 0, 0.0, used[:, None, :] / self.cap[None, :, :]).max(axis=2)
        allowed = ((counts > 0).astype(np.int64) @ self.blocked) == 0
        return used, np.where(allowed, share, np.inf)

    def cheapest(self, used: np.ndarray, share: np.ndarray) -> np.ndarray:
        """[N] the cheapest kind holding each row's contents (−1 when none does): `cheapest_kind` per row."""
        ok = np.isfinite(share) & (self.kinds.cap[None, :, :] >= used[:, None, :]).all(axis=2)
        best = np.where(ok, self.kinds.price[None, :], np.inf).argmin(axis=1)
        return np.where(ok.any(axis=1), best, -1)


def _absorb(entries: list[Opened], facts: _Facts, used: np.ndarray, share: np.ndarray) -> list[Opened]:
    """Repeatedly replace several nodes by one node of some kind that holds all their pods for less.

    For each kind, whole nodes are taken greedily by price per unit of the kind's room they would use;
    the kind with the largest saving wins the round. This catches what a pattern greedy misses at the
    end of a pass: three half-empty 4-slot nodes that one 16-slot node holds for less. A merge is made
    as many times as its nodes allow (sixty single-pod nodes into eight-pod ones is one round, not
    eight), so the rounds go to different merges. Per-node facts (room used, kinds allowed, share of
    each kind) are computed once per node pattern, not per round.
    """
    if sum(e.copies for e in entries) < 2:
        return entries
    kinds = facts.kinds
    prices = np.array([kinds.price[e.kind] for e in entries])
    copies = np.array([e.copies for e in entries], np.int64)
    for _ in range(_ABSORB_ROUNDS):
        best = _best_absorption(used, share, prices, copies, facts.cap, kinds.price)
        if best is None:
            break
        k, taken = best
        # The same merge saves the same again while its nodes last: make it as many times at once.
        times = min(int(copies[e]) // n for e, n in taken)
        counts = np.zeros(facts.req.shape[0], np.int64)
        for e, n in taken:
            entries[e].copies -= n * times
            copies[e] -= n * times
            counts += n * entries[e].counts
        row_used, row_share = facts.of(counts[None, :])
        cheaper = int(facts.cheapest(row_used, row_share)[0])
        merged = Opened(cheaper if cheaper >= 0 else k, counts, times)
        entries.append(merged)
        used = np.vstack([used, row_used])
        share = np.vstack([share, row_share])
        prices = np.append(prices, kinds.price[merged.kind])
        copies = np.append(copies, times)
    return [e for e in entries if e.copies > 0]


def _best_absorption(used: np.ndarray, share: np.ndarray, prices: np.ndarray, copies: np.ndarray, cap: np.ndarray,
                     kind_prices: np.ndarray) -> tuple[int, list[tuple[int, int]]] | None:
    """The kind and the nodes it absorbs that save the most, or None when nothing saves money."""
    alive = np.flatnonzero(copies > 0)
    if alive.size < copies.size:
        # Nodes merged away stay in the arrays (their positions name entries); leave them out here.
        found = _best_absorption(used[alive], share[alive], prices[alive], copies[alive], cap, kind_prices)
        return None if found is None else (found[0], [(int(alive[e]), n) for e, n in found[1]])
    fits = share <= 1.0
    if (fits * copies[:, None]).sum(axis=0).max(initial=0) < 2:
        return None
    # Upper bound of each kind's saving: the nodes it could take, priced by their share of its room
    # (fractional knapsack), capped by what all of them cost; kinds are tried best bound first and
    # the search stops once no bound beats the best saving found.
    with np.errstate(divide="ignore", invalid="ignore"):
        density = np.where(fits, prices[:, None] / np.maximum(share, _EPS), 0.0)
        whole = np.where(fits, np.minimum(copies[:, None], np.floor(1.0 / np.maximum(share, _EPS))), 0)
    bound = np.minimum((whole * prices[:, None]).sum(axis=0), density.max(axis=0, initial=0.0)) - kind_prices
    bound = np.where(whole.sum(axis=0) >= 2, bound, -np.inf)
    best: tuple[float, int, list[tuple[int, int]]] | None = None
    for k in np.argsort(-bound):
        if bound[k] <= _EPS or (best is not None and bound[k] <= best[0] + _EPS):
            break
        members = np.flatnonzero(fits[:, k])
        order = members[np.argsort(-density[members, k], kind="stable")]
        # Members in order, each taking as many of its copies as still fit.
        taken = _take_in_order(order, used, copies, cap[k].copy())
        nodes = sum(n for _, n in taken)
        saving = sum(n * prices[e] for e, n in taken) - kind_prices[k]
        if nodes >= 2 and saving > _EPS and (best is None or saving > best[0]):
            best = (saving, int(k), taken)
    return None if best is None else (best[1], best[2])

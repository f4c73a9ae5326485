"""Variable-size vector bin packing over pod classes: which nodes to open, and what each holds.

The problem of one tier (a pool and a capacity type): classes with a count and a request vector; kinds
of node with an allocatable vector, a price, and which classes each may hold. Open the cheapest set of
nodes holding every pod. It is NP-hard; the method here is a greedy over *patterns*:

1. Each class gets a weight: what its pods would cost on the cheapest kind if nodes could be filled
   perfectly in the class's scarcest resource (a fractional lower bound on its share of the bill).
2. Repeatedly, for every kind at once (numpy, one pass per class), fill a node from the remaining
   demand, largest weight first; the best pattern is the one with the lowest price per unit of weight
   it holds. The few best kinds are filled again in order of weight per unit of their own bottleneck,
   which suits mixes of CPU-heavy and GPU-heavy pods. The chosen pattern is opened as many times as
   the remaining demand repeats it, so 10,000 replicas cost a handful of iterations.
3. Each opened node is moved to the cheapest kind its contents fit, and groups of nodes are merged into
   one when one node of some kind holds them all for less.

The benchmarks compare the result with an exact MILP on the same offerings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Kinds", "Opened", "cheapest_kind", "class_weights", "pack", "single_class"]

_REFINE = 2
"""Kinds whose fill is redone in their own bottleneck order each iteration."""
_LEADERS = 3
"""How many of a kind's bulkiest classes lead a fill of their own, for the best kind of each iteration."""
_ABSORB_ROUNDS = 64
"""At most this many groups of nodes are merged per pass (each round merges one group)."""
_EPS = 1e-9


@dataclass(frozen=True)
class Kinds:
    """The nodes a tier can open."""

    cap: np.ndarray
    """[K, R] allocatable, integer units."""
    price: np.ndarray
    """[K] USD per hour."""
    feasible: np.ndarray
    """[C, K] whether a class may be placed on a kind (selectors, zones, pool, sharing mode)."""
    limit: np.ndarray | None = None
    """[K] how many nodes of each kind exist (capacity reservations); None when unbounded."""

    def __len__(self) -> int:
        return len(self.price)


@dataclass
class Opened:
    kind: int
    counts: np.ndarray
    """[C] pods of each class on one such node."""
    copies: int


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
    for c in order:
        if rem[c] == 0:
            continue
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
    free = kinds.cap[k].copy()
    counts = np.zeros(req.shape[0], np.int64)
    for c in order:
        if rem[c] == 0 or not kinds.feasible[c, k]:
            continue
        need = nz[c]
        room = int((free[need] // req[c, need]).min()) if need.size else int(rem[c])
        room = min(room, int(rem[c]))
        if room > 0:
            counts[c] = room
            free -= room * req[c]
    return counts


def _fills_led_by_each(k: int, w: np.ndarray, rem: np.ndarray, req: np.ndarray, kinds: Kinds) -> list[np.ndarray]:
    """Fills of kind `k` that start with as many pods as fit of one of its bulkiest classes, then the residual.

    A fill that takes the best-scoring pod each step can stop one bulky pod short of a much better node
    (two 220 GiB pods and small ones, where three and small ones fit); leading with each bulky class
    in turn finds those.
    """
    cap = kinds.cap[k].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(req == 0, 0.0, req / cap)
    share = np.where(np.isnan(share), np.inf, share).max(axis=1)
    bulky = [int(c) for c in np.argsort(-share) if rem[c] > 0 and kinds.feasible[c, k] and share[c] <= 1.0]
    out = []
    for c in bulky[:_LEADERS]:
        lead = np.zeros(req.shape[0], np.int64)
        lead[c] = min(int(rem[c]), int(1.0 // share[c]) if share[c] > 0 else int(rem[c]))
        out.append(_fill_residual(k, w, rem, req, kinds, lead))
    return out


def _fill_residual(k: int, w: np.ndarray, rem: np.ndarray, req: np.ndarray, kinds: Kinds,
                   start: np.ndarray | None = None) -> np.ndarray:
    """One node of kind `k`, a pod at a time: the pod worth most per share of the room still free.

    Unlike a fixed order, this notices which resource has become binding as the node fills (after three
    220 GiB pods, memory), and then prefers the pods that are light in it.
    """
    counts = np.zeros(req.shape[0], np.int64) if start is None else start.copy()
    free = kinds.cap[k].astype(np.float64) - counts @ req
    # Only classes the kind may hold, with pods left, and that fit an empty node of it, can ever be picked.
    live = np.flatnonzero(kinds.feasible[:, k] & (rem > counts) & (req <= kinds.cap[k]).all(axis=1))
    if live.size == 0:
        return counts
    reqf = req[live].astype(np.float64)
    left = (rem - counts)[live]
    value = w[live]
    zero = reqf == 0
    while True:
        fits = (left > 0) & (reqf <= free).all(axis=1)
        if not fits.any():
            return counts
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(zero, 0.0, reqf / free).max(axis=1)
        score = np.where(fits, value / np.maximum(share, _EPS), -np.inf)
        i = int(score.argmax())
        counts[live[i]] += 1
        left[i] -= 1
        free -= reqf[i]


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
    is left for the caller to place elsewhere.
    """
    if len(kinds) == 0 or demand.sum() == 0:
        return []
    wanted = np.flatnonzero(demand)
    if wanted.size == 1 and kinds.limit is None:
        return single_class(int(wanted[0]), int(demand[wanted[0]]), req, kinds)
    w = class_weights(req, kinds) if weights is None else weights
    rem = np.where(np.isfinite(w), demand, 0).astype(np.int64)
    w = np.where(np.isfinite(w), w, 0.0)
    nz = [np.flatnonzero(req[c] > 0) for c in range(req.shape[0])]
    order = np.argsort(-w, kind="stable")
    left = kinds.limit.astype(np.int64).copy() if kinds.limit is not None else None
    opened: list[Opened] = []
    # Fills are cached: demand only shrinks, and a fill stays what it was as long as the remaining demand
    # still covers every pod it took, so each round recomputes only the fills that took a depleted class.
    counts = _fill_all(order, rem, req, kinds, nz)
    fills = _Fills(w, req, kinds, nz)
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
            for alt in fills.alternatives(k, rem, leaders=rank == 0):
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


class _Fills:
    """Alternative fills of single kinds, cached while the remaining demand still covers them."""

    def __init__(self, w: np.ndarray, req: np.ndarray, kinds: Kinds, nz: list[np.ndarray]) -> None:
        self.w, self.req, self.kinds, self.nz = w, req, kinds, nz
        self._plain: dict[int, list[np.ndarray]] = {}
        self._led: dict[int, list[np.ndarray]] = {}

    def alternatives(self, k: int, rem: np.ndarray, leaders: bool) -> list[np.ndarray]:
        plain = self._plain.get(k)
        if plain is None or _stale(plain, rem):
            plain = [
                _fill_one(k, _density_order(k, self.w, self.req, self.kinds), rem, self.req, self.kinds, self.nz),
                _fill_residual(k, self.w, rem, self.req, self.kinds),
            ]
            self._plain[k] = plain
        if not leaders:
            return plain
        led = self._led.get(k)
        if led is None or _stale(led, rem):
            led = _fills_led_by_each(k, self.w, rem, self.req, self.kinds)
            self._led[k] = led
        return plain + led


def _stale(fills: list[np.ndarray], rem: np.ndarray) -> bool:
    return any((fill > rem).any() for fill in fills)


def single_class(c: int, n: int, req: np.ndarray, kinds: Kinds) -> list[Opened]:
    """The cheapest nodes for `n` identical pods, exactly: a covering knapsack over pod counts.

    `cost[m]` is the least price holding `m` pods (a node of kind k holds up to `fit[k]`). Past twice the
    largest fit the best price-per-pod kind is used for whole nodes and the dynamic programme covers the
    rest, so the work is bounded by the node sizes, not by `n`.
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
    span = int(min(n, 2 * fit.max()))
    bulk = 0
    if n > span:
        bulk = (n - span + int(fit[bulk_kind]) - 1) // int(fit[bulk_kind])
    rest = n - bulk * int(fit[bulk_kind])
    cost = np.zeros(rest + 1)
    choice = np.zeros(rest + 1, np.int64)
    kinds_usable = np.flatnonzero(usable)
    for m in range(1, rest + 1):
        options = kinds.price[kinds_usable] + cost[np.maximum(m - fit[kinds_usable], 0)]
        best = int(options.argmin())
        cost[m], choice[m] = options[best], kinds_usable[best]
    opened: dict[tuple[int, int], int] = {}
    if bulk:
        opened[(bulk_kind, int(fit[bulk_kind]))] = bulk
    m = rest
    while m > 0:
        k = int(choice[m])
        take = int(min(fit[k], m))
        opened[(k, take)] = opened.get((k, take), 0) + 1
        m -= take
    return [Opened(k, _one(req.shape[0], c, take), copies) for (k, take), copies in opened.items()]


def _one(size: int, c: int, count: int) -> np.ndarray:
    row = np.zeros(size, np.int64)
    row[c] = count
    return row


def _density_order(k: int, w: np.ndarray, req: np.ndarray, kinds: Kinds) -> np.ndarray:
    """Classes by weight per unit of this kind's room they take (their bottleneck share of it)."""
    cap = kinds.cap[k].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(req == 0, 0.0, req / cap)
    share = np.where(np.isnan(share), np.inf, share).max(axis=1)
    density = np.where(share > 0, w / np.where(share > 0, share, 1.0), 0.0)
    return np.argsort(-density, kind="stable")


def _improve(opened: list[Opened], req: np.ndarray, kinds: Kinds) -> list[Opened]:
    """Downsize each pattern to its cheapest kind, then absorb groups of nodes into one while it saves money."""
    if kinds.limit is not None:
        # Reservations: the greedy already counted its nodes against what is left of each.
        return opened
    for entry in opened:
        cheaper = cheapest_kind(entry.counts, req, kinds)
        if cheaper >= 0 and kinds.price[cheaper] < kinds.price[entry.kind] - _EPS:
            entry.kind = cheaper
    return _absorb(opened, req, kinds)


def _absorb(opened: list[Opened], req: np.ndarray, kinds: Kinds) -> list[Opened]:
    """Repeatedly replace several nodes by one node of some kind that holds all their pods for less.

    For each kind, whole nodes are taken greedily by price per unit of the kind's room they would use;
    the kind with the largest saving wins the round. This catches what a pattern greedy misses at the
    end of a pass: three half-empty 4-slot nodes that one 16-slot node holds for less. Per-node facts
    (room used, kinds allowed, share of each kind) are computed once per node pattern, not per round.
    """
    entries = [e for e in opened if e.copies > 0]
    if sum(e.copies for e in entries) < 2:
        return entries
    cap = kinds.cap.astype(np.float64)
    blocked = ~kinds.feasible

    def facts(e: Opened) -> tuple[np.ndarray, np.ndarray]:
        used = (e.counts @ req).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(used == 0, 0.0, used / cap)
        share = np.where(np.isnan(share), np.inf, share).max(axis=1)
        allowed = ~blocked[e.counts > 0].any(axis=0)
        return used, np.where(allowed, share, np.inf)

    rows = [facts(e) for e in entries]
    used = np.stack([r[0] for r in rows])
    share = np.stack([r[1] for r in rows])
    prices = np.array([kinds.price[e.kind] for e in entries])
    copies = np.array([e.copies for e in entries], np.int64)
    for _ in range(_ABSORB_ROUNDS):
        best = _best_absorption(used, share, prices, copies, cap, kinds.price)
        if best is None:
            break
        k, taken = best
        counts = np.zeros(req.shape[0], np.int64)
        for e, n in taken:
            entries[e].copies -= n
            copies[e] -= n
            counts += n * entries[e].counts
        cheaper = cheapest_kind(counts, req, kinds)
        merged = Opened(cheaper if cheaper >= 0 else k, counts, 1)
        entries.append(merged)
        row_used, row_share = facts(merged)
        used = np.vstack([used, row_used])
        share = np.vstack([share, row_share])
        prices = np.append(prices, kinds.price[merged.kind])
        copies = np.append(copies, 1)
    return [e for e in entries if e.copies > 0]


def _best_absorption(used: np.ndarray, share: np.ndarray, prices: np.ndarray, copies: np.ndarray, cap: np.ndarray,
                     kind_prices: np.ndarray) -> tuple[int, list[tuple[int, int]]] | None:
    """The kind and the nodes it absorbs that save the most, or None when nothing saves money."""
    fits = (share <= 1.0) & (copies[:, None] > 0)
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
        free = cap[k].copy()
        taken: list[tuple[int, int]] = []
        absorbed = 0.0
        nodes = 0
        for e in order:
            need = used[e] > 0
            room = int((free[need] // used[e][need]).min()) if need.any() else int(copies[e])
            n = min(room, int(copies[e]))
            if n > 0:
                taken.append((int(e), n))
                free -= n * used[e]
                absorbed += n * prices[e]
                nodes += n
        saving = absorbed - kind_prices[k]
        if nodes >= 2 and saving > _EPS and (best is None or saving > best[0]):
            best = (saving, int(k), taken)
    return None if best is None else (best[1], best[2])

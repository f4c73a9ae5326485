"""After the greedy and its correction rounds: two nodes' pods split again between two cheaper nodes.

A pattern greedy fixes each node's contents once. It can end with 4-GPU pods on small nodes of their own
and 384 GiB pods two to a large-memory node, where a 4-GPU pod beside one 384 GiB pod fills an 8-GPU node
and the other 384 GiB pod fits a cheaper 4-GPU node: each such pair of nodes costs less re-split. This
pass tries, for every two node patterns of the plan, every way of splitting their pods over two nodes
(each on the cheapest kind that holds its part; an empty part is a merge), and makes the best saving
found as many times as both patterns allow, until none saves money. Splits are enumerated only for
pairs holding few pods (`MAX_SPLITS`), and each pair's answer is kept, since kinds do not change.
"""

from __future__ import annotations

import numpy as np

from gpu_autoscaler.domain.packing.kinds import Kinds, Opened

__all__ = ["MAX_SPLITS", "SPLIT_BUDGET", "resplit_pairs"]

MAX_SPLITS = 4096
"""Pairs whose pods split more ways than this are not tried."""
SPLIT_BUDGET = 400
"""At most this many pairs get their splits enumerated per call (each is a few hundred microseconds); a
plan of many patterns tries the pairs it meets first, so the pass stays a small part of a tier's time."""
_ROUNDS = 64
_EPS = 1e-9


def resplit_pairs(opened: list[Opened], req: np.ndarray, kinds: Kinds) -> list[Opened]:
    """`opened` with pairs of nodes re-split while that saves money (a new list; `opened` is unchanged)."""
    entries = [Opened(e.kind, e.counts.copy(), e.copies) for e in opened if e.copies > 0]
    if kinds.limit is not None or sum(e.copies for e in entries) < 2:
        return entries
    blocked = (~kinds.feasible).astype(np.int64)
    known: dict[tuple[bytes, bytes], tuple[float, np.ndarray, int, int] | None] = {}
    for _ in range(_ROUNDS):
        best: tuple[float, int, int, np.ndarray, int, int] | None = None
        for i, a in enumerate(entries):
            for j in range(i, len(entries)):
                b = entries[j]
                if a.copies == 0 or b.copies == 0 or (i == j and a.copies < 2):
                    continue
                key = (a.counts.tobytes(), b.counts.tobytes())
                if key not in known:
                    if len(known) >= SPLIT_BUDGET:
                        continue
                    known[key] = _best_split(a.counts + b.counts, req, kinds, blocked)
                found = known[key]
                if found is None:
                    continue
                saving = kinds.price[a.kind] + kinds.price[b.kind] - found[0]
                if saving > _EPS and (best is None or saving > best[0]):
                    best = (saving, i, j, found[1], found[2], found[3])
        if best is None:
            break
        _, i, j, part, k1, k2 = best
        times = entries[i].copies // 2 if i == j else min(entries[i].copies, entries[j].copies)
        whole = entries[i].counts + entries[j].counts
        entries[i].copies -= times
        entries[j].copies -= times
        entries.append(Opened(k1, part, times))
        if k2 >= 0:
            entries.append(Opened(k2, whole - part, times))
    return [e for e in entries if e.copies > 0]


def _best_split(total: np.ndarray, req: np.ndarray, kinds: Kinds, blocked: np.ndarray,
                ) -> tuple[float, np.ndarray, int, int] | None:
    """The cheapest split of `total` over two nodes: (price, first part, its kind, the other's kind or −1
    when the first part holds everything); None when there are too many splits to try."""
    present = np.flatnonzero(total)
    ways = np.prod(total[present] + 1, dtype=np.float64)
    if ways > MAX_SPLITS:
        return None
    grids = np.meshgrid(*[np.arange(int(total[c]) + 1) for c in present], indexing="ij")
    parts = np.zeros((int(ways), total.size), np.int64)
    parts[:, present] = np.stack([g.ravel() for g in grids], axis=1)
    first_price, first_kind = _cheapest(parts, req, kinds, blocked)
    rest_price, rest_kind = _cheapest(total[None, :] - parts, req, kinds, blocked)
    price = first_price + rest_price
    s = int(price.argmin())
    if not np.isfinite(price[s]):
        return None
    if first_kind[s] < 0:
        # The first part is empty: the other holds everything.
        return float(price[s]), total - parts[s], int(rest_kind[s]), -1
    return float(price[s]), parts[s], int(first_kind[s]), int(rest_kind[s])


def _cheapest(parts: np.ndarray, req: np.ndarray, kinds: Kinds, blocked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[S] the price of the cheapest kind holding each part (0 for an empty part, inf when none does), [S]
    that kind (−1 for an empty part)."""
    used = parts @ req
    ok = ((parts > 0).astype(np.int64) @ blocked == 0) & (kinds.cap[None, :, :] >= used[:, None, :]).all(axis=2)
    prices = np.where(ok, kinds.price[None, :], np.inf)
    kind = prices.argmin(axis=1)
    price = prices[np.arange(parts.shape[0]), kind]
    empty = ~parts.any(axis=1)
    return np.where(empty, 0.0, price), np.where(empty, -1, kind)

"""After the greedy: empty nodes into the room left on others.

The pattern greedy (`binpack.pack`) opens its most efficient patterns first. Pods that are cheap to
hold on small nodes of their own go first, and the bulky pods that come later leave room no pod is left
to fill: thirteen 8-GPU nodes each holding five 128 GiB pods (memory-bound, three GPUs idle) next to
thirty-seven 2-GPU nodes of one small pod each, where the optimum puts the small pods in the idle GPUs.

This pass looks at the plan node by node. A node is emptied when every one of its pods fits in the free
room of other nodes that may hold it (best fit: the receiver with the least room that takes it, so big
holes stay for big pods); its price is saved. Nodes are tried cheapest first, since a cheap node's few
pods are the ones that fit in holes; once a pattern of node fails, its copies are not tried again, as
room only shrinks. Each node's contents then move to the cheapest kind that holds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpu_autoscaler.domain.packing.kinds import Kinds

__all__ = ["empty_into_holes"]


_MANY = 1 << 40

Node = tuple[int, np.ndarray, int]
"""(kind, pods of each class on one node, copies): `binpack.Opened` as plain values."""


def empty_into_holes(opened: Sequence[Node], req: np.ndarray, kinds: Kinds) -> list[Node] | None:
    """The nodes with as many emptied into others' free room as the pass finds; None if none is."""
    copies = [n for _, _, n in opened]
    if sum(copies) < 2:
        return None
    pattern_kind = np.array([k for k, _, _ in opened], np.int64)
    pattern_counts = np.stack([c for _, c, _ in opened])
    pattern_free = kinds.cap[pattern_kind] - pattern_counts @ req
    kind = np.repeat(pattern_kind, copies)
    counts = np.repeat(pattern_counts, copies, axis=0)
    free = np.repeat(pattern_free, copies, axis=0)
    alive = np.ones(kind.size, bool)
    price = kinds.price[kind]
    failed: set[tuple[int, bytes]] = set()
    moved = False
    # Pods of each class each node's free room holds, and their total: a node none of whose classes
    # exceeds what the others hold is worth trying to place; most are not, and are skipped at once.
    # Computed once per pattern, not per copy (a 10,000-pod burst: 131 patterns of 3,452 nodes).
    room = np.repeat(_room(pattern_free, req, kinds, pattern_kind), copies, axis=0)
    total = room.sum(axis=0)
    # Each node's (kind, contents), kept as they change: most nodes are copies skipped on it at once.
    keys = [key for key, n in zip(((int(k), c.tobytes()) for k, c, _ in opened), copies, strict=True)
            for _ in range(n)]
    for d in np.lexsort((counts.sum(axis=1), price)).tolist():
        key = keys[d]
        if key in failed:
            continue
        present = counts[d] > 0
        if (total[present] - room[d, present] < counts[d, present]).any():
            failed.add(key)
            continue
        alive[d] = False
        placed = _place(counts[d], req, kinds, kind, free, alive)
        if placed is None:
            alive[d] = True
            failed.add(key)
            continue
        for r, c, n in placed:
            counts[r, c] += n
            free[r] -= n * req[c]
        counts[d] = 0
        moved = True
        touched = sorted({r for r, _, _ in placed})
        for r in touched:
            keys[r] = (int(kind[r]), counts[r].tobytes())
        room[touched] = _room(free[touched], req, kinds, kind[touched])
        room[d] = 0
        total = room.sum(axis=0)
    if not moved:
        return None
    groups: dict[tuple[int, bytes], int] = {}
    rows: dict[tuple[int, bytes], np.ndarray] = {}
    for node in np.flatnonzero(alive).tolist():
        key = (_cheapest(counts[node], req, kinds, int(kind[node])), counts[node].tobytes())
        groups[key] = groups.get(key, 0) + 1
        rows.setdefault(key, counts[node])
    return [(k, rows[(k, b)], n) for (k, b), n in groups.items()]


def _room(free: np.ndarray, req: np.ndarray, kinds: Kinds, kind: np.ndarray) -> np.ndarray:
    """[N, C] how many pods of each class fit in each node's free room (0 where its kind may not hold the
    class; a class that requests nothing counts as many as any node could hold)."""
    need = req > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        fits = np.where(need[None, :, :], free[:, None, :] // np.where(need, req, 1)[None, :, :], _MANY)
    return np.where(kinds.feasible[:, kind].T, fits.min(axis=2), 0)


def _place(pods: np.ndarray, req: np.ndarray, kinds: Kinds, kind: np.ndarray, free: np.ndarray,
           alive: np.ndarray) -> list[tuple[int, int, int]] | None:
    """Where each pod of `pods` goes in the others' free room, as (node, class, count); None if one cannot."""
    room_left = free.copy()
    out: list[tuple[int, int, int]] = []
    present = np.flatnonzero(pods)
    # Bulkiest first: the scarce big holes go to the pods that need them.
    for c in present[np.argsort(-(req[present] / np.maximum(kinds.cap.max(axis=0), 1)).max(axis=1))]:
        need = req[c] > 0
        usable = alive & kinds.feasible[c, kind]
        if not usable.any():
            return None
        room = np.where(usable, (room_left[:, need] // req[c, need]).min(axis=1) if need.any() else pods[c], 0)
        left = int(pods[c])
        for r in np.flatnonzero(room > 0)[np.argsort(room[room > 0], kind="stable")]:
            n = min(left, int(room[r]))
            out.append((int(r), int(c), n))
            room_left[r] -= n * req[c]
            left -= n
            if left == 0:
                break
        if left:
            return None
    return out


def _cheapest(counts: np.ndarray, req: np.ndarray, kinds: Kinds, current: int) -> int:
    used = counts @ req
    ok = kinds.feasible[counts > 0].all(axis=0) & (kinds.cap >= used).all(axis=1)
    prices = np.where(ok, kinds.price, np.inf)
    best = int(prices.argmin())
    return best if prices[best] < kinds.price[current] - 1e-9 else current

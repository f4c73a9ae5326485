"""Sunk room: the last phase of a consolidation pass, for the nodes Cluster Autoscaler's threshold leaves alone.

A node whose pods request at least the pool's `underutilizedBelow` share of it is busy: the underutilized search does
not weigh it, because moving its pods would take the room the packer bought for the next arrivals (README, the
simulator's eighth round). Some free room was bought for no one: a node that stays (kept by the search, or busy
itself) whose own pods no cheaper new nodes would hold is paid for as long as they run, whoever uses its room — a
p3dn.24xlarge held by one V100 pod, the only type with V100s, has seven such GPUs. Karpenter, which weighs every node,
fills that room by deleting the small nodes whose pods fit there; here a busy node goes when every pod of it fits in
sunk room (`Disruption.into_sunk_room`), within its pool's budget, so nothing is launched for it. On three Alibaba
traces this made ours 5–13 % cheaper and run more pods (docs/economics-rounds.md, the eleventh round).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from gpu_autoscaler.domain.consolidation_floor import FreeRooms
from gpu_autoscaler.domain.consolidation_group import EPS, candidate_order, node_shape
from gpu_autoscaler.domain.packing.fit import fits

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpu_autoscaler.domain.consolidation import _Pass
    from gpu_autoscaler.domain.consolidation_group import GroupNode
    from gpu_autoscaler.domain.consolidation_models import ConsolidationNode
    from gpu_autoscaler.domain.packing.solver import Solver

__all__ = ["into_sunk_room", "is_sunk"]

_LIMIT = 4096
"""Node shapes `_SUNK` keeps per solver; past it, cleared."""


@dataclass(frozen=True, eq=False)
class _Picture:
    """What `into_sunk_room` saw: its busy and staying node objects (held, so their ids are not reused), and the rest
    it reads (the offerings marked unavailable, which nodes took pods earlier in the pass)."""

    busy: tuple[ConsolidationNode, ...]
    stays: tuple[ConsolidationNode, ...]
    rest: tuple[object, ...]

    def same(self, other: _Picture) -> bool:
        """The same node objects (a node object is the same pass after pass until the node changes), in the same
        order, and the rest equal."""
        return (len(self.busy) == len(other.busy) and len(self.stays) == len(other.stays)
                and all(a is b for a, b in zip(self.busy, other.busy, strict=True))
                and all(a is b for a, b in zip(self.stays, other.stays, strict=True)) and self.rest == other.rest)


_SUNK: WeakKeyDictionary[Solver, dict[tuple[object, ...], bool]] = WeakKeyDictionary()
"""Per solver: `is_sunk` by the node's shape (`node_shape`) and the offerings marked unavailable."""
_NONE_FOUND: WeakKeyDictionary[Solver, _Picture] = WeakKeyDictionary()
"""Per solver: what the last `into_sunk_room` that found nothing saw."""


def into_sunk_room(p: _Pass, busy: list[GroupNode], stays: list[GroupNode]) -> None:
    """Busy nodes deleted into sunk room, each decision applied to the pass's picture. Each pod must first fit some
    sunk node's room on its own and all of them their room added up (`_sunk_hosts`), and only then are the nodes with
    room asked whether they are sunk; like the single-node phase, a node like one already found not to fit is not asked
    about again: the sunk room only shrinks during a pass. A pass that sees the very nodes of the last one that found
    nothing, with the budgets not in the way, finds nothing either (`_NONE_FOUND`)."""
    if not busy:
        return
    seen = _Picture(tuple(n.item for n in busy), tuple(d.item for d in stays),
                    (p.unavailable_key, tuple(n.locked for n in busy), tuple(d.locked for d in stays)))
    last = _NONE_FOUND.get(p.solver)
    if last is not None and last.same(seen):
        return
    failed: set[tuple[object, ...]] = set()
    live = [d for d in stays if d.usable and not d.removed]
    rooms: FreeRooms | None = None
    budgeted = found_any = False
    for n in sorted(busy, key=candidate_order):
        assert n.pool is not None
        if n.removed or n.locked:
            continue
        if p.allowance(n.pool, "Underutilized") == 0:
            budgeted = True
            continue
        shape = node_shape(n)
        if shape in failed:
            continue
        if rooms is None:
            rooms = FreeRooms([(d, d.free) for d in live])
        into = _sunk_hosts(p, n, live, rooms)
        found = p.deletion_into(n, into) if into is not None else None
        if found is not None:
            p.apply(found)
            found_any = True
            live = [d for d in live if not d.removed]
            rooms = None  # the destinations' room changed, and the node is gone
            continue
        failed.add(shape)
    if found_any or budgeted:
        _NONE_FOUND.pop(p.solver, None)
    else:
        _NONE_FOUND[p.solver] = seen


def _sunk_hosts(p: _Pass, n: GroupNode, live: list[GroupNode], rooms: FreeRooms) -> list[GroupNode] | None:
    """The other nodes whose sunk room could take the node's pods: each pod fits one of them on its own, and all
    fit their free room added up; None when there are none such. Room first, sunk after: whether a node is sunk
    costs a solve the first time its shape is asked, and most busy nodes fail on room alone. `live`: the staying nodes
    that may take pods, `rooms` their free room (bit i: `live[i]`), kept until a decision changes it."""
    own = rooms.row(n)
    others = ~(1 << own) if own is not None else -1
    per: list[int] = []
    for footprint in n.item.footprints:
        hosts = rooms.holding(footprint) & others
        if not hosts:
            return None
        per.append(hosts)
    with_room = 0
    for hosts in per:
        with_room |= hosts
    room = [(i, d) for i, d in enumerate(live) if with_room >> i & 1]
    if not _fits_together(n, [d for _, d in room]):
        return None
    sunk = 0
    for i, d in room:
        if is_sunk(p, d):
            sunk |= 1 << i
    if not all(hosts & sunk for hosts in per):
        return None
    into = [d for i, d in room if sunk >> i & 1]
    return into if sunk == with_room or _fits_together(n, into) else None  # all sunk: the room just added up


def _fits_together(n: GroupNode, into: Iterable[GroupNode]) -> bool:
    """Whether the node's pods together fit the nodes' free room added up: short of that no placement holds them. A
    node over-committed in some resource (its use above its allocatable) adds none of it, not less than none."""
    room: Counter[str] = Counter()
    for d in into:
        room.update({name: value for name, value in d.free.items() if value > 0})
    return fits(n.item.footprint, room)


def is_sunk(p: _Pass, n: GroupNode) -> bool:
    """Whether the node's free room is paid for as long as its pods run: no cheaper new nodes would hold them, so it
    goes only when they do. Room elsewhere is left out — the question is what the pods cost wherever they go, not
    where they could go now — so the answer depends on the node's shape and the offerings marked unavailable only,
    and is kept by them for as long as the solver (its configuration and catalog) lives."""
    found = p.sunk_known.get(n.name)
    if found is not None:
        return found
    cache = _SUNK.setdefault(p.solver, {})
    key = (node_shape(n), p.unavailable_key)
    found = cache.get(key)
    if found is None:
        plan = p.solver.solve([entry.pod for entry in n.item.pods], unavailable=p.unavailable,
                              source=f"consolidate:sunk:{n.claim.id}")
        found = bool(plan.unschedulable) or sum(c.price_per_hour for c in plan.claims) >= n.price - EPS
        if len(cache) >= _LIMIT:
            cache.clear()
        cache[key] = found
    p.sunk_known[n.name] = found
    return found

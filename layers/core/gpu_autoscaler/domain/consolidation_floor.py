"""The price floor of a node's replacement: a single-node judgement that cannot save, answered without a solve.

Replaying the Alibaba trace under the karpenter-like policy (every node with pods weighed each pass), consolidation
took nine tenths of the replay's CPU, most of it solver calls for single nodes that ended "no saving": the pods
that have no room on any other node need a new node, and every type that holds them costs at least what the node
costs. That much is known before the solve, from what any plan of it must satisfy:

- a pod goes onto another node's free room only if its requests fit there (`fit.fits`; its selector, affinity
  and taints can only keep it off more nodes), so the pods that fit on no other node's free room all go onto new
  nodes or nowhere;
- a new node costs at least its cheapest type's cheapest offering, in any pool, zone or capacity type, and that
  type's allocatable in that pool holds every pod placed on it; so with at most one replacement allowed (Karpenter's
  rule, `max_replacements=1`) it costs at least the cheapest type holding all of those pods together, and with any
  number, at least the cheapest type holding the most expensive one of them alone;
- Spot nodes in a pool that may launch Spot and does not opt in to spot-to-spot are only deleted, never replaced
  (Karpenter's rule: `consolidation_group._deletion_only`), so one stranded pod is enough to refuse them.

When that floor is at or above the node's price (or a stranded pod is on such Spot nodes), every plan the solver could
return is refused (unschedulable, too many replacements, not cheaper, or spot-to-spot: `GroupJudge._decide`), so the
judgement is "no saving" (or "spot-to-spot") without asking. For a group the same holds part by part: its judgement may
drop nodes and look again at the rest (`_swapped`), so a group is answered only when every part of it is
(`GroupJudge.priced_out`, small groups), the stranded pods then being those that fit on no node outside the part.
Replaying the trace, the floor without the Spot rule answered 60,729 of karpenter-like's 100,104 single-node "no saving"
judgements, and none that the solver would have taken; with it, karpenter-like's single-node solves fell from 48,273 to
18,513, and with the group floor its multi-node solves from 12,590 to 8,263; with Spot nodes only deleted (a stranded
pod refuses them), 16,212 and 6,796.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import numpy as np

from gpu_autoscaler.domain.packing.fit import allocatable

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.domain.packing.solver import Solver
    from gpu_autoscaler.models.resources import Resources

__all__ = ["FreeRooms", "TypeRooms", "type_rooms"]

_CACHE_LIMIT = 65536
"""Request vectors whose cheapest type `TypeRooms` keeps; past it, cleared."""


class TypeRooms:
    """Every instance type's allocatable in every pool, with its cheapest offering's price: the cheapest type that
    could hold some requests."""

    def __init__(self, config: Config, catalog: Catalog) -> None:
        rows: list[tuple[float, Mapping[str, int]]] = []
        for instance_type in catalog.instance_types():
            offerings = catalog.offerings_for(instance_type.name)  # cheapest first
            if offerings:
                rows.extend((offerings[0].price_per_hour, allocatable(instance_type, pool, config.overhead))
                            for pool in config.node_pools)
        self.names: tuple[str, ...] = tuple(sorted({name for *_, room in rows for name in room}))
        self._column = {name: i for i, name in enumerate(self.names)}
        self.prices = np.array([row[0] for row in rows], float).reshape(len(rows))
        self.rooms = _matrix([row[1] for row in rows], self.names)
        self._cheapest: dict[Resources, float] = {}

    def vector(self, requests: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray] | None:
        """The requests' nonzero values and their columns in `names`; None when they ask for something no type
        has (so they fit nowhere)."""
        columns: list[int] = []
        values: list[int] = []
        for name, value in requests.items():
            if value:
                column = self._column.get(name)
                if column is None:
                    return None
                columns.append(column)
                values.append(value)
        return np.array(columns, np.intp), np.array(values, np.int64)

    def cheapest(self, requests: Resources) -> float:
        """The price of the cheapest offering of a type that holds `requests` in some pool; inf when none does."""
        found = self._cheapest.get(requests)
        if found is None:
            if len(self._cheapest) >= _CACHE_LIMIT:
                self._cheapest.clear()
            vector = self.vector(requests)
            holds = _holds(self.rooms, vector) if vector is not None else np.zeros(len(self.prices), bool)
            found = self._cheapest[requests] = float(self.prices[holds].min()) if holds.any() else math.inf
        return found


class FreeRooms:
    """Other nodes' free room: which pods of a node fit on none of them, and which nodes hold a pod (`fit.fits`: only
    what a pod asks for is compared, so a resource overcommitted on a node keeps off only the pods asking for it). The
    floor asks it of the nodes that may take pods; the sunk-room phase, of the nodes that stay (`consolidation_sunk`).

    A pass's free room has some ten nodes and is asked about some forty pods (the karpenter-like replay: 830,000
    in 167,000 questions over 21,000 passes), so the rows that hold a pod are a bit mask, an `int` (bit i: the
    i-th node), and each resource's nodes are kept sorted by their free room in it: a pod's mask is one bisection
    per resource it asks for, and a node's stranded pods a few integer operations each. Comparing numpy rows
    instead took 3.2 s of that replay, in calls on arrays this small; this takes 1.2 s. A cluster of thousands of
    nodes keeps at most `_MARKS` masks per resource (`_Ranked`), not one per node."""

    def __init__(self, nodes: Sequence[tuple[object, Mapping[str, int]]]) -> None:
        """`nodes`: each node (any object, told apart by identity) with its free room."""
        self._row = {id(node): i for i, (node, _) in enumerate(nodes)}
        self._free = [free for _, free in nodes]
        self._all = (1 << len(nodes)) - 1
        self._by_resource: dict[str, _Ranked] = {}
        self._holding: dict[Resources, int] = {}

    def row(self, node: object) -> int | None:
        """The node's row; None for a node not given."""
        return self._row.get(id(node))

    def holding(self, pod: Resources) -> int:
        """The rows whose free room holds `pod`, as a bit mask; kept per request vector."""
        found = self._holding.get(pod)
        if found is None:
            found = self._all
            for name, value in pod.items():
                if value:
                    ranked = self._ranked(name)
                    first = bisect_right(ranked.negated, -value)  # the rows before it have the room
                    # `first` answers any step; up to 256 nodes (every replay pass) the mask is read here,
                    # without the call: 0.2 s of karpenter-like's replay
                    found &= ranked.marks[first] if ranked.step == 1 else ranked.first(first)
            self._holding[pod] = found
        return found

    def _ranked(self, name: str) -> _Ranked:
        found = self._by_resource.get(name)
        if found is None:
            found = self._by_resource[name] = _Ranked([free.get(name, 0) for free in self._free])
        return found

    def with_room(self, pods: Sequence[Resources]) -> int:
        """The rows holding at least one of `pods`, as a bit mask."""
        found = 0
        for pod in pods:
            found |= self.holding(pod)
        return found

    def stranded(self, pods: Sequence[Resources], own: Collection[object]) -> list[Resources]:
        """The pods' requests that fit on no node but those of `own` (the nodes they are on)."""
        others = self._all
        for node in own:
            if (row := self.row(node)) is not None:
                others &= ~(1 << row)
        return [pod for pod in pods if not self.holding(pod) & others]


_MARKS = 256
"""Prefixes `_Ranked` keeps a mask of, besides the empty one, at most: every one up to this many nodes, every
⌈n/256⌉th beyond."""


class _Ranked:
    """The rows sorted by their room in one resource, largest first, with the masks of their first k rows for every
    k that is a multiple of `step`: the rows holding a request are those before the first with less room, one
    kept mask and at most `step` - 1 bits more. One mask per row holds n² bits: asked about 50 pods, 20,000 nodes
    peaked at 218 MB that way, 11 MB this way."""

    def __init__(self, room: Sequence[int]) -> None:
        self.order = sorted(range(len(room)), key=room.__getitem__, reverse=True)
        self.negated = [-room[row] for row in self.order]
        """Ascending, for `bisect`."""
        self.step = max(1, -(-len(room) // _MARKS))
        self.marks = [0]
        first_k = 0
        for k, row in enumerate(self.order, 1):
            first_k |= 1 << row
            if k % self.step == 0:
                self.marks.append(first_k)

    def first(self, k: int) -> int:
        """The first k rows, as a bit mask (`marks[k]` when `step` is 1)."""
        kept = k // self.step
        found = self.marks[kept]
        for row in self.order[kept * self.step:k]:
            found |= 1 << row
        return found


def _matrix(rooms: Sequence[Mapping[str, int]], names: Sequence[str]) -> np.ndarray:
    return np.array([[room.get(name, 0) for name in names] for room in rooms], np.int64).reshape(
        len(rooms), len(names))


def _holds(rows: np.ndarray, requests: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Which rows hold the requests (a `TypeRooms.vector`)."""
    columns, values = requests
    return np.asarray((rows[:, columns] >= values).all(axis=1))


_ROOMS: WeakKeyDictionary[Solver, tuple[Config, TypeRooms]] = WeakKeyDictionary()


def type_rooms(config: Config, solver: Solver) -> TypeRooms:
    """The solver's catalog's `TypeRooms` under `config`, built once per solver (its catalog is fixed for its life)."""
    found = _ROOMS.get(solver)
    if found is None or found[0] is not config:
        found = _ROOMS[solver] = (config, TypeRooms(config, solver.index.catalog))
    return found[1]

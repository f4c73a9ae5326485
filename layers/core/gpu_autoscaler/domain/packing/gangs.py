"""Gangs: all of a pod group's members placed at once, in one zone, or none of them.

A gang (pods of one PodGroup, `minMember` of them present) is placed before the tier's other pods: its
members are packed together in each zone and the cheapest zone wins; in a pool with `efa: true` every
node of the gang also shares one candidate list of EFA-capable types, so the fleet can launch them as one
single-instance-type request. A gang short of members, or with no zone holding it whole, gets nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.domain.packing.kinds import Kinds
from gpu_autoscaler.domain.packing.nodes import CANDIDATE_PRICE_CEILING, MAX_CANDIDATES, Candidates, NewNode
from gpu_autoscaler.domain.packing.results import Unschedulable

if TYPE_CHECKING:
    from gpu_autoscaler.config import CapacityType
    from gpu_autoscaler.domain.packing.nodes import PoolView
    from gpu_autoscaler.domain.packing.solve_pass import SolvePass

__all__ = ["Gang", "gangs_to_place", "place_gang"]

@dataclass
class Gang:
    """One pod group's classes in this pass, and what became of it."""

    name: str
    classes: list[int]
    min_member: int
    zone_hint: str | None = None
    placed: bool = False
    failures: list[str] = field(default_factory=list)


def gangs_to_place(state: SolvePass) -> list[Gang]:
    """The pass's gangs with all `minMember` members present (pending here or on live claims), highest priority
    first; the pods of a gang short of members are unschedulable with that reason, and nothing is bought."""
    members: dict[str, list[int]] = {}
    for c, cls in enumerate(state.classes):
        if cls.gang is not None:
            members.setdefault(cls.gang, []).append(c)
    covered_members: dict[str, int] = {}
    hints: dict[str, str] = {}
    for claim in state.claims_in:
        if claim.gang:
            covered_members[claim.gang] = covered_members.get(claim.gang, 0) + len(claim.pods)
            zone = claim.zone or (claim.zones[0] if len(claim.zones) == 1 else None)
            if zone:
                hints[claim.gang] = zone
    gangs = []
    for name, classes in members.items():
        pods = [pod for c in classes for pod in state.classes[c].pods]
        min_member = max(pod.pod_group.min_member for pod in pods if pod.pod_group)
        present = len(pods) + covered_members.get(name, 0)
        gang = Gang(name, classes, min_member, hints.get(name))
        if present < min_member:
            reason = (
                f"gang {name} has {present} of its {min_member} members pending; "
                "nothing is provisioned until all of them are"
            )
            for c in classes:
                for pod in state.take(c, int(state.rem[c])):
                    state.unschedulable.append(Unschedulable(pod.uid, pod.key, reason))
            gang.placed = True
            continue
        gangs.append(gang)
    gangs.sort(key=lambda g: (-max(state.classes[c].priority for c in g.classes), g.name))
    return gangs


def place_gang(state: SolvePass, view: PoolView, capacity_type: CapacityType, tier: np.ndarray, gang: Gang) -> None:
    """The whole gang on new nodes of this tier, in its cheapest zone, if the tier holds it and the pool's limits
    and quotas admit every node; otherwise the tier's reason is kept for the gang's explanation."""
    masks = state.ok[view.position]
    if not masks[np.ix_(np.asarray(gang.classes, np.int64), tier)].any(axis=1).all():
        return
    best = _layout(state, view, capacity_type, tier, gang)
    if best is None:
        gang.failures.append(
            f"pool {view.pool.name} ({capacity_type}): no single zone has "
            + ("one EFA instance type with " if view.pool.efa else "")
            + f"room for all {int(state.rem[gang.classes].sum())} members"
        )
        return
    _, z, layout, types = best
    nodes: list[NewNode] = []
    for counts, copies in layout:
        full = np.zeros(len(state.classes), np.int64)
        full[gang.classes] = counts
        candidates = (
            _fixed_candidates(state, types, z)
            if types is not None
            else state.candidates(view, capacity_type, tier, full, zone=z)
        )
        if candidates is None:
            gang.failures.append(f"pool {view.pool.name} ({capacity_type}): no candidate fits a gang node")
            return
        nodes.extend(NewNode(view.position, capacity_type, candidates, full, gang.name) for _ in range(copies))
    admitted = state.admit(nodes)
    if isinstance(admitted, str):
        gang.failures.append(admitted)
        return
    for node in admitted:
        state.open_node(node)
    gang.placed = True


def _layout(
    state: SolvePass, view: PoolView, capacity_type: CapacityType, tier: np.ndarray, gang: Gang
) -> tuple[float, int, list[tuple[np.ndarray, int]], list[int] | None] | None:
    """The cheapest way to hold the whole gang in one zone (and one EFA type where the pool asks)."""
    if view.pool.efa and len(gang.classes) == 1 and capacity_type != "reserved":
        return _efa_single_layout(state, view, capacity_type, tier, gang)
    idx = state.idx
    masks = state.ok[view.position]
    demand = state.rem[gang.classes].copy()
    req = state.req[gang.classes]
    best: tuple[float, int, list[tuple[np.ndarray, int]], list[int] | None] | None = None
    for z, zone in enumerate(idx.zones):
        if gang.zone_hint is not None and zone != gang.zone_hint:
            continue
        in_zone = tier[idx.zone_of[tier] == z]
        if view.pool.efa:
            in_zone = in_zone[[idx.types[t].efa for t in idx.type_of[in_zone]]]
        feasible = masks[np.ix_(np.asarray(gang.classes, np.int64), in_zone)]
        if in_zone.size == 0 or not feasible.any(axis=1).all():
            continue
        everyone = feasible.all(axis=0)
        groups = (
            [np.flatnonzero(everyone & (idx.type_of[in_zone] == t)) for t in np.unique(idx.type_of[in_zone])]
            if view.pool.efa
            else [np.arange(in_zone.size)]
        )
        for group in (g for g in groups if g.size):
            pos = in_zone[group]
            kinds = Kinds(state.matrices[view.position][idx.type_of[pos]], idx.price[pos], feasible[:, group],
                          state.reserved_limit(pos, capacity_type))
            opened = state.s.pack(demand, req, kinds)
            if not np.array_equal(sum((e.counts * e.copies for e in opened), np.zeros_like(demand)), demand):
                continue
            cost = float(sum(kinds.price[e.kind] * e.copies for e in opened))
            if best is None or cost < best[0] - 1e-9:
                best = (cost, z, [(e.counts, e.copies) for e in opened], None)
    if best is not None and view.pool.efa:
        # Every node of the layout fits its own (one) type, so the common list is never empty.
        cost, z, layout, _ = best
        best = (cost, z, layout, _common_types(state, view, capacity_type, z, gang, layout))
    return best


def _efa_single_layout(
    state: SolvePass, view: PoolView, capacity_type: CapacityType, tier: np.ndarray, gang: Gang
) -> tuple[float, int, list[tuple[np.ndarray, int]], list[int] | None] | None:
    """Identical members, one EFA type: for every offering at once, ⌈members / fit⌉ nodes of it."""
    idx = state.idx
    c = gang.classes[0]
    n = int(state.rem[c])
    pos = tier[state.ok[view.position][c, tier] & np.array([idx.types[t].efa for t in idx.type_of[tier]], bool)]
    if gang.zone_hint is not None:
        pos = pos[[idx.zones[z] == gang.zone_hint for z in idx.zone_of[pos]]]
    if pos.size == 0:
        return None
    need = state.req[c] > 0
    fit = np.minimum((state.matrices[view.position][idx.type_of[pos]][:, need] // state.req[c, need]).min(axis=1), n)
    cost = -(-n // fit) * idx.price[pos]
    first = int(np.lexsort((idx.type_of[pos], idx.zone_of[pos], cost))[0])
    per_node = int(fit[first])
    full, rest = divmod(n, per_node)
    layout = [(np.array([per_node]), full)] if full else []
    if rest:
        layout.append((np.array([rest]), 1))
    z = int(idx.zone_of[pos[first]])
    return float(cost[first]), z, layout, _common_types(state, view, capacity_type, z, gang, layout)


def _common_types(state: SolvePass, view: PoolView, capacity_type: CapacityType, zone: int, gang: Gang,
                  layout: list[tuple[np.ndarray, int]]) -> list[int]:
    """EFA types in the gang's zone that hold every gang node's pods, cheapest first."""
    idx = state.idx
    zone_tier = idx.tier(view.base & state.available & (idx.zone_of == zone), capacity_type)
    good = np.ones(zone_tier.size, bool)
    for c in gang.classes:
        good &= state.ok[view.position][c][zone_tier]
    good &= np.array([idx.types[t].efa for t in idx.type_of[zone_tier]], bool)
    matrix = state.matrices[view.position]
    for counts, _copies in layout:
        used = counts @ state.req[gang.classes]
        good &= (matrix[idx.type_of[zone_tier]] >= used).all(axis=1)
    chosen = zone_tier[good]
    order = sorted(chosen, key=lambda i: (idx.price[i], idx.types[idx.type_of[i]].name))
    return [int(i) for i in order[:MAX_CANDIDATES]]


def _fixed_candidates(state: SolvePass, positions: list[int] | None, zone: int) -> Candidates | None:
    if not positions:
        return None
    idx = state.idx
    first = float(idx.price[positions[0]])
    chosen = [i for i in positions if idx.price[i] <= first * CANDIDATE_PRICE_CEILING + 1e-9]
    prices = [float(idx.price[i]) for i in chosen]
    return Candidates([int(idx.type_of[i]) for i in chosen], prices, prices, (idx.zones[zone],))

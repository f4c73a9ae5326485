"""One `Solver.solve` call: the pods of one document placed tier by tier, and the plan that results.

The order of its steps is the order of the rules in `solver`'s docstring: pods already covered are left
alone, live claims in flight take pods first, then per pool and capacity type the gangs (`gangs`) and the
rest of the classes (`binpack` through the solver's memo), each new node admitted against pool limits and
vCPU quotas; finally the claims are written out and every pod left gets its reason (`explain`).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.domain.packing.binpack import Kinds
from gpu_autoscaler.domain.packing.classes import PodClass, classify, plain_of
from gpu_autoscaler.domain.packing.explain import explain_unplaced, leave_unplaced
from gpu_autoscaler.domain.packing.fit import BASE_RESOURCES
from gpu_autoscaler.domain.packing.gangs import gangs_to_place, place_gang
from gpu_autoscaler.domain.packing.nodes import (
    CANDIDATE_PRICE_CEILING,
    MAX_CANDIDATES,
    Candidates,
    NewNode,
    PoolView,
    TierArrays,
)
from gpu_autoscaler.domain.packing.preferences import preference_order, with_preference
from gpu_autoscaler.domain.packing.quotas import LimitLedger, VcpuLedger
from gpu_autoscaler.domain.packing.results import (
    REQUESTS_ATTRIBUTE,
    SOURCE_ATTRIBUTE,
    Plan,
    Unschedulable,
    claim_requests,
    requests_attribute,
)
from gpu_autoscaler.domain.packing.room import roomier_node
from gpu_autoscaler.domain.packing.zones import (
    per_node,
    place_over_zones,
    repels_in_zones,
    spreads,
    with_volume_zones,
)
from gpu_autoscaler.models.claims import IN_FLIGHT_STATES, ClaimState, NodeClaim, launched_at
from gpu_autoscaler.models.pods import device_totals, with_requests
from gpu_autoscaler.models.requirements import unplannable_terms
from gpu_autoscaler.models.resources import CPU, GPU, MEMORY, is_gpu_resource
from gpu_autoscaler.models.taints import tolerates_all

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    from gpu_autoscaler.config import CapacityType
    from gpu_autoscaler.domain.catalog import OfferingKey
    from gpu_autoscaler.domain.packing.solver import Solver
    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.models.pods import PendingPod

__all__ = ["SolvePass", "claim_id", "first_of_each"]



class SolvePass:
    """One `solve` call's working state."""

    def __init__(
        self,
        solver: Solver,
        pods: Sequence[PendingPod],
        claims: Sequence[NodeClaim],
        covered: Mapping[str, str],
        unavailable: Collection[OfferingKey],
        source: str,
        quotas: Mapping[str, int] | None = None,
        outside: Mapping[str, int] | None = None,
        *,
        new_nodes: bool = True,
    ) -> None:
        self.s = solver
        self.new_nodes = new_nodes
        self.idx = solver.index
        self.source = source
        self.now = solver.clock.now()
        self.claims_in = [c for c in claims if c.state is not ClaimState.TERMINATED]
        live_ids = {c.id for c in self.claims_in if c.live}
        self.covered: dict[str, str] = {}
        fresh: list[PendingPod] = []
        seen: set[str] = set()
        for pod in pods:
            uid = pod.uid
            if uid in seen:
                continue
            seen.add(uid)
            claim_id = covered.get(uid)
            # Only a live claim covers a pod: an assignment to one that is gone, draining or unknown does not.
            if claim_id is not None and claim_id in live_ids:
                self.covered[uid] = claim_id
            else:
                fresh.append(pod)
        self.unschedulable: list[Unschedulable] = []
        self._available_key: bytes | None = None
        self.available = ~self.idx.excluded(unavailable) if unavailable else np.ones(len(self.idx), bool)
        self.all_available = not unavailable
        placeable = self._placeable(fresh)
        self._classify(placeable)
        if any(c.example.preferred_node_affinity for c in self.classes):
            self._classify(self._preferred())
        if any(spreads(c.example) for c in self.classes) or any(repels_in_zones(p) or p.pod_affinity
                                                                        for p in placeable):
            of_class = {p.uid: c.index for c in self.classes for p in c.pods}
            zones = [self._class_zones(c) for c in range(len(self.classes))]
            placed, refused = place_over_zones([p for c in self.classes for p in c.pods],
                                               lambda pod: zones[of_class[pod.uid]])
            self.unschedulable.extend(Unschedulable(p.uid, p.key, why) for p, why in refused)
            self._classify(placed)
        self.limits = [LimitLedger(v.pool) for v in solver.pools]
        self.vcpus = VcpuLedger(solver.quotas if quotas is None else quotas, outside)
        self.reserved_left = np.where(self.idx.available >= 0, self.idx.available, 0)
        self.failures: dict[tuple[int, int], str] = {}
        self._tiers: dict[tuple[int, str], TierArrays] = {}
        self.opened: list[tuple[NewNode, list[list[PendingPod]]]] = []
        """Nodes opened, each with the pods of each of its copies (`_open_copies` opens a pattern's at once)."""
        self.existing: dict[str, list[str]] = {}
        if new_nodes:  # pool limits, quotas and reservations bound only the nodes a solve opens
            self._charge_live_claims()

    # Setup

    def _placeable(self, pods: list[PendingPod]) -> list[PendingPod]:
        """Pods pinned to their volumes' zones, asking for their DRA devices and per-node room as for
        resources; those the agent, their requests (`beyond_any_node`), their node affinity or their volumes rule out
        are unschedulable, and affinity terms no node not launched yet can satisfy (empty, or by field) are left out.
        One pass over the pods (a burst's ten thousand)."""
        out = []
        zoned = False
        for pod in pods:
            if refused := pod.unplannable or pod.beyond_any_node:
                self.unschedulable.append(Unschedulable(pod.uid, pod.key, refused))
            elif pod.required_node_affinity and (affinity := unplannable_terms(pod.required_node_affinity)):
                self.unschedulable.append(Unschedulable(pod.uid, pod.key, affinity))
            elif pod.volume_zones is not None and not pod.volume_zones:
                self.unschedulable.append(Unschedulable(
                    pod.uid, pod.key, "its persistent volumes have no zone in common: no node can attach them all"))
            else:
                terms = pod.required_node_affinity
                if terms and not all(t.plannable for t in terms):  # planned on its other terms
                    pod = pod.model_copy(update={"required_node_affinity": tuple(t for t in terms if t.plannable)})
                if pod.device_requests or pod.pod_anti_affinity or pod.topology_spread or pod.host_ports:
                    pod = with_requests(pod, {**device_totals(pod), **per_node(pod)})
                zoned = zoned or bool(pod.volume_zones)
                out.append(pod)
        return with_volume_zones(out) if zoned else out

    def _classify(self, pods: list[PendingPod]) -> None:
        solver = self.s
        self.classes = classify(pods)
        extra = sorted({n for c in self.classes for n in c.requests if n not in BASE_RESOURCES})
        self.names: tuple[str, ...] = BASE_RESOURCES + tuple(extra)
        self.req = np.array(
            [[c.requests[n] for n in self.names] for c in self.classes], np.int64
        ).reshape(len(self.classes), len(self.names))
        self.rem = np.array([c.count for c in self.classes], np.int64)
        self.ungrouped = np.array([c.gang is None for c in self.classes], bool)
        """[C] classes outside gangs (`gangs` places the others)."""
        self._taken = [0] * len(self.classes)
        self.matrices = [solver.matrix(v.pool.name, self.names) for v in solver.pools]
        self._ok: list[np.ndarray] | None = None

    def _preferred(self) -> list[PendingPod]:
        """The pods with their preferred node affinity planned as Karpenter plans it (`preferences`): each class's
        heaviest preferred term that some offering of some pool may hold a pod of it under is ANDed into its
        required terms, the heavier ones relaxed; with none, the pod is planned on its requirements alone. The
        pods come back without preferences, so they are classed by what they now require."""
        pods: list[PendingPod] = []
        for c, cls in enumerate(self.classes):
            if not cls.example.preferred_node_affinity:
                pods.extend(cls.pods)
                continue
            update: dict[str, object] = {"preferred_node_affinity": ()}
            for term in preference_order(cls.example.preferred_node_affinity):
                affinity = with_preference(cls.affinity, term)
                trial = replace(cls, affinity=affinity, constraint_key=(
                    cls.node_selector, plain_of(affinity), *cls.constraint_key[2:]))
                if any(self._row(view, trial, c).any() for view in self.s.pools):
                    update["required_node_affinity"] = affinity
                    break
            pods.extend(p.model_copy(update=update) for p in cls.pods)
        return pods

    @property
    def ok(self) -> list[np.ndarray]:
        """Per pool, [C, O]: offerings that may hold one pod of each class (taints, selectors, fit, base). Made when
        first read: a solve that opens no node (`new_nodes` False) reads it only if its pods spread over zones."""
        if self._ok is None:
            self._ok = [self._class_masks(v) for v in self.s.pools]
        return self._ok

    def _class_zones(self, c: int) -> list[str]:
        """Zones where some pool has an offering that may hold a pod of the class."""
        hit = np.zeros(len(self.idx.zones), bool)
        for ok in self.ok:
            hit[self.idx.zone_of[ok[c]]] = True
        return [self.idx.zones[z] for z in np.flatnonzero(hit)]

    def _class_masks(self, view: PoolView) -> np.ndarray:
        """[C, O] per class its row (`_class_row`), kept by the solver (`Solver.class_row`) for the same class in
        this pool with the same offerings available (consolidation asks one solve per candidate, a minute apart,
        about the same few classes)."""
        n_classes = len(self.classes)
        if n_classes == 0:
            return np.zeros((0, len(self.idx)), bool)
        return np.stack([self._row(view, cls, c) for c, cls in enumerate(self.classes)])

    def _row(self, view: PoolView, cls: PodClass, c: int) -> np.ndarray:
        """`_class_row` of `cls` with the requests of class `c`, kept by the solver (`Solver.class_row`)."""
        if self._available_key is None:
            self._available_key = self.available.tobytes()
        key = (view.position, self.names, self.req[c].tobytes(), cls.constraint_key, self._available_key)
        return self.s.class_row(key, partial(self._class_row, view, cls, self.req[c]))

    def _class_row(self, view: PoolView, cls: PodClass, req: np.ndarray) -> np.ndarray:
        """[O] offerings of the pool that may hold one pod of the class: its selector and affinity, its requests
        within the type's allocatable, the pool's base and what is available, the pool's taints tolerated, and
        fractional-GPU offerings only if asked for. A function of the key `_class_masks` files it under."""
        if not tolerates_all(cls.tolerations, view.pool.taints):
            return np.zeros(len(self.idx), bool)
        fits_type = np.asarray((self.matrices[view.position] >= req[None, :]).all(axis=1))
        ok = self.s.selector_mask(view, cls) & fits_type[self.idx.type_of] & view.base & self.available
        if self.s.fractional and not view.fractional_ok and self.s.excludes_fractional(view, cls):
            ok &= ~self.s.partitioned
        return ok

    def _charge_live_claims(self) -> None:
        """Pool limits and quotas count every live claim; reserved claims that their reservation's count does not
        show yet hold a slot of it (`_hold_reservation`)."""
        for claim in self.claims_in:
            view = self.s._pool_by_name.get(claim.pool)
            types = self.s.claim_types(claim)
            if not types:
                continue
            if view is not None:
                self.limits[view.position].charge(*self.s.limit_charge(claim, types))
            self.vcpus.charge(self.vcpus.consumption(types, claim.capacity_type))
            if claim.capacity_type == "reserved":
                self._hold_reservation(claim, types)

    def _hold_reservation(self, claim: NodeClaim, types: list[InstanceType]) -> None:
        """A slot of the reservation a reserved claim is for, where the reservation's count (as read) does not show
        the claim yet: a pending claim's, not launched; a launched claim's when it was launched after the count was
        read (`Offering.counted_at`; the catalog reads it once a minute, see `catalog.RESERVATION_TTL`). A launched
        claim is in the reservation it was planned for (its fleet request names only that one), else it would not be
        `reserved`."""
        idx = self.idx
        launched = None if claim.instance_id is None else launched_at(claim)
        if launched is not None and claim.reservation_id is None:
            return
        for t in types:
            for zone in ([claim.zone] if claim.zone else claim.zones):
                for i in idx.positions.get((t.name, zone, "reserved"), ()):
                    offering = idx.offerings[i]
                    if claim.reservation_id not in (None, offering.reservation_id) or self.reserved_left[i] <= 0:
                        continue
                    if launched is not None and (offering.counted_at is None or launched <= offering.counted_at):
                        continue
                    self.reserved_left[i] -= 1
                    return

    # Run

    def run(self) -> Plan:
        self._place_in_flight()
        if self.new_nodes:
            self._open_nodes()
        else:
            leave_unplaced(self, "no room on the claims in flight, and no new node was asked for")
        return Plan(
            claims=tuple(self._claims()),
            existing={k: tuple(v) for k, v in self.existing.items()},
            unschedulable=tuple(self.unschedulable),
            covered=dict(self.covered),
        )

    def _open_nodes(self) -> None:
        """The pods left, onto new nodes: gangs whole, then classes, tier by tier in each pool's order."""
        gangs = gangs_to_place(self)
        for view, capacity_type in ((v, t) for v in self.s.pools for t in v.capacity_order):
            if not self.rem.any() and all(gang.placed for gang in gangs):
                break  # every pod has a place: no tier has anything to open
            tier = view.tiers.get(capacity_type) if self.all_available else None
            if tier is None:
                tier = self.idx.tier(view.base & self.available, capacity_type)
            if tier.size == 0:
                continue
            for gang in gangs:
                if not gang.placed:
                    place_gang(self, view, capacity_type, tier, gang)
            self._place_classes(view, capacity_type, tier)
        explain_unplaced(self, gangs)

    def reserved_limit(self, pos: np.ndarray, capacity_type: CapacityType) -> np.ndarray | None:
        """[N] how many nodes each reserved offering in `pos` still holds; None outside reservations."""
        if capacity_type != "reserved":
            return None
        return self.reserved_left[pos].copy()

    def take(self, c: int, n: int) -> list[PendingPod]:
        start = self._taken[c]
        self._taken[c] = start + n
        self.rem[c] -= n
        return self.classes[c].pods[start:start + n]

    # Live claims first

    def _place_in_flight(self) -> None:
        """Pods onto the claims in flight with room, oldest claim first, the highest priority and biggest pods
        first. In Python integers, not arrays: a consolidation question shows a handful of claims and classes of
        half a dozen resources, where an array operation's overhead is most of the work."""
        targets: list[tuple[NodeClaim, PoolView, list[InstanceType], list[int]]] = []
        for claim in self.claims_in:
            view = self.s._pool_by_name.get(claim.pool)
            if claim.state not in IN_FLIGHT_STATES or claim.gang or view is None:
                continue
            types = self.s.claim_types(claim)
            if not types:
                continue
            matrix = self.matrices[view.position]
            caps = [matrix[self.idx.type_position[t.name]].tolist() for t in types]
            used = claim_requests(claim)
            free = [min(column) - used[name] for column, name in zip(zip(*caps, strict=True), self.names, strict=True)]
            if min(free, default=0) < 0:
                # Recorded use beyond what its types hold now (the pool's sharing or overhead changed):
                # offer no room on it rather than trust a figure that no longer adds up.
                continue
            targets.append((claim, view, types, free))
        if not targets:
            return
        targets.sort(key=lambda item: (item[0].created_at, item[0].id))
        gpu, cpu, memory = (self.names.index(n) for n in (GPU, CPU, MEMORY))
        order = sorted(
            (c for c, cls in enumerate(self.classes) if cls.gang is None),
            key=lambda c: (-self.classes[c].priority, -self.req[c][gpu], -self.req[c][cpu], -self.req[c][memory]),
        )
        for c in order:
            left = int(self.rem[c])
            if left == 0:
                continue
            need = [(i, v) for i, v in enumerate(self.req[c].tolist()) if v > 0]
            for claim, view, types, free in targets:
                room = min((free[i] // v for i, v in need), default=left)
                if room <= 0 or not self._compatible(c, claim, view, types):
                    continue
                n = min(room, left)
                for i, v in need:
                    free[i] -= n * v
                self.existing.setdefault(claim.id, []).extend(p.uid for p in self.take(c, n))
                left -= n
                if left == 0:
                    break

    def _compatible(self, c: int, claim: NodeClaim, view: PoolView, types: list[InstanceType]) -> bool:
        cls = self.classes[c]
        if not tolerates_all(cls.tolerations, view.pool.taints):
            return False
        if any(t.partitioned for t in types) and self.s.excludes_fractional(view, cls):
            return False
        if not cls.node_selector and not cls.affinity:
            return True
        mask = self.s.selector_mask(view, cls)
        zones = [claim.zone] if claim.zone else list(claim.zones)
        for t in types:
            for zone in zones:
                positions = self.idx.positions.get((t.name, zone, claim.capacity_type))
                if positions:
                    if not mask[positions[0]]:
                        return False
                elif not _matches(cls, self.s.labels_of(view, t, zone, claim.capacity_type)):
                    return False
        return True

    # Classes

    def _place_classes(self, view: PoolView, capacity_type: CapacityType, tier: np.ndarray) -> None:
        masks = self.ok[view.position]
        row_index = np.flatnonzero(self.ungrouped & (self.rem > 0))
        if row_index.size:
            row_index = row_index[masks[row_index][:, tier].any(axis=1)]
        if not row_index.size:
            return
        rows = row_index.tolist()
        pos = tier[masks[np.ix_(row_index, tier)].any(axis=0)]
        feasible = masks[np.ix_(row_index, pos)]
        limit = self.reserved_limit(pos, capacity_type)
        if limit is None:
            pos, feasible = self._dedupe(pos, feasible)
        kinds = Kinds(self.matrices[view.position][self.idx.type_of[pos]], self.idx.price[pos], feasible, limit)
        opened = self.s.pack(self.rem[rows].copy(), self.req[rows], kinds)
        min_room: np.ndarray | None = None
        roomier = roomier_node(opened, self.rem[rows], self.req[rows], kinds, self.names.index(GPU),
                               view.pool.spare_room_worth)
        if roomier is not None:
            # Bought for its room: its candidates keep that room (the fleet launches the first it can).
            opened = [roomier]
            min_room = self._room_kept(view, kinds.cap[roomier.kind])
        for entry in opened:
            full = np.zeros(len(self.classes), np.int64)
            full[rows] = entry.counts
            candidates = self.candidates(view, capacity_type, tier, full, min_room=min_room)
            if candidates is None:
                continue
            if capacity_type != "reserved" and not self.limits[view.position].bounded and not self.vcpus.quotas:
                # Nothing to admit against and no reservation to count down: open every copy at once.
                present = np.flatnonzero(full)
                copies = min(entry.copies, int((self.rem[present] // full[present]).min()))
                self._open_copies(NewNode(view.position, capacity_type, candidates, full), present, copies)
                continue
            for _ in range(entry.copies):
                if candidates is None or (self.rem < full).any():
                    break
                admitted = self.admit([NewNode(view.position, capacity_type, candidates, full)])
                if isinstance(admitted, str):
                    for c in np.flatnonzero(full):
                        self.failures.setdefault((view.position, int(c)), admitted)
                    break
                self.open_node(admitted[0])
                if capacity_type == "reserved":
                    # The reservation just used may be exhausted: the next copy may need another one.
                    candidates = self.candidates(view, capacity_type, tier, full)

    def _room_kept(self, view: PoolView, cap: np.ndarray) -> np.ndarray:
        """What every candidate of a node bought for its room (`cap`, its allocatable) must have too. Where GPUs are
        whole, its GPU devices: the next pods need a free GPU, and a type with as many has the room whatever its CPU.
        Where they are time-sliced, all of it: a GPU's replicas outnumber the pods its CPU and memory hold (half a GPU
        beside 6 vCPU on a g4dn.2xlarge leaves two replicas no such pod can use), so the room bought is CPU and
        memory as much as replicas. Kept in full in whole-GPU pools too, the replay of gpushare20 cost 4.5 % more;
        kept in GPUs alone in time-slicing pools, the room was decided and a type without it launched (README, the
        simulator's seventeenth round)."""
        if view.pool.gpu_sharing.mode == "time-slicing":
            return cap
        devices = np.array([is_gpu_resource(name) for name in self.names])
        return np.where(devices, cap, 0)

    def _dedupe(self, pos: np.ndarray, feasible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keep, per instance type and set of classes it may hold, only the cheapest offering (zone)."""
        order = np.lexsort((self.idx.price[pos], self.idx.type_of[pos]))
        keep = first_of_each(order, self.idx.type_of[pos], feasible)
        return pos[keep], feasible[:, keep]

    def _tier_arrays(self, view: PoolView, capacity_type: CapacityType, tier: np.ndarray) -> TierArrays:
        key = (view.position, capacity_type)
        found = self._tiers.get(key)
        if found is None or found.tier is not tier:
            idx = self.idx
            types = idx.type_of[tier]
            order = np.argsort(types, kind="stable")
            starts = np.flatnonzero(np.r_[True, types[order][1:] != types[order][:-1]])
            found = TierArrays(tier, types, idx.zone_of[tier], idx.price[tier], self.ok[view.position][:, tier],
                                order, starts, types[order][starts])
            self._tiers[key] = found
        return found

    def candidates(self, view: PoolView, capacity_type: CapacityType, tier: np.ndarray, counts: np.ndarray,
                    zone: int | None = None, min_room: np.ndarray | None = None) -> Candidates | None:
        """Every type that holds `counts` (and has at least `min_room` of every resource, as allocatable in the
        pool) in every zone where the cheapest one does, cheapest first.

        A type is left out if one of those zones has an offering of it that cannot take the pods (the
        fleet may pick any candidate in any of the claim's zones), or if it costs more than
        `CANDIDATE_PRICE_CEILING` × the first.
        """
        idx = self.idx
        t = self._tier_arrays(view, capacity_type, tier)
        used = counts @ self.req
        type_fits = np.asarray((self.matrices[view.position] >= used).all(axis=1))
        good = t.ok[np.flatnonzero(counts)].all(axis=0) & type_fits[t.types]
        if min_room is not None:
            good &= (self.matrices[view.position][t.types] >= min_room).all(axis=1)
        if zone is not None:
            good &= t.zones == zone
        if capacity_type == "reserved":
            good &= self.reserved_left[tier] > 0
            if not good.any():
                return None
            first = int(tier[np.where(good, t.prices, np.inf).argmin()])
            price = float(idx.price[first])
            return Candidates([int(idx.type_of[first])], [price], [price], (idx.offerings[first].zone,),
                               idx.offerings[first].reservation_id, first)
        if not good.any():
            return None
        first = int(np.where(good, t.prices, np.inf).argmin())
        zone_hit = np.zeros(len(idx.zones), bool)
        zone_hit[t.zones[good & (t.types == t.types[first])]] = True
        in_zones = zone_hit[t.zones]
        sel = (in_zones & good)[t.order]
        prices = t.prices[t.order]
        low = np.minimum.reduceat(np.where(sel, prices, np.inf), t.starts)
        high = np.maximum.reduceat(np.where(sel, prices, -np.inf), t.starts)
        bad = np.logical_or.reduceat((in_zones & ~good)[t.order], t.starts)
        ceiling = float(t.prices[first]) * CANDIDATE_PRICE_CEILING + 1e-9
        keep = np.flatnonzero(~bad & np.isfinite(low) & (low <= ceiling))
        ranked = keep[np.lexsort((self.s.name_rank[t.present[keep]], low[keep]))][:MAX_CANDIDATES]
        return Candidates(
            t.present[ranked].tolist(),
            low[ranked].tolist(),
            high[ranked].tolist(),
            tuple(idx.zones[z] for z in np.flatnonzero(zone_hit)),
        )

    # Budgets

    def admit(self, nodes: list[NewNode]) -> list[NewNode] | str:
        """Nodes within pool limits and quotas (candidates that would break them dropped), or why not."""
        if not nodes:
            return nodes
        idx = self.idx
        pool_ledger = self.limits[nodes[0].pool]
        if not pool_ledger.bounded and not self.vcpus.quotas:
            return nodes
        out: list[NewNode] = []
        gpus_total = 0.0
        price_total = 0.0
        vcpu_total: dict[str, int] = {}
        for node in nodes:
            cand = node.candidates
            keep = [
                i for i, t in enumerate(cand.types)
                if pool_ledger.admits(gpus_total + idx.types[t].gpus, price_total + cand.max_prices[i])
                and self.vcpus.admits_type(idx.types[t], node.capacity_type)
            ]
            if not keep:
                types = [idx.types[t] for t in cand.types]
                quota = self.vcpus.blocking(types, node.capacity_type)
                if not pool_ledger.admits(gpus_total + min(t.gpus for t in types), price_total + min(cand.prices)):
                    return pool_ledger.describe()
                if quota is not None:
                    return self.vcpus.full(quota)
                return pool_ledger.describe()
            trimmed = Candidates(
                [cand.types[i] for i in keep], [cand.prices[i] for i in keep], [cand.max_prices[i] for i in keep],
                cand.zones, cand.reservation, cand.reservation_position,
            )
            gpus_total += max(idx.types[t].gpus for t in trimmed.types)
            price_total += max(trimmed.max_prices)
            consumption = self.vcpus.consumption([idx.types[t] for t in trimmed.types], node.capacity_type)
            for key, v in consumption.items():
                vcpu_total[key] = vcpu_total.get(key, 0) + v
            out.append(NewNode(node.pool, node.capacity_type, trimmed, node.counts, node.gang))
        if not pool_ledger.admits(gpus_total, price_total):
            return pool_ledger.describe()
        if not self.vcpus.admits(vcpu_total):
            return self.vcpus.full(next(k for k, v in vcpu_total.items() if v > self.vcpus.left(k)))
        pool_ledger.charge(gpus_total, price_total)
        self.vcpus.charge(vcpu_total)
        return out

    def open_node(self, node: NewNode) -> None:
        """Record an admitted node and take its pods out of the remaining demand."""
        if node.candidates.reservation_position >= 0:
            self.reserved_left[node.candidates.reservation_position] -= 1
        self.opened.append((node, [[p for c in np.flatnonzero(node.counts)
                                     for p in self.take(int(c), int(node.counts[c]))]]))

    def _open_copies(self, node: NewNode, present: np.ndarray, copies: int) -> None:
        """`open_node` for `copies` nodes like `node` (no reservation), taking each class's pods in one go."""
        if copies <= 0:
            return
        taken = [(self.take(int(c), int(node.counts[c]) * copies), int(node.counts[c])) for c in present]
        self.opened.append((node, [[p for block, n in taken for p in block[i * n:(i + 1) * n]]
                                   for i in range(copies)]))

    # Output

    def _claims(self) -> list[NodeClaim]:
        """One NodeClaim per node. The copies of one opened pattern (a burst's thousands of nodes are a few
        hundred patterns: the 10,000-pod benchmark's 4,477 claims, 256) differ only in id, pods and reason, so
        the first is validated and the others are copies of it with those replaced, each with its own attributes
        as validation would give it."""
        cluster = self.s.config.cluster_name
        claims = []
        pool_names = [view.pool.name for view in self.s.pools]
        for node, copies in self.opened:
            pool = pool_names[node.pool]
            first: NodeClaim | None = None
            for pods in copies:
                uids = tuple([p.uid for p in pods])
                if first is not None:
                    claims.append(first.model_copy(update={
                        "id": claim_id(self.source, pool, node.capacity_type, uids),
                        "pods": uids,
                        "reason": _reason_text(pods),
                        "attributes": dict(first.attributes),
                    }))
                    continue
                cand = node.candidates
                used = node.counts @ self.req
                attributes = {
                    REQUESTS_ATTRIBUTE: requests_attribute(dict(zip(self.names, (int(v) for v in used), strict=True))),
                }
                if self.source:
                    attributes[SOURCE_ATTRIBUTE] = self.source
                first = NodeClaim(
                    cluster=cluster,
                    id=claim_id(self.source, pool, node.capacity_type, uids),
                    pool=pool,
                    capacity_type=node.capacity_type,
                    zones=cand.zones,
                    instance_types=tuple(self.idx.types[t].name for t in cand.types),
                    price_per_hour=cand.prices[0],
                    pods=uids,
                    gang=node.gang,
                    created_at=self.now,
                    reservation_id=cand.reservation,
                    reason=_reason_text(pods),
                    attributes=attributes,
                )
                claims.append(first)
        return claims

def _matches(cls: PodClass, labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in cls.node_selector):
        return False
    return not cls.affinity or any(t.matches(labels) for t in cls.affinity)


def _reason_text(pods: Sequence[PendingPod]) -> str:
    first = pods[0]
    more = f" and {len(pods) - 1} more" if len(pods) > 1 else ""
    return f"pending pods: {first.namespace}/{first.name}{more}"


def claim_id(source: str, pool: str, capacity_type: str, uids: Sequence[str]) -> str:
    """Deterministic: the same message planning the same pods names the same claim (a retry finds it)."""
    digest = hashlib.sha256("\x1f".join((source, pool, capacity_type, *uids)).encode()).hexdigest()
    return f"nc-{digest[:20]}"


def first_of_each(order: np.ndarray, types: np.ndarray, feasible: np.ndarray) -> np.ndarray:
    """The columns kept by `Solver`'s dedupe: going through the columns in `order`, the first of each key (its
    type in `types`, and which classes may go there: its column of `feasible` [C, P]), in column order.

    Each key is one byte string (the type, then the column's bits packed), so numpy finds the first occurrences
    at once whatever the number of classes (`np.unique` sorts stably when asked for indices: first occurrences);
    a Python step per column cost 109 µs on 80 offerings, this ~20."""
    rows = np.concatenate([types[order].astype(">i8").view(np.uint8).reshape(-1, 8),
                           np.packbits(feasible[:, order], axis=0).T], axis=1)
    keys = np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1]))).ravel()
    _, first = np.unique(keys, return_index=True)
    return np.sort(order[first]).astype(np.int64)

"""How one group of nodes is judged for draining together: where its pods would go, and whether that saves.

Every "do these pods fit" is a `Solver.solve` call, the packer's own decision: the nodes that stay are shown to the
solver as claims in flight whose recorded requests are what their pods use, so it places the moving pods on their
free room first and plans new nodes only for the rest (Karpenter's scheduling simulation). The rules on top:
replacements only of types cheaper than what they replace (`_cheaper`) and pinned to the capacity type they were
priced at (`fleet.CAPACITY_TYPE_PINNED_ATTRIBUTE`), the spot-to-spot gate, and no node swapped
for a new one of its own type (`_swapped`). `consolidation._Pass` runs the searches over these judgements.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from itertools import combinations
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.consolidation_floor import FreeRooms, TypeRooms, type_rooms
from gpu_autoscaler.domain.consolidation_memo import claim_print, question, solve_memo
from gpu_autoscaler.domain.consolidation_models import REPLACES_ATTRIBUTE, Decision
from gpu_autoscaler.domain.fleet import CAPACITY_TYPE_PINNED_ATTRIBUTE
from gpu_autoscaler.domain.packing.fit import pod_requests
from gpu_autoscaler.domain.packing.results import REQUESTS_ATTRIBUTE, requests_attribute
from gpu_autoscaler.domain.packing.zones import apart_groups
from gpu_autoscaler.domain.per_object import PER_OBJECT_LIMIT, PerObject
from gpu_autoscaler.models.claims import IN_FLIGHT_STATES, ClaimState, NodeClaim
from gpu_autoscaler.models.resources import CPU, GPU, MEMORY, MIG_PREFIX, PODS, Resources

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    from gpu_autoscaler.config import Config, DisruptionReason, NodePool
    from gpu_autoscaler.domain.catalog import Catalog, OfferingKey
    from gpu_autoscaler.domain.consolidation_models import ConsolidationNode, NodePod
    from gpu_autoscaler.domain.packing.results import Plan
    from gpu_autoscaler.domain.packing.solver import Solver
    from gpu_autoscaler.models.pods import PendingPod

__all__ = ["EPS", "GROUP_FLOOR_MAX", "SPOT_TO_SPOT_MIN_TYPES", "GroupJudge", "GroupNode", "candidate_order",
           "node_labels", "node_shape", "pod_shape"]

SPOT_TO_SPOT_MIN_TYPES = 15
EPS = 1e-9
GROUP_FLOOR_MAX = 3
"""The largest group `GroupJudge.priced_out` answers for (7 parts); the multi-node search's budget makes most of
its groups pairs."""
_RANK_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass
class GroupNode:
    """One node's part in the pass."""

    item: ConsolidationNode
    pool: NodePool | None
    price: float
    used: Resources
    """What the solver must see as taken on it: its pods' requests, plus what the kubelet reports less than
    the packer's figure of allocatable."""
    capacity: Resources | None
    """The packer's figure of its allocatable (`fit.allocatable`); None when its type or pool is unknown."""
    gpus: float = 0.0
    """Its instance type's physical GPUs (0 when the type is unknown): what its price per GPU divides by."""
    not_initialized: str | None = None
    """Why its node is not initialized yet (`initialization.not_initialized`), or None once it is."""
    removed: bool = False
    locked: bool = False
    """Took pods in this pass: it stays."""
    usable: bool = False
    """May take pods: Registered, Ready, schedulable, not being disrupted, its allocatable known."""
    arrived: list[NodePod] = field(default_factory=list)
    """Pods moved onto it by decisions of this pass: beside its own, what moved pods' anti-affinity weighs."""
    _view: NodeClaim | None = None
    _free: dict[str, int] | None = None
    _shown: tuple[object, ...] | None = None

    @property
    def utilization(self) -> float:
        """The largest share of any resource taken (pods slots aside): what orders candidates and destinations."""
        if self.capacity is None:
            return 0.0
        return max((self.used[k] / v for k, v in self.capacity.items() if v > 0 and k != PODS), default=0.0)

    @property
    def requested_share(self) -> tuple[float, str]:
        """What Cluster Autoscaler weighs before scaling a node down, and of what: on a node with GPUs the share of
        them its pods request (time-sliced replicas and MIG devices as the node offers them; the most requested
        kind), elsewhere the larger of its CPU and memory shares."""
        if self.capacity is None:
            return 0.0, "resources"
        capacity = self.capacity
        gpus = [k for k in capacity if capacity[k] > 0 and (k == GPU or k.startswith(MIG_PREFIX))]
        keys, what = (gpus, "GPUs") if gpus else ([k for k in (CPU, MEMORY) if capacity.get(k, 0) > 0], "CPU or memory")
        return max((self.used.get(k, 0) / capacity[k] for k in keys), default=0.0), what

    @property
    def free(self) -> dict[str, int]:
        if self._free is None:
            assert self.capacity is not None
            self._free = (self.capacity - self.used).as_dict()
        return self._free

    def take(self, requests: Resources) -> None:
        self.used = self.used + requests
        self._view = None
        self._free = None
        self._shown = None

    def as_in_flight(self) -> NodeClaim:
        """The node as the solver sees a claim in flight: its free room is what its pods leave. Fullest first
        (the solver fills claims in flight oldest first, so `created_at` carries the order): best fit, which
        keeps the emptiest nodes free to go."""
        if self._view is None:
            claim = self.claim
            order = timedelta(microseconds=round((1.0 - min(self.utilization, 1.0)) * 1e9))
            self._view = claim.model_copy(update={
                "state": ClaimState.LAUNCHED, "gang": None, "launched_price_per_hour": self.price,
                "created_at": _RANK_EPOCH + order,
                "attributes": {**claim.attributes, REQUESTS_ATTRIBUTE: requests_attribute(self.used)},
            })
        return self._view

    def shown(self) -> tuple[object, ...]:
        """What `as_in_flight` is made of — its claim (every field), price, used and capacity — for the solve
        memo's key: equal for equal views, without building the view."""
        if self._shown is None:
            capacity = tuple(sorted(self.capacity.items())) if self.capacity is not None else None
            self._shown = ("in flight", claim_print(self.claim), self.price, tuple(sorted(self.used.items())),
                           capacity)
        return self._shown

    @property
    def name(self) -> str:
        return self.item.node.name

    @property
    def claim(self) -> NodeClaim:
        assert self.item.claim is not None
        return self.item.claim


class GroupJudge:
    """The judgement of groups, over the pass's picture (`consolidation._Pass` sets these up)."""

    solver: Solver
    catalog: Catalog
    nodes: list[GroupNode]
    others: list[NodeClaim]
    """Claims without a node in the picture: in flight, or draining nodes already gone."""
    charged: bool
    """Whether nodes that take no pods must still be shown to the solver, for pool limits and vCPU quotas."""
    unavailable: Collection[OfferingKey]
    quotas: Mapping[str, int] | None
    outside: Mapping[str, int] | None
    """vCPUs per quota key the account's other instances use."""
    max_replacements: int | None
    """At most this many new nodes per consolidation decision (None: as many as the cheapest placement needs)."""
    config: Config
    free_rooms: FreeRooms | None
    """The usable nodes' free room (`consolidation_floor`), made when first needed; None again once a decision
    changes it."""
    uninitialized: Mapping[str, str]
    """Node name → why it is not initialized yet, for the nodes that may take pods but must not be planned for yet
    (`_decide`)."""
    floors: dict[tuple[str, ...], str | None]
    """Group (its nodes' names) → its floor (`_priced_out`), emptied with `free_rooms`: the multi-node search
    prices single nodes as parts of its pairs, and the single-node phase asks the same nodes again, on the same
    free room unless a decision came in between."""
    repelling: bool
    """Whether a pod of the picture has required pod anti-affinity on the node: without any, nothing below weighs
    labels (`_repelled`, `_kept_apart`)."""

    def _destination_claims(self, exclude: set[str], pods: Sequence[PendingPod], into: Collection[str] | None = None,
                            repelled: Collection[str] = ()) -> tuple[list[GroupNode | NodeClaim], dict[str, str]]:
        """The solver's claims: every node that stays (of `into`, when given; not `repelled`) and has room for one of
        `pods` (`fit.fits`, compared as `FreeRooms` rows), as a claim in flight (the node here: `as_in_flight` makes
        it); the claims that only count against limits and quotas, as they are. Returns (claims, claim id → node
        name)."""
        out: list[GroupNode | NodeClaim] = []
        names: dict[str, str] = {}
        rooms = self._free_rooms()
        with_room = rooms.with_room(list({pod_requests(p) for p in pods}))
        for n in self.nodes:
            if n.item.claim is None or n.pool is None:
                continue
            if n.removed or n.name in exclude:
                out.append(n.claim)  # still running (and paid for) until drained
            elif (n.usable and (into is None or n.name in into) and n.name not in repelled
                  and (row := rooms.row(n)) is not None and with_room >> row & 1):
                out.append(n)
                names[n.claim.id] = n.name
            elif self.charged:
                out.append(n.claim)
        out.extend(self.others)
        return out, names

    def simulate(self, group: Sequence[GroupNode], *, new_nodes: bool = True,
                 into: Collection[str] | None = None) -> tuple[Plan, dict[str, str]]:
        """Where the group's pods go: the solver's plan, or the one it gave for this very question before
        (`consolidation_memo`: the key is everything the solve reads). `new_nodes` False: onto the nodes that stay
        only (`Solver.solve`), for a group that may only be deleted; `into`: onto those of these names only."""
        pods = [entry.pod for n in group for entry in n.item.pods]
        shown, names = self._destination_claims({n.name for n in group}, pods, into, self._repelled(group))
        source = "consolidate:" + "+".join(sorted(n.claim.id for n in group))
        memo = solve_memo(self.solver)
        key = question(pods, [c.shown() if isinstance(c, GroupNode) else ("full", claim_print(c)) for c in shown],
                       self.unavailable, source, self.quotas, self.solver, new_nodes=new_nodes, outside=self.outside)
        now = self.solver.clock.now()
        plan = memo.get(key, now)
        if plan is None:
            claims = [c.as_in_flight() if isinstance(c, GroupNode) else _full(c) for c in shown]
            plan = self.solver.solve(pods, claims=claims, unavailable=self.unavailable, source=source,
                                     quotas=self.quotas, outside=self.outside, new_nodes=new_nodes)
            memo.put(key, plan)
        return plan, names

    def evaluate(self, group: Sequence[GroupNode], reason: DisruptionReason) -> Decision | str:
        """The decision for draining `group` together, or why there is none.

        A group of several nodes is first rid of the nodes a replacement would merely swap (`_swapped`): kept, and
        the group looked at again without them. A replacement that re-buys a group node's type at no lower price but
        carries other pods (a repack: two high-memory nodes and an 8-GPU node become two 8-GPU nodes, one of each
        pod kind on each) is weighed against the group without those nodes, and taken only when it saves more and
        leaves fewer nodes than it drains: otherwise keeping the node moves fewer pods and launches less."""
        group = list(group)
        if len(group) == 1 and reason != "Drifted":
            floor = self._priced_out(group)
            if floor is not None:
                return floor
        apart = self._kept_apart(group)
        if apart is not None:
            return apart
        while True:
            plan, names = self.simulate(group, new_nodes=not _solved_without_new_nodes(group, reason))
            if len(group) < 2 or reason == "Drifted":
                return self._decide(group, reason, plan, names)
            swapped = self._swapped(group, plan.claims, whole=True)
            if swapped:
                group = [n for n in group if n.name not in swapped]
                if not group:
                    return _SAME_TYPE
                continue
            found = self._decide(group, reason, plan, names)
            same = self._swapped(group, plan.claims, whole=False)
            if not same:
                return found
            rest = [n for n in group if n.name not in same]
            alternative = self.evaluate(rest, reason) if rest else _SAME_TYPE
            if isinstance(found, str) or len(found.replacements) >= len(group) or (
                    isinstance(alternative, Decision) and alternative.saving >= found.saving - EPS):
                return alternative
            return found

    def deletion_into(self, n: GroupNode, into: Sequence[GroupNode]) -> Decision | None:
        """The node deleted, its pods moved onto the free room of `into` only; None when they do not all fit there."""
        if self._kept_apart([n]) is not None:
            return None
        plan, names = self.simulate([n], new_nodes=False, into={d.name for d in into})
        found = self._decide([n], "Underutilized", plan, names)  # a pod left unschedulable: a reason, not a decision
        if isinstance(found, str):
            return None
        return replace(found, detail=f"its pods fit in the sunk room of {len(found.destinations)} other nodes")

    def _repelled(self, group: Sequence[GroupNode]) -> frozenset[str]:
        """The nodes that stay onto which one of the group's pods may not move: a required anti-affinity term on the
        node of the moving pod counts one of its pods (or of those moved there this pass), or one of theirs counts
        the moving pod — kube-scheduler's InterPodAffinity filter checks both. They are left out of the group's
        destinations whole (its other pods too): the simplest plan that is never refused. Karpenter's
        `SimulateScheduling` checks the same through its scheduler's `Topology` (kubernetes-sigs/karpenter
        pkg/controllers/provisioning/scheduling/topology.go)."""
        if not self.repelling:
            return frozenset()
        names = {n.name for n in group}
        moving = [entry for n in group for entry in n.item.pods]
        terms = [m for m in moving if m.repels]
        out = set()
        for d in self.nodes:
            if d.removed or not d.usable or d.name in names or d.capacity is None:
                continue
            residents = (*d.item.pods, *d.arrived)
            if any(_counts(m, r) for m in terms for r in residents) or any(
                    _counts(r, m) for r in residents if r.repels for m in moving):
                out.add(d.name)
        return frozenset(out)

    def _kept_apart(self, group: Sequence[GroupNode]) -> str | None:
        """Why the group's pods cannot be planned together: two of them repel each other on the node and the
        packer's per-node groups would not keep them apart (`packing.zones.per_node`: only terms that count the pod
        itself, shared by the other, make one); None when they would, or none repel."""
        if not self.repelling:
            return None
        moving = [entry for n in group for entry in n.item.pods]
        for a in moving:
            if not a.repels:
                continue
            for b in moving:
                if b is not a and _counts(a, b) and not _apart_groups(a.pod) & _apart_groups(b.pod):
                    return (f"anti-affinity: pods {a.pod.key} and {b.pod.key} repel each other on the node, and the "
                            "plan could put them together")
        return None

    def _free_rooms(self) -> FreeRooms:
        """The usable nodes' free room, made once per pass until a decision changes it."""
        if self.free_rooms is None:
            self.free_rooms = FreeRooms([(d, d.free) for d in self.nodes if d.usable and not d.removed])
        return self.free_rooms

    def priced_out(self, group: Sequence[GroupNode]) -> bool:
        """Whether no judgement of the group can save, by the floor alone: not one of its subgroups can
        (`_priced_out`). A group's judgement decides on the group or on part of it (`evaluate` keeps nodes a
        replacement would merely swap and looks again without them), each part drained while the rest of the
        cluster, the group's other nodes among it, takes what it can; so when every part is priced out, so is
        the group. Up to `GROUP_FLOOR_MAX` nodes: a group of n has 2^n − 1 parts."""
        if not group or len(group) > GROUP_FLOOR_MAX:
            return False
        return all(self._priced_out(part) is not None
                   for size in range(1, len(group) + 1) for part in combinations(group, size))

    def _priced_out(self, group: Sequence[GroupNode]) -> str | None:
        """Why no plan for draining the group (its pool's nodes, judged not Drifted) can save
        (`consolidation_floor`), or None when one might; asked again before a decision, the answer it gave."""
        key = tuple(n.name for n in group)
        if key not in self.floors:
            self.floors[key] = self._floor(group)
        return self.floors[key]

    def _floor(self, group: Sequence[GroupNode]) -> str | None:
        """`_priced_out`, computed. A group `_deletion_only` is refused as soon as one of its pods fits on no node
        outside it."""
        if not any(n.item.pods for n in group):
            return None
        pods = [pod for n in group for pod in n.item.footprints]
        whose = "its" if len(group) == 1 else "the nodes'"
        other = "other node" if len(group) == 1 else "node outside them"
        if _deletion_only(group):
            stranded = self._free_rooms().stranded(pods, group)
            return f"{_DELETION_ONLY}, and {len(stranded)} of {whose} pods fit on no {other}" if stranded else None
        types = type_rooms(self.config, self.solver)
        price = sum(n.price for n in group)
        together = ([sum((n.item.footprint for n in group[1:]), group[0].item.footprint)]
                    if self.max_replacements == 1 else pods)
        if self._cheaper_home(types, together, price):
            return None
        left = self._free_rooms().stranded(pods, group)
        if not left or self._cheaper_home(types, left, price):
            return None
        return (f"no saving: {len(left)} of {whose} pods fit on no {other}, and no type cheaper than "
                f"{whose} ${price:.4f}/h holds {'them' if self.max_replacements == 1 else 'each of them'}")

    def _cheaper_home(self, types: TypeRooms, pods: Sequence[Resources], price: float) -> bool:
        """Whether new nodes for `pods` could cost under `price`: one type cheaper holding them together (one
        replacement allowed), else each of them."""
        if self.max_replacements == 1:
            return types.cheapest(sum(pods[1:], pods[0])) < price - EPS
        return all(types.cheapest(pod) < price - EPS for pod in pods)

    def _swapped(self, group: Sequence[GroupNode], replacements: Sequence[NodeClaim], *, whole: bool) -> set[str]:
        """The group's nodes a replacement would re-buy: for each new claim none of whose instance types is cheaper
        anywhere than a node of the group of one of those types, one such node (the fullest of the cheapest).
        `whole`: only a node all of whose pods (by kind) the replacement carries — keeping it and putting the
        replacement's other pods on its room is the same plan with fewer pods moved.

        Karpenter's multi-node consolidation (one replacement carrying every pod) drops a replacement's types that
        are not cheaper than a candidate of the same type, and the decision with them, 'or we should just keep
        that one and do a deletion only' (`filterOutSameInstanceType`, kubernetes-sigs/karpenter
        pkg/controllers/disruption/multinodeconsolidation.go). Without it, one removable node taken with N full
        ones 'saved' that node's price while the N were replaced by their own offering (issue 19's soak)."""
        by_type: dict[str, list[GroupNode]] = {}
        for n in group:
            if n.claim.instance_type:
                by_type.setdefault(n.claim.instance_type, []).append(n)
        shapes = {entry.pod.uid: pod_shape(entry.pod) for n in group for entry in n.item.pods} if whole else {}
        kept: set[str] = set()
        for claim in replacements:
            mine = [n for name in claim.instance_types for n in by_type.get(name, ()) if n.name not in kept]
            if whole and mine:
                carried = Counter(shapes[uid] for uid in claim.pods if uid in shapes)
                mine = [n for n in mine if not Counter(shapes[e.pod.uid] for e in n.item.pods) - carried]
            if not mine:
                continue
            keep = min(mine, key=lambda n: (n.price, -n.utilization, n.name))
            if all(min(self._zone_prices(claim, name), default=float("inf")) >= keep.price - EPS
                   for name in claim.instance_types):
                kept.add(keep.name)
        return kept

    def _decide(self, group: Sequence[GroupNode], reason: DisruptionReason, plan: Plan,
                names: dict[str, str]) -> Decision | str:
        if plan.unschedulable:
            first = plan.unschedulable[0]
            if _solved_without_new_nodes(group, reason):
                return f"{_DELETION_ONLY}, and pod {first.name} fits on no other node"
            return f"no room: pod {first.name} fits nowhere else ({first.reason})"
        before = sum(n.price for n in group)
        pool = group[0].claim.pool
        destinations = {names[cid]: tuple(uids) for cid, uids in plan.existing.items() if cid in names}
        for name in destinations:
            # Karpenter refuses a command whose simulation puts a pod onto a node not initialized yet
            # (`SimulateScheduling`, pkg/controllers/disruption/helpers.go): it may never come up, or not as
            # planned. The group waits until it is, and its room is known.
            why = self.uninitialized.get(name)
            if why is not None:
                return (f"uninitialized: {'its' if len(group) == 1 else 'their'} pods would go onto {name}, "
                        f"not initialized yet ({why})")
        nodes = tuple(n.name for n in group)
        claim_ids = tuple(n.claim.id for n in group)
        if not plan.claims:
            detail = (f"its pods fit on {len(destinations)} other nodes' free room" if destinations
                      else "no pods to move")
            return Decision(reason, "delete", pool, nodes, claim_ids, before, 0.0, (), destinations, detail)
        replacements = list(plan.claims)
        if reason != "Drifted" and self.max_replacements is not None and len(replacements) > self.max_replacements:
            return (f"too many replacements: its pods need {len(replacements)} new nodes, "
                    f"at most {self.max_replacements} allowed")
        if reason != "Drifted":
            narrowed = self._cheaper(replacements, before, group)
            if isinstance(narrowed, str):
                return narrowed
            replacements = narrowed
        # Chosen for its price at its capacity type (`_cheaper`): never launched as a dearer one (drift: any).
        pinned = {} if reason == "Drifted" else {CAPACITY_TYPE_PINNED_ATTRIBUTE: "true"}
        replacements = [c.model_copy(update={
            "reason": f"consolidation ({reason}): replaces {', '.join(nodes)}",
            "attributes": {**c.attributes, REPLACES_ATTRIBUTE: ",".join(claim_ids), **pinned},
        }) for c in replacements]
        after = sum(c.price_per_hour for c in replacements)
        counts = Counter(f"{c.capacity_type} {c.instance_types[0]}" for c in replacements)
        kinds = ", ".join(f"{n}× {kind}" if n > 1 else kind for kind, n in sorted(counts.items()))
        moved = f", the rest onto {len(destinations)} other nodes' free room" if destinations else ""
        detail = (f"{sum(len(c.pods) for c in replacements)} pods onto {len(replacements)} new "
                  f"node{'s' if len(replacements) > 1 else ''} ({kinds}; ${after:.4f}/h){moved}")
        return Decision(reason, "replace", pool, nodes, claim_ids, before, after, tuple(replacements),
                        destinations, detail)

    def _cheaper(self, replacements: list[NodeClaim], before: float,
                 group: Sequence[GroupNode]) -> list[NodeClaim] | str:
        """The replacements with only candidates that keep the total below what they replace, whichever the
        fleet launches (each gets a share of the saving, in proportion to its expected price); the
        spot-to-spot gate."""
        if _deletion_only(group):
            return _DELETION_ONLY
        if _spot_group(group) and any(c.capacity_type != "spot" for c in replacements):
            return _SPOT_ONLY
        expected = sum(c.price_per_hour for c in replacements)
        if expected >= before - EPS:
            nodes = "the nodes" if len(group) > 1 else "the node"
            return f"no saving: the cheapest placement costs ${expected:.4f}/h, {nodes} ${before:.4f}/h"
        all_spot = all(n.claim.capacity_type == "spot" for n in group)
        out = []
        for claim in replacements:
            ceiling = claim.price_per_hour * before / expected
            keep = [name for name in claim.instance_types if self._worst(claim, name) < ceiling - EPS]
            if not keep:
                return f"no saving: no {claim.instance_types[0]} offering in {', '.join(claim.zones)} stays cheaper"
            if claim.capacity_type == "spot" and all_spot:
                pool = group[0].pool
                assert pool is not None
                if not pool.disruption.spot_to_spot:
                    return _DELETION_ONLY  # a pool that no longer launches Spot, its pods planned in one that does
                if len(group) == 1:
                    if len(keep) < SPOT_TO_SPOT_MIN_TYPES:
                        return f"spot-to-spot: only {len(keep)} cheaper spot types, {SPOT_TO_SPOT_MIN_TYPES} needed"
                    keep = keep[:SPOT_TO_SPOT_MIN_TYPES]
            price = min(self._zone_prices(claim, keep[0]))
            out.append(claim.model_copy(update={"instance_types": tuple(keep), "price_per_hour": price}))
        return out

    def _zone_prices(self, claim: NodeClaim, instance_type: str) -> list[float]:
        found = (self.catalog.price((instance_type, z, claim.capacity_type)) for z in claim.zones)
        return [p for p in found if p is not None]

    def _worst(self, claim: NodeClaim, instance_type: str) -> float:
        return max(self._zone_prices(claim, instance_type), default=float("inf"))


def _spot_group(group: Sequence[GroupNode]) -> bool:
    """Whether a replacement of the group takes Karpenter's spot-to-spot path: every node Spot, in a pool that may
    launch Spot. `computeConsolidation` (kubernetes-sigs/karpenter pkg/controllers/disruption/consolidation.go)
    sends every all-Spot candidate set whose replacement's requirements allow Spot to
    `computeSpotToSpotConsolidation`, whatever capacity type the cheapest replacement would have. The pods of a
    Spot node all allow Spot (a required capacity-type selector would have kept them off it), so the replacement's
    requirements allow Spot when the pool does. That path refuses without the feature gate (`_deletion_only`), and
    with it requires the replacement to be Spot (it adds `karpenter.sh/capacity-type In [spot]`): a Spot node is
    never replaced by On-Demand, even when Spot has no capacity for the smaller type."""
    pool = group[0].pool
    return pool is not None and "spot" in pool.capacity_types and all(n.claim.capacity_type == "spot" for n in group)


def _deletion_only(group: Sequence[GroupNode]) -> bool:
    """Whether the group may be deleted but not replaced: a `_spot_group` in a pool that does not opt in to
    spot-to-spot. Karpenter: "For spot nodes, Karpenter has deletion consolidation enabled by default" (its
    disruption docs)."""
    pool = group[0].pool
    return pool is not None and not pool.disruption.spot_to_spot and _spot_group(group)


def _solved_without_new_nodes(group: Sequence[GroupNode], reason: DisruptionReason) -> bool:
    """One node that may only be deleted needs no more than where its pods go on the nodes that stay; a group's plan
    must name its new nodes, to find those it would merely swap (`GroupJudge._swapped`), and drift replaces."""
    return len(group) == 1 and reason != "Drifted" and _deletion_only(group)


def _full(claim: NodeClaim) -> NodeClaim:
    """A claim as the solver must see it: counted against limits and quotas, with no room for anyone."""
    if claim.state not in IN_FLIGHT_STATES:
        return claim
    return claim.model_copy(update={"attributes": {**claim.attributes, REQUESTS_ATTRIBUTE: _FULL}})


_FULL = requests_attribute({GPU: 10**9})
_SAME_TYPE = "no saving: each node would be replaced by its own instance type at no lower price"
_DELETION_ONLY = "spot-to-spot: the pool does not opt in (disruption.spotToSpot), so Spot nodes are only deleted"
_SPOT_ONLY = "spot-to-spot: Spot nodes are replaced by Spot only, and only capacity that is not Spot holds their pods"


def _pod_shape(pod: PendingPod) -> str:
    """Priority stays last: pods sort by this string and one number may be a prefix of another (1, 10), so only with it
    last does the `[]` every pod without preferences carries keep their order as before preferences were added."""
    return json.dumps(
        [pod.requests, pod.node_selector, [t.model_dump(mode="json") for t in pod.required_node_affinity],
         [t.model_dump(mode="json") for t in pod.tolerations],
         [t.model_dump(mode="json") for t in pod.preferred_node_affinity], pod.priority],
        sort_keys=True, separators=(",", ":"),
    )


pod_shape: PerObject[PendingPod, str] = PerObject(_pod_shape)
"""Everything about a pod that decides where it may go, as canonical JSON: equal for pods the packer cannot tell
apart, and a string, so a node's pods sort whatever their constraints (each pod's computed once)."""


def _counts(a: NodePod, b: NodePod) -> bool:
    """Whether a required anti-affinity term of `a` on the node counts `b`."""
    return any(t.counts(a.pod.namespace, b.pod.namespace, b.labels) for t in a.repels)


_apart_groups: PerObject[PendingPod, frozenset[str]] = PerObject(apart_groups)
"""`packing.zones.apart_groups`, kept per pod: `_kept_apart` asks it of every pair of a group's repelling pods."""


node_labels: PerObject[ConsolidationNode, tuple[str, ...]] = PerObject(lambda item: tuple(sorted(
    json.dumps([e.pod.namespace, e.labels, [t.model_dump(mode="json") for t in e.repels]], sort_keys=True)
    for e in item.pods)))
"""What anti-affinity reads of a node's pods (namespace, labels, terms), sorted, kept per node object: beside
`node_shape`, two nodes alike in it are alike for `GroupJudge._repelled` too."""


def candidate_order(n: GroupNode) -> tuple[float, float, str]:
    """Emptiest first, then dearest: the order candidates are weighed in."""
    return n.utilization, -n.price, n.name


def node_shape(n: GroupNode) -> tuple[object, ...]:
    """What a single-node decision depends on besides the rest of the cluster: the offering and the pods (as a
    multiset: each pod's canonical form, sorted — affinity terms and tolerations are models with no order). Kept per
    node object while the pass's figure of its use is the very one it was computed from (`_Pass._node` hands the same
    one pass after pass; a node that takes pods gets another)."""
    found = _node_shapes.get(id(n.item))
    if found is not None and found[0] is n.item and found[1] is n.used and found[2] == n.price:
        return found[3]
    claim = n.claim
    shape = (claim.pool, claim.capacity_type, claim.instance_type, claim.zone, round(n.price, 6),
             tuple(sorted(n.used.items())), _node_pod_shapes(n.item))
    if len(_node_shapes) >= PER_OBJECT_LIMIT:
        _node_shapes.clear()
    _node_shapes[id(n.item)] = (n.item, n.used, n.price, shape)
    return shape


_node_shapes: dict[int, tuple[ConsolidationNode, Resources, float, tuple[object, ...]]] = {}
"""`node_shape` by node object (held, so its id is not reused), with the use and price it was computed from."""


_node_pod_shapes: PerObject[ConsolidationNode, tuple[str, ...]] = PerObject(
    lambda item: tuple(sorted(pod_shape(entry.pod) for entry in item.pods)))
"""A node's pods' shapes, sorted, kept per node object (the same object pass after pass until its pods change)."""

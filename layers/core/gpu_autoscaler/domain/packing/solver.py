"""The packing decision: pending pods in, a `Plan` out. It decides; it never acts.

`Solver(config, catalog, clock).solve(pods, claims=..., covered=..., unavailable=...)` — Karpenter's
`Solve(pods) -> Results` with the instance types and offerings already fetched. The order of decisions
is the order of the rules:

1. Pods already covered by a live claim are left alone (idempotency: the agent reports a pod until it
   runs, and each report must not buy another node).
   A pod's preferred node affinity counts as required, its heaviest term first, while an offering of some
   pool may hold the pod under it (`preferences`, as Karpenter relaxes preferences).
2. Pods go onto live claims with room first (claims not yet registered: their node is on its way).
3. Node pools from the heaviest; within a pool its capacity types in order reserved → spot → on-demand.
   A pod class goes to the first (pool, capacity type) with an offering that may hold it; there, gangs
   are placed whole in one zone, then the rest is bin-packed for the lowest price (see `binpack`).
   Pool limits and vCPU quotas admit nodes one by one; what they turn away tries the next tier.
4. Each new node becomes a NodeClaim whose candidates are every type (cheapest first, at most 60, none
   dearer than `CANDIDATE_PRICE_CEILING` × the first) that holds all its pods in all the claim's zones.
5. Whatever is left gets a reason per pool, in words ("no offering in pool gpu-burst has 8 × H100 in
   us-east-1a").

Gang claims hold only their gang's pods (one launch, all or nothing) and share one zone; in a pool with
`efa: true` they also share one candidate list of EFA-capable types, every one of which fits every gang
node, so the fleet can launch them as one single-instance-type request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.config import CAPACITY_ORDER
from gpu_autoscaler.domain.packing.binpack import Kinds, Opened, pack
from gpu_autoscaler.domain.packing.fit import allocatable, dra_devices
from gpu_autoscaler.domain.packing.fractional import FractionalTypes
from gpu_autoscaler.domain.packing.index import CatalogIndex, requirement_labels
from gpu_autoscaler.domain.packing.memo import PackMemo
from gpu_autoscaler.domain.packing.nodes import PoolView
from gpu_autoscaler.domain.packing.quotas import LimitLedger
from gpu_autoscaler.domain.packing.solve_pass import SolvePass
from gpu_autoscaler.domain.packing.zones import PER_NODE_PREFIX, PER_NODE_UNITS
from gpu_autoscaler.domain.pool_labels import pool_labels
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.requirements import Requirement

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping, Sequence

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config, NodePool
    from gpu_autoscaler.domain.catalog import Catalog, OfferingKey
    from gpu_autoscaler.domain.packing.classes import PodClass
    from gpu_autoscaler.domain.packing.results import Plan
    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.pods import PendingPod

__all__ = ["MASK_ROWS_LIMIT", "Packer", "Solver"]

Packer = Callable[[np.ndarray, np.ndarray, Kinds], list[Opened]]
"""(demand [C], requests [C, R], kinds) → opened nodes: the tier packing step."""

_SELECTOR_CACHE_LIMIT = 8192
MASK_ROWS_LIMIT = 4096
"""Class rows (`Solver.class_row`) a solver keeps at most; past it, cleared."""


class Solver:
    """Decides where pending pods go. Build once per configuration and catalog; `solve` many times."""

    def __init__(
        self,
        config: Config,
        catalog: Catalog | CatalogIndex,
        clock: Clock,
        *,
        quotas: Mapping[str, int] | None = None,
        packer: Packer = pack,
    ) -> None:
        """`quotas`: vCPU quotas by `<group>/<capacity type>` (default: the configuration's `vcpuQuotas`);
        `packer`: how one tier's pods are packed into new nodes (`binpack.pack`, or the baseline's
        `first_fit_decreasing` for comparison) — every other rule is the same whichever is used."""
        self.config = config
        self.packer = packer
        self.packs = PackMemo()
        """The tier questions this solver has packed (benchmarks empty it to time fresh documents)."""
        self.index = catalog if isinstance(catalog, CatalogIndex) else CatalogIndex(catalog, config.zones)
        self.clock = clock
        self.quotas = dict(config.vcpu_quotas if quotas is None else quotas)
        self.fractional = FractionalTypes(self.index.types)
        self.partitioned = np.array([t.partitioned for t in self.index.types], bool)[self.index.type_of]
        """[O] offerings of fractional-GPU types: only for pods or pools that ask (see `fractional`)."""
        self._cluster_labels = {L.REGION: config.region}
        """What every node of the cluster carries whatever its pool: the region (the cloud node controller's)."""
        ordered = sorted(config.node_pools, key=lambda p: (-p.weight, p.name))
        self.pools = [self._view(pool, i) for i, pool in enumerate(ordered)]
        self._pool_by_name = {v.pool.name: v for v in self.pools}
        self._selectors: dict[tuple[str, tuple[object, ...]], np.ndarray] = {}
        self._matrices: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}
        self.mask_rows: dict[tuple[object, ...], np.ndarray] = {}
        """Each pod class's row of offerings it may go to, by pool, resource axes, requests, constraints and the
        offerings available (`class_row`): pure, and asked again on every consolidation candidate."""
        names = [t.name for t in self.index.types]
        self.name_rank = np.argsort(np.argsort(names, kind="stable"), kind="stable")
        """[T] each catalog type's place in name order: the tie-break among candidates of one price."""

    # Static, per configuration and catalog

    def _view(self, pool: NodePool, position: int) -> PoolView:
        idx = self.index
        fixed = {**pool_labels(pool), **self._cluster_labels}
        allowed = tuple(c for c in CAPACITY_ORDER if c in pool.capacity_types)
        reservations = frozenset(r.id for r in pool.capacity_reservations)
        base = np.isin(idx.capacity_of, [idx.capacity_code(c) for c in allowed])
        reserved = idx.capacity_code("reserved")
        for i, offering in enumerate(idx.offerings):
            if base[i] and idx.capacity_of[i] == reserved and offering.reservation_id not in reservations:
                base[i] = False
        for requirement in pool.requirements:
            base &= idx.requirement_mask(requirement, fixed)
        base &= self._has_image(pool)[idx.type_of]
        alloc = [allocatable(t, pool, self.config.overhead).as_dict() | dra_devices(t, pool) for t in idx.types]
        tiers = {c: idx.tier(base, c) for c in allowed}
        for positions in tiers.values():
            positions.flags.writeable = False
        return PoolView(pool, position, fixed, base, alloc, allowed, reservations,
                         self.fractional.requirements_ask(pool.requirements), tiers)

    def _has_image(self, pool: NodePool) -> np.ndarray:
        """[T] types whose architecture the pool's AMI has an image for: the fleet launches no other
        (`domain.fleet.candidate_offerings`), as Karpenter offers only types an EC2NodeClass's AMIs can boot
        (karpenter.sh, NodeClasses › spec.amiSelectorTerms)."""
        ami = self.config.pool_ami(pool)
        arches = {"x86_64"} | ({"arm64"} if ami.arm64 else set())
        return np.array([("arm64" if t.architecture == "arm64" else "x86_64") in arches for t in self.index.types],
                        bool)

    def excludes_fractional(self, view: PoolView, cls: PodClass) -> bool:
        """Fractional-GPU offerings are closed to this class in this pool: neither asked for them."""
        return (bool(self.fractional) and not view.fractional_ok
                and not self.fractional.selector_asks(cls.node_selector, cls.affinity))

    def matrix(self, pool: str, names: tuple[str, ...]) -> np.ndarray:
        """[T, R] allocatable of every catalog type in the pool, on the given resource axes."""
        key = (pool, names)
        found = self._matrices.get(key)
        if found is None:
            view = self._pool_by_name[pool]
            # Every node has the same room for each per-node group (`zones.per_node`).
            found = np.array([[a.get(n, PER_NODE_UNITS if n.startswith(PER_NODE_PREFIX) else 0) for n in names]
                              for a in view.allocatable], np.int64).reshape(
                len(view.allocatable), len(names)
            )
            self._matrices[key] = found
        return found

    def holds(self, claim: NodeClaim, requests: Mapping[str, int]) -> bool:
        """Whether every type the claim may still be (its instance's, once launched, else each candidate) holds
        `requests` in its pool: the room `SolvePass._place_in_flight` offers on a claim in flight, asked again of
        a claim another planner wrote since this one planned (`services.packer`). Types the catalog no longer has
        are left out, as the plan leaves them (`claim_types`); a claim with none left, or of a pool
        the configuration no longer has, holds nothing more."""
        view = self._pool_by_name.get(claim.pool)
        names = [claim.instance_type] if claim.instance_type else list(claim.instance_types)
        positions = [p for n in names if (p := self.index.type_position.get(n)) is not None]
        if view is None or not positions:
            return False
        return all(value <= view.allocatable[p].get(name, PER_NODE_UNITS if name.startswith(PER_NODE_PREFIX) else 0)
                   for p in positions for name, value in requests.items() if value > 0)

    def claim_types(self, claim: NodeClaim) -> list[InstanceType]:
        """The types a claim may still be (its instance's, once launched, else each candidate) that the catalog
        still has."""
        names = [claim.instance_type] if claim.instance_type else list(claim.instance_types)
        return [t for n in names if (t := self.index.catalog.get(n)) is not None]

    def limit_charge(self, claim: NodeClaim, types: Sequence[InstanceType]) -> tuple[float, float]:
        """(GPUs, USD/h) a live claim takes of its pool's `limits`: its largest candidate's GPUs, and its price once
        launched, else the dearest of its candidates' offerings (the fleet may launch any of them)."""
        if claim.launched_price_per_hour is not None:
            price = claim.launched_price_per_hour
        else:
            idx = self.index
            price = max([claim.price_per_hour, *(
                float(idx.price[i]) for t in types for zone in claim.zones
                for i in idx.positions.get((t.name, zone, claim.capacity_type), ()))])
        return max(t.gpus for t in types), price

    def bounded_pool(self, pool: str) -> bool:
        """Whether the configuration still has the pool and it sets `limits`."""
        view = self._pool_by_name.get(pool)
        return view is not None and view.pool.limits.bounded

    def beyond_limits(self, live: Iterable[NodeClaim], own: Sequence[NodeClaim], *,
                      together: bool = False) -> list[NodeClaim]:
        """Of the claims a planner has just stored (`own`, in the order it planned them), those that take their
        pool past its `limits` once every other live claim (`live`, read after storing) is counted first; a gang's
        claims all or none, and with `together` all of `own` or none.

        Each planner checked the limits against the claims it read before planning, and nothing serialises the
        planners (the interruption function plans replacements in its own invocations, beside the packer and
        prewarm): two may each fill the room left. Asked of each after its claims are stored, of a read that
        follows the store, this withdraws at least one of any two that overfill a pool together (the one that
        asks later sees the other's); both withdraw when both ask after both stored, and their pods wait one more
        report. Karpenter checks the limits again just before each create (`provisioner.go`, `ExceededBy`), from
        one provisioner at a time."""
        own_ids = {c.id for c in own}
        limits = {v.pool.name: LimitLedger(v.pool) for v in self.pools if v.pool.limits.bounded}
        if not limits:
            return []
        for claim in live:
            if claim.id in own_ids or not claim.live or (ledger := limits.get(claim.pool)) is None:
                continue
            if types := self.claim_types(claim):
                ledger.charge(*self.limit_charge(claim, types))
        groups: dict[str, list[NodeClaim]] = {}
        for claim in own:
            groups.setdefault(f"gang:{claim.gang}" if claim.gang else claim.id, []).append(claim)
        beyond: list[NodeClaim] = []
        for group in groups.values():
            per_pool: dict[str, tuple[float, float]] = {}
            for claim in group:
                if claim.pool in limits and (types := self.claim_types(claim)):
                    gpus, price = self.limit_charge(claim, types)
                    known = per_pool.get(claim.pool, (0.0, 0.0))
                    per_pool[claim.pool] = (known[0] + gpus, known[1] + price)
            if all(limits[pool].admits(*charge) for pool, charge in per_pool.items()):
                for pool, charge in per_pool.items():
                    limits[pool].charge(*charge)
            else:
                beyond.extend(group)
        if together and beyond:
            return list(own)
        return beyond

    def class_row(self, key: tuple[object, ...], make: Callable[[], np.ndarray]) -> np.ndarray:
        """The class row filed under `key` (`SolvePass._class_masks`), made once, read-only; at most
        `MASK_ROWS_LIMIT` kept (~1 KB each on the full catalog), then cleared."""
        found = self.mask_rows.get(key)
        if found is None:
            found = make()
            found.flags.writeable = False
            if len(self.mask_rows) >= MASK_ROWS_LIMIT:
                self.mask_rows.clear()
            self.mask_rows[key] = found
        return found

    def selector_mask(self, view: PoolView, cls: PodClass) -> np.ndarray:
        """[O] offerings whose node labels (in this pool) satisfy the class's selector and affinity."""
        key = (view.pool.name, cls.constraint_key[:2])
        found = self._selectors.get(key)
        if found is None:
            idx = self.index
            mask = np.ones(len(idx), bool)
            for label, value in cls.node_selector:
                mask &= idx.requirement_mask(Requirement(key=label, operator="In", values=(value,)), view.fixed_labels)
            if cls.affinity:
                anyterm = np.zeros(len(idx), bool)
                for term in cls.affinity:
                    termmask = np.ones(len(idx), bool)
                    for requirement in term.match_expressions:
                        termmask &= idx.requirement_mask(requirement, view.fixed_labels)
                    anyterm |= termmask
                mask &= anyterm
            if len(self._selectors) > _SELECTOR_CACHE_LIMIT:
                self._selectors.clear()
            self._selectors[key] = mask
            found = mask
        return found

    def labels_of(self, view: PoolView, instance_type: InstanceType, zone: str, capacity_type: str) -> dict[str, str]:
        return {**requirement_labels(instance_type, view.pool, zone, capacity_type), **self._cluster_labels}

    def pack(self, demand: np.ndarray, req: np.ndarray, kinds: Kinds) -> list[Opened]:
        """`packer(demand, req, kinds)`, each distinct question packed once (`packs`): consolidation weighs the
        same leftovers against the same tier on pass after pass."""
        return self.packs(self.packer, demand, req, kinds)

    # The decision

    def solve(
        self,
        pods: Sequence[PendingPod],
        *,
        claims: Sequence[NodeClaim] = (),
        covered: Mapping[str, str] | None = None,
        unavailable: Collection[OfferingKey] = (),
        source: str = "",
        quotas: Mapping[str, int] | None = None,
        outside: Mapping[str, int] | None = None,
        new_nodes: bool = True,
    ) -> Plan:
        """Plan capacity for `pods`.

        `claims`: the cluster's live claims (room in flight, and what counts against limits and quotas);
        `covered`: pod uid → claim id from the state store's assignments (it covers the pod only if that claim
        is among `claims` and live); `unavailable`: offerings
        marked unavailable after insufficient capacity; `source`: salts claim ids (the message id), so a
        redelivered message plans the same ids and a later one new ones; `quotas`: this pass's vCPU quotas
        (default: the solver's); `outside`: the vCPUs per quota key the account's other instances use
        (`quotas.vcpus_outside`; none by default); `new_nodes` False: place pods on the room of claims in flight
        only, and leave the rest unschedulable without opening a node (a consolidation that may only delete asks no
        more; the pods' places on that room are the same either way, as it is filled before any node is opened).
        """
        return SolvePass(self, pods, claims, covered or {}, unavailable, source, quotas, outside,
                         new_nodes=new_nodes).run()

"""Consolidation: give back capacity that is not needed, never hurt what must not be interrupted.

Pure: the cluster's nodes (each with its NodeClaim and the pods that would move if it were drained),
the packer's `Solver` (configuration and catalog), the claims in flight and the offerings marked
unavailable in; a `ConsolidationResult` out — decisions, each with the USD/h it saves and why, and for
every node left alone the reason. The consolidate service acts on it (replacement claims launched first,
then drain requests); the simulator calls the same function.

The input and output shapes are in `consolidation_models`; how one group of nodes is judged (where its pods go,
the replacements, the rules on their types and prices) in `consolidation_group`. Where pods could go is never
decided here: every "do these pods fit" is a `Solver.solve` call, the
packer's own decision. The nodes that stay are shown to the solver as claims in flight whose recorded
requests are what their pods use, so it places the moving pods on their free room first (the packer's
rule 2) and plans new nodes only for the rest — exactly Karpenter's scheduling simulation.

A decision is first a proposal (`domain.disruption_marks`): the pass that finds it returns it in `decisions`;
the service taints its nodes and marks their claims, and the pass of a later tick, once `VALIDATION_DELAY` has
passed, looks at the same nodes again before anything else (`validated` / `invalidated`), as Karpenter's
validation does — only a decision that still holds, and that its pools' budgets still allow, is carried out.

Where moved pods may go: the free room of the nodes that stay, less what the pods on their way to them will take
(`_on_the_way`); a plan that puts one onto a node not initialized yet is refused until it is, as Karpenter's
`SimulateScheduling` refuses it.

One pass, in Karpenter's order, each decision applied to the pass's picture before the next is looked
for (the nodes removed are no longer destinations; the room the moved pods take is taken):

1. Drifted nodes (see `drift`): replaced — their pods onto other nodes' free room plus the new nodes the
   rest need, whatever they cost. The nodes of a pool gone from the configuration all drift at once, bound by no
   budget, warm hold or `minNodeAge` of a pool that is no more (Karpenter deletes a NodePool's NodeClaims with it).
2. Empty nodes (no pods but DaemonSet and mirror pods) empty for `empty_wait` — the pool's `consolidateAfter`,
   and at least `emptyKeepLeadTimes` of its lead time: removed. Replaying the Alibaba trace with Karpenter's
   wait alone, a third of the nodes launched for arriving pods came within 10 minutes of the removal of an empty
   node that would have held them.
3. Pools with `consolidationPolicy: WhenEmptyOrUnderutilized`, among nodes whose pods have not changed for the
   pool's `consolidateAfter` (since the node's last pod event, `ConsolidationNode.pods_changed_at`, else its
   creation: Karpenter's Consolidatable condition), and whose pods request under `underutilizedBelow` of it
   (Cluster Autoscaler's threshold) unless its GPUs cost `DEAR_GPU_RATIO` times the cheapest free GPU's (`_busy`):
   - multi-node: the largest prefix (binary search, as Karpenter's) of the pool's candidates, emptiest
     first, whose pods fit on the other nodes plus new nodes cheaper together than all of them;
     repeated while one is found;
   - single-node: each remaining candidate, emptiest first, removed when its pods fit on the others'
     free room, or replaced by cheaper nodes;
   - sunk room (ours, not Karpenter's: it weighs every node above): a node left out as busy (its pods request at
     least `underutilizedBelow` of it, Cluster Autoscaler's threshold) is removed when its pods all fit in the free
     room of nodes that stay (kept above, or busy) whose own pods no cheaper new nodes would hold — room paid for
     as long as they run (`Disruption.into_sunk_room`; the phase is `consolidation_sunk`).

A replacement's candidate types are only those cheaper than what it replaces, so whichever the fleet
launches saves money. Without the pool's `disruption.spotToSpot`, Spot nodes in a pool that may launch Spot are
only deleted, never replaced, On-Demand included (Karpenter: "For spot nodes, Karpenter has deletion
consolidation enabled by default"); with it, they are replaced by Spot only, and replacing one
spot node also needs at least `SPOT_TO_SPOT_MIN_TYPES` cheaper candidate types, and is then launched from
the cheapest 15 of them: with fewer, the cheapest spot pool is also the most interrupted one, and chasing
it down the price ladder node by node costs more than it saves (Karpenter's rule; several spot nodes into
fewer cannot race to the bottom, so multi-node consolidation has no such minimum).

Unlike Karpenter, a decision may launch several replacements: GPU instance types come in 1, 4 and 8 GPUs,
so the pods of a half-empty 8-GPU node usually cost least on a few small nodes, not one; all of them are
Ready before the drain starts (the drain request names every one). `max_replacements=1` restores Karpenter's
rule for the simulator's karpenter-like baselines: a group (one node or several) whose pods would need more
than one new NodeClaim is left alone ("Can't remove without creating N candidates", `computeConsolidation` in
kubernetes-sigs/karpenter pkg/controllers/disruption/consolidation.go). Drift is not bounded (Karpenter's
drift launches every replacement its scheduling simulation asks for).

Never touched: nodes with a pod annotated `karpenter.sh/do-not-disrupt: "true"` (a DaemonSet or mirror pod
included, as Karpenter's), nodes holding warm
capacity (a claim's `warm` set, until its `warmUntil`), nodes younger than the pool's
`minNodeAge`, nodes with a pod whose PodDisruptionBudget allows no eviction now (these two pod-level blocks
aside for drift in a pool with a `terminationGracePeriod`, Karpenter's Eventual class), nodes with pods still on
their way to them (a replacement, until the nodes it replaces are gone), proposed nodes a pending pod would be
scheduled on (it fits in their free room, our own disrupted taint aside: Karpenter's candidates and its validation leave
out a node nominated for a pending pod — `pkg/controllers/disruption/validation.go`, `IsNodeNominated` — so a
node proposed for removal is given back to the pod that arrived meanwhile rather than bought again), nodes not
Ready or cordoned, and nodes that are not ours. Each pool's disruption budgets bound the nodes disrupted at
once, per reason (`budgets`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from gpu_autoscaler.domain.budgets import allowed_disruptions
from gpu_autoscaler.domain.consolidation_group import (
    EPS,
    SPOT_TO_SPOT_MIN_TYPES,
    GroupJudge,
    GroupNode,
    candidate_order,
    node_labels,
    node_shape,
)
from gpu_autoscaler.domain.consolidation_models import (
    EMPTY_SINCE_ATTRIBUTE,
    POD_SET_ATTRIBUTE,
    PODS_CHANGED_AT_ATTRIBUTE,
    REPLACES_ATTRIBUTE,
    ConsolidationNode,
    ConsolidationResult,
    Decision,
    NodePod,
    Rejection,
    empty_since,
    empty_wait,
    node_pods,
    pod_set,
    pods_changed_at,
    protected_daemons,
    warm_held,
    warm_until,
)
from gpu_autoscaler.domain.consolidation_sunk import into_sunk_room
from gpu_autoscaler.domain.disruption_marks import Proposal, disrupting, proposal
from gpu_autoscaler.domain.drain import DRAIN_TAINT
from gpu_autoscaler.domain.drift import drift_reason
from gpu_autoscaler.domain.initialization import not_initialized, was_initialized
from gpu_autoscaler.domain.packing.classes import plain_of
from gpu_autoscaler.domain.packing.fit import allocatable, fits, pod_requests
from gpu_autoscaler.domain.packing.results import claim_requests
from gpu_autoscaler.domain.per_object import PerObject
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.requirements import terms_match
from gpu_autoscaler.models.resources import GPU, PODS, Resources
from gpu_autoscaler.models.taints import tolerates_all

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence
    from datetime import datetime

    from gpu_autoscaler.config import Config, DisruptionReason, NodePool, Overhead
    from gpu_autoscaler.domain.catalog import Catalog, OfferingKey
    from gpu_autoscaler.domain.packing.solver import Solver
    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.models.cluster import ClusterPod

__all__ = [
    "EMPTY_SINCE_ATTRIBUTE",
    "MULTI_NODE_MAX_CANDIDATES",
    "PODS_CHANGED_AT_ATTRIBUTE",
    "POD_SET_ATTRIBUTE",
    "REPLACES_ATTRIBUTE",
    "SPOT_TO_SPOT_MIN_TYPES",
    "ConsolidationNode",
    "ConsolidationResult",
    "Decision",
    "NodePod",
    "Rejection",
    "consolidate",
    "empty_since",
    "empty_wait",
    "node_pods",
    "pod_set",
    "pods_changed_at",
    "protected_daemons",
    "warm_held",
    "warm_until",
]

MULTI_NODE_MAX_CANDIDATES = 100
"""Karpenter's bound on one multi-node attempt: beyond it the binary search costs more than it finds."""
_ALLOCATABLE: WeakKeyDictionary[Solver, dict[tuple[str, str], tuple[InstanceType, NodePool, Overhead, Resources]]] = (
    WeakKeyDictionary())
"""Per solver (per configuration and catalog): (instance type, pool) → the objects it came from and its allocatable."""
_FIGURES: WeakKeyDictionary[Solver, dict[int, tuple[ConsolidationNode, NodePool | None, Overhead, float, Resources,
                                                     Resources | None, float, str | None]]] = WeakKeyDictionary()
"""Per solver: a node object's id → the node, its pool and overhead, and its price, use, allocatable, physical
GPUs and why it is not initialized (`_node`)."""
_PER_SOLVER_LIMIT = 4096
"""Nodes `_FIGURES` and claims `_DRIFT` keep per solver; past it, cleared."""
_DRIFT: WeakKeyDictionary[Solver, dict[int, tuple[NodeClaim, Config, str | None]]] = WeakKeyDictionary()
"""Per solver: a claim object's id → the claim, the configuration and its `drift_reason` (`_Pass._drift_reason`)."""


def _shape_of_pending(pod: ClusterPod) -> tuple[object, ...]:
    return (tuple(sorted(pod.requests.items())), tuple(sorted(pod.node_selector.items())),
            plain_of(pod.required_node_affinity), plain_of(pod.tolerations))


_pending_shape: PerObject[ClusterPod, tuple[object, ...]] = PerObject(_shape_of_pending)
"""A pending pod's requests and placement constraints, as plain tuples (`packing.classes.plain_of`: equal exactly
when the models are), kept per pod: every pass groups the same waiting pods, and hashing their pydantic
constraints cost a tenth of a pass where thousands wait."""


# The pass


class _Pass(GroupJudge):
    def __init__(self, config: Config, solver: Solver, nodes: Sequence[ConsolidationNode],
                 claims: Sequence[NodeClaim], unavailable: Collection[OfferingKey],
                 quotas: Mapping[str, int] | None, pending: Sequence[ClusterPod] = (),
                 max_replacements: int | None = None, outside: Mapping[str, int] | None = None) -> None:
        self.config = config
        self.max_replacements = max_replacements
        self.solver = solver
        self.catalog: Catalog = solver.index.catalog
        self.now = solver.clock.now()
        self.unavailable = unavailable
        self.unavailable_key = frozenset(unavailable)
        self.sunk_known: dict[str, bool] = {}
        """`consolidation_sunk.is_sunk`, per node name, for this pass."""
        self.quotas = quotas
        self.outside = outside
        self.pools = {p.name: p for p in config.node_pools}
        self.nodes: list[GroupNode] = [self._node(n) for n in nodes]
        for n in self.nodes:
            n.usable = self._usable(n)
        self.uninitialized = {n.name: n.not_initialized for n in self.nodes
                              if n.usable and n.not_initialized is not None}
        self.repelling = any(entry.repels for n in self.nodes for entry in n.item.pods)
        self.by_claim = {n.claim.id: n for n in self.nodes if n.item.claim is not None}
        on_nodes = set(self.by_claim)
        self.others = [c for c in claims if c.id not in on_nodes and c.state is not ClaimState.TERMINATED]
        """Claims without a node in the picture: in flight, or draining nodes already gone."""
        self.live_ids = {c.id for c in self.others} | {
            cid for cid, n in self.by_claim.items() if n.claim.state is not ClaimState.TERMINATED}
        self.free_rooms = None
        self.floors = {}
        self.skipped: dict[str, str] = {}
        self.decisions: list[Decision] = []
        self.taken: dict[str, int] = {}
        self.budget_start: dict[str, dict[str, int | None]] = {}
        self.awaiting: dict[str, int] = {}
        """Per pool, the nodes of proposals due for validation this pass and not validated (yet): counted among the
        disrupting nodes, but not against the proposals being validated (`_budget_recheck`)."""
        self.charged = bool(quotas or config.vcpu_quotas) or any(
            p.limits.gpus is not None or p.limits.price_per_hour is not None for p in config.node_pools)
        """Whether nodes that take no pods must still be shown to the solver, for pool limits and vCPU quotas."""
        self._pool_sizes, self._disrupting = self._budget_counts()
        shapes: dict[tuple[object, ...], ClusterPod] = {}
        for pod in pending:
            if pod.node_name is None and pod.phase == "Pending" and not pod.terminating:
                shapes.setdefault(_pending_shape(pod), pod)
        self.pending = list(shapes.values())
        """The pods waiting for a node, one of each shape (requests and placement constraints)."""

    # Setup

    def _node(self, item: ConsolidationNode) -> GroupNode:
        """The node's part in the pass; its price, use and allocatable kept per node object for as long as the
        solver lives (the simulator hands the same object every pass until the node changes).

        Its use is its pods' footprint, plus the room its pods on their way will take (`_on_the_way`), plus what the
        kubelet reports less than the packer's figure of allocatable — as Karpenter's `StateNode.Allocatable` reads
        it: an initialized node's allocatable as reported, a resource it does not report none; a node not initialized
        yet has what its claim expects where the kubelet still reports zero or nothing (its device plugin has not
        registered), and takes no moved pods anyway (`GroupJudge.uninitialized`)."""
        claim = item.claim
        pool = self.pools.get(claim.pool) if claim is not None else None
        overhead = self.config.overhead
        cache = _FIGURES.setdefault(self.solver, {})
        found = cache.get(id(item))
        if found is not None and found[0] is item and found[1] is pool and found[2] is overhead:
            return GroupNode(item, pool, *found[3:])
        used = item.footprint
        computed = None
        gpus = 0.0
        waiting = _initialization(item) if claim is not None else None
        if claim is not None and pool is not None and claim.instance_type:
            instance_type = self.catalog.get(claim.instance_type)
            if instance_type is not None:
                computed = self._allocatable(instance_type, pool)
                gpus = float(instance_type.gpus)
                reported = item.node.allocatable.as_dict()
                if reported:  # none at all: not known (a Node read without its status), the packer's figure stands
                    used = used + {k: v - reported.get(k, 0) for k, v in computed.items() if v > reported.get(k, 0)
                                   and (waiting is None or reported.get(k, 0) > 0)}
        if item.incoming and claim is not None:
            used = used + _on_the_way(item, claim)
        price = _price(self.catalog, claim) if claim is not None else 0.0
        if len(cache) >= _PER_SOLVER_LIMIT:
            cache.clear()
        cache[id(item)] = (item, pool, overhead, price, used, computed, gpus, waiting)
        return GroupNode(item, pool, price, used, computed, gpus, waiting)

    def _allocatable(self, instance_type: InstanceType, pool: NodePool) -> Resources:
        """`fit.allocatable`, once per instance type and pool for as long as the solver lives (a pass a minute
        over the same few shapes of node); an entry counts only for the very objects it was computed from."""
        cache = _ALLOCATABLE.setdefault(self.solver, {})
        key = (instance_type.name, pool.name)
        found = cache.get(key)
        overhead = self.config.overhead
        if found is not None and found[0] is instance_type and found[1] is pool and found[2] is overhead:
            return found[3]
        computed = allocatable(instance_type, pool, overhead)
        cache[key] = (instance_type, pool, overhead, computed)
        return computed

    def _budget_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Each pool's nodes and those being disrupted, as Karpenter's `BuildDisruptionBudgetMapping` counts them:
        only initialized nodes (a replacement still booting would round a percentage up into more disruptions of
        the nodes that serve), and among them those NotReady as well as those draining or cordoned."""
        sizes: dict[str, int] = {}
        counted: dict[str, int] = {}
        for n in self.nodes:
            counts = self._counts(n)
            if counts is None:
                continue
            sizes[n.claim.pool] = sizes.get(n.claim.pool, 0) + 1
            if counts:
                counted[n.claim.pool] = counted.get(n.claim.pool, 0) + 1
        for claim in self.others:
            if claim.state is ClaimState.DRAINING:
                sizes[claim.pool] = sizes.get(claim.pool, 0) + 1
                counted[claim.pool] = counted.get(claim.pool, 0) + 1
        return sizes, counted

    def _counts(self, n: GroupNode) -> bool | None:
        """None: not one of its pool's nodes for the budgets (not ours, not initialized); else whether it uses up
        budget (being disrupted — a proposal's included —, cordoned or NotReady)."""
        claim, node = n.item.claim, n.item.node
        if claim is None or not was_initialized(node, claim, claim_requests(claim)):
            return None
        return disrupting(claim, self.now) or node.unschedulable or not node.ready

    # Budgets

    def allowance(self, pool: NodePool, reason: DisruptionReason) -> int | None:
        allowed = allowed_disruptions(pool.disruption.budgets, reason, self._pool_sizes.get(pool.name, 0),
                                      self._disrupting.get(pool.name, 0), self.now)
        self.budget_start.setdefault(pool.name, {}).setdefault(reason, allowed)
        if allowed is None:
            return None
        return max(0, allowed - self.taken.get(pool.name, 0))

    def skip(self, n: GroupNode, why: str) -> None:
        """Record why a node is left alone; the first reason found is the one reported."""
        self.skipped.setdefault(n.name, why)

    # Eligibility

    def why_not(self, n: GroupNode, *, validating: bool = False, reason: DisruptionReason | None = None,
                ) -> str | None:
        """Why this node may not be disrupted voluntarily at all, or None (`validating`: its own proposal aside).

        `reason` Drifted, in a pool with a `terminationGracePeriod`: pods that block eviction (do-not-disrupt,
        PodDisruptionBudgets) do not count — Karpenter's Eventual disruption class (`NewCandidate` ignores
        pod-blocking errors when the NodeClaim has a TerminationGracePeriod: "drifted nodes will begin draining
        even if there are pods blocking eviction"); the drain holds them until the period has run."""
        item = n.item
        if item.claim is None:
            return "not ours: no NodeClaim launched it"
        claim = item.claim
        if claim.state is not ClaimState.REGISTERED:
            return f"state: claim is {claim.state.value}"
        if disrupting(claim, self.now) and not validating:
            return "disrupting: a consolidation drain is under way"
        why = _node_why_not(item)
        if why is not None:
            return why
        eventual = reason == "Drifted" and n.pool is not None and n.pool.termination_grace_period is not None
        if not eventual:  # drift with a grace period goes past the pods that would hold it (Karpenter's Eventual)
            protected = next((e.pod.key for e in item.pods if e.protected), None) or next(
                iter(item.protected_daemons), None)
            if protected is not None:
                return f"do-not-disrupt: pod {protected}"
        if n.pool is not None:  # a pool gone from the configuration: its holds and its minimum age went with it
            if warm_held(claim, self.now):
                return f"warm: held by {claim.warm}"
            if self.now - _born(n) < n.pool.disruption.min_node_age:
                return f"too young: under the pool's minNodeAge {n.pool.disruption.min_node_age}"
        blocked = None if eventual else next((e.pod for e in item.pods if not e.evictable), None)
        if blocked is not None:
            return f"pdb: a PodDisruptionBudget forbids evicting {blocked.key} now"
        if item.incoming:
            return f"incoming: {item.incoming} pods are on their way to it"
        replaced = [cid for cid in claim.attributes.get(REPLACES_ATTRIBUTE, "").split(",") if cid in self.live_ids]
        if replaced:
            return f"incoming: it replaces {', '.join(replaced)}, whose pods are still to come"
        nominee = self._nominee(n)
        if nominee is not None:
            return f"nominated: pending pod {nominee.key} would be scheduled on it"
        return None

    def _nominee(self, n: GroupNode) -> ClusterPod | None:
        """A pending pod kube-scheduler would bind to this node were our disrupted taint off it: it tolerates the
        node's other taints, matches its labels and fits in its free room. Only a node carrying that taint (a
        proposal's) is asked about: a pod still pending beside an untainted node it seems to fit is held back by
        what is not looked at here (anti-affinity, topology spread, volumes), and must not keep the node forever."""
        node = n.item.node
        ours = (DRAIN_TAINT.key, DRAIN_TAINT.effect)
        if not self.pending or n.capacity is None or not any((t.key, t.effect) == ours for t in node.taints):
            return None
        taints = [t for t in node.taints if (t.key, t.effect) != ours]
        labels = node.labels
        free = n.free
        for pod in self.pending:
            if (fits(pod.requests + {PODS: 1}, free) and tolerates_all(pod.tolerations, taints)
                    and all(labels.get(k) == v for k, v in pod.node_selector.items())
                    and terms_match(pod.required_node_affinity, labels, node.name)):
                return pod
        return None

    def _usable(self, n: GroupNode) -> bool:
        if n.item.claim is None or n.pool is None:
            return False
        claim = n.claim
        node = n.item.node
        return (claim.state is ClaimState.REGISTERED and node.ready and not node.unschedulable
                and n.capacity is not None and bool(claim.zone or claim.zones) and not disrupting(claim, self.now))

    def apply(self, decision: Decision, *, proposal: bool = True) -> None:
        """Take the decision into the pass's picture; a new proposal also uses up its pool's budget (a validated
        one was counted among the disrupting nodes already)."""
        if proposal:
            self.decisions.append(decision)
            self.taken[decision.pool] = self.taken.get(decision.pool, 0) + len(decision.nodes)
        self.free_rooms = None
        self.floors = {}
        for name in decision.nodes:
            node = next(n for n in self.nodes if n.name == name)
            node.removed = True
            self.skipped.pop(name, None)
        moved = {entry.pod.uid: entry for n in self.nodes if n.name in decision.nodes for entry in n.item.pods}
        for name, uids in decision.destinations.items():
            target = next(n for n in self.nodes if n.name == name)
            for uid in uids:
                target.take(pod_requests(moved[uid].pod))
                target.arrived.append(moved[uid])
            target.locked = True

    # Phases

    def run(self) -> ConsolidationResult:
        validated, invalidated = self._validate()
        eligible: list[GroupNode] = []
        drift_eligible: list[GroupNode] = []
        held: dict[str, str] = {}
        for n in self.nodes:
            why = self.why_not(n)
            if why is None:
                eligible.append(n)
                drift_eligible.append(n)
            elif n.item.claim is not None and n.claim.state is ClaimState.REGISTERED:
                if n.pool is not None and n.pool.termination_grace_period is not None \
                        and self.why_not(n, reason="Drifted") is None:
                    drift_eligible.append(n)  # held back by its pods, which a grace period bounds for drift
                    held[n.name] = why
                else:
                    self.skip(n, why)
        self._drift(drift_eligible)
        for n in drift_eligible:
            if n.name in held and not n.removed:
                self.skip(n, held[n.name])
        eligible = [n for n in eligible if n.pool is not None]  # a gone pool's nodes are drift's alone
        self._empty(eligible)
        underused = [n for n in eligible if not n.removed and n.item.pods and n.pool is not None
                     and n.pool.disruption.consolidation_policy == "WhenEmptyOrUnderutilized"]
        weighed: list[GroupNode] = []
        busy: list[GroupNode] = []
        cheapest = _cheapest_free_gpu(self.nodes)
        for n in underused:
            assert n.pool is not None
            if self.now - _last_pod_event(n) < n.pool.disruption.consolidate_after:
                self.skip(n, "too young: under the pool's consolidateAfter since its last pod event")
            elif (why := _busy(n, cheapest)) is not None:
                self.skip(n, why)
                if n.pool.disruption.into_sunk_room:
                    busy.append(n)
            else:
                weighed.append(n)
        underused = sorted(weighed, key=candidate_order)
        for pool in sorted({n.claim.pool for n in underused}):
            self._multi([n for n in underused if n.claim.pool == pool])
        self._single(underused)
        into_sunk_room(self, busy, [n for n in underused if not n.removed] + busy)
        return ConsolidationResult(tuple(self.decisions), tuple(validated), tuple(invalidated), dict(self.skipped),
                                   self.budget_start)

    def _validate(self) -> tuple[list[Decision], list[Rejection]]:
        """The proposals due for validation, looked at again on the current picture, before anything new."""
        due: dict[tuple[str, ...], Proposal] = {}
        for n in self.nodes:
            found = proposal(n.claim) if n.item.claim is not None else None
            if found is not None and found.validate_after <= self.now < found.until:
                due.setdefault(found.claims, found)
        validated: list[Decision] = []
        invalidated: list[Rejection] = []
        # Proposed nodes count as disrupted; at its validation a proposal is weighed as Karpenter weighs a command,
        # whose candidates are not marked yet: its own nodes and those of proposals not validated before it aside.
        self.awaiting = {}
        for claims in due:
            for n in (self.by_claim[c] for c in claims if c in self.by_claim):
                if self._counts(n):
                    self.awaiting[n.claim.pool] = self.awaiting.get(n.claim.pool, 0) + 1
        for claims, pending in sorted(due.items()):
            group = [self.by_claim[c] for c in claims if c in self.by_claim]
            outcome = self._recheck(group, pending) if len(group) == len(claims) else "a node of it is gone"
            if isinstance(outcome, Decision):
                self.apply(outcome, proposal=False)
                validated.append(outcome)
                for n in group:
                    if self._counts(n):
                        self.awaiting[n.claim.pool] -= 1
            else:
                invalidated.append(Rejection(tuple(n.name for n in group), claims, outcome))
        return validated, invalidated

    def _recheck(self, group: list[GroupNode], pending: Proposal) -> Decision | str:
        """The decision again, or why it no longer holds: every node still a candidate, and the pods still going
        where they went — no new node where none was planned, no more and no dearer replacements (Karpenter's
        `validateCommand`)."""
        reason: DisruptionReason = pending.reason  # type: ignore[assignment]
        for n in group:
            why = self.why_not(n, validating=True, reason=reason)
            if why is not None:
                return f"{n.name}: {why}"
        why = self._budget_recheck(group, reason)
        if why is not None:
            return why
        if reason == "Empty" and any(n.item.pods for n in group):
            return "no longer empty"
        if reason == "Drifted" and self._drift_reason(group[0].claim) is None:
            return "no longer drifted"
        found = self.evaluate(group, reason)
        if isinstance(found, str):
            return found
        if found.action != pending.action or len(found.replacements) > pending.replacements:
            return f"the pods now need {len(found.replacements)} new nodes, {pending.replacements} were planned"
        if reason != "Drifted" and found.price_after > pending.price_after + 1e-6:
            return f"the replacements now cost ${found.price_after:.4f}/h, ${pending.price_after:.4f}/h were planned"
        return found

    def _budget_recheck(self, group: list[GroupNode], reason: DisruptionReason) -> str | None:
        """Why the pools' budgets no longer allow the proposal's nodes, or None. Karpenter's validation builds the
        budgets again (`validateCandidates`, `BuildDisruptionBudgetMapping`) and drops the command when one of
        its candidates' pool has none left: a schedule that opened a `nodes: "0"` budget since, or nodes gone
        NotReady or disrupted meanwhile."""
        wanted: dict[str, int] = {}
        for n in group:
            wanted[n.claim.pool] = wanted.get(n.claim.pool, 0) + 1
        for name, count in sorted(wanted.items()):
            pool = self.pools.get(name)
            if pool is None:  # a pool gone from the configuration: its budgets went with it (`_drift`)
                continue
            others = self._disrupting.get(name, 0) - self.awaiting.get(name, 0)
            allowed = allowed_disruptions(pool.disruption.budgets, reason, self._pool_sizes.get(name, 0), others,
                                          self.now)
            if allowed is not None and allowed < count:
                return (f"budget: pool {name} now allows {allowed} more {reason} disruption(s), the decision takes "
                        f"{count}")
        return None

    def _drift(self, eligible: list[GroupNode]) -> None:
        """Drifted nodes replaced (or deleted, when nothing needs new room), within their pool's budget.

        A node whose pool is gone from the configuration has no budget to wait for: Karpenter's NodeClaims are
        owned by their NodePool (an ownerReference, `nodeclaimtemplate.go`), so deleting the pool deletes them all
        at once, each drained gracefully but none budgeted. Here they are all drifted in the pass too, and more
        gently than a cascade: the pods that need room get it first (the replacements are Ready before the
        drain), and the voluntary drain respects PodDisruptionBudgets and do-not-disrupt, which bound how many
        pods of a workload leave at once as they do in Karpenter's drain. A node whose pods fit nowhere is left
        alone, where a cascade would leave them pending."""
        for n in eligible:
            why = self._drift_reason(n.claim)
            if why is None or n.removed:
                continue
            if n.pool is not None and self.allowance(n.pool, "Drifted") == 0:
                self.skip(n, f"budget: pool {n.pool.name} allows no more Drifted disruption now ({why})")
                continue
            decision = self.evaluate([n], "Drifted")
            if isinstance(decision, str):
                self.skip(n, f"drifted: {why}, but {decision}")
                continue
            self.apply(replace(decision, detail=f"{why}; {decision.detail}"))

    def _drift_reason(self, claim: NodeClaim) -> str | None:
        """`drift_reason`, kept per claim object and configuration for as long as the solver (its catalog) lives:
        every pass asks it of every node, and a claim and a configuration never change."""
        cache = _DRIFT.setdefault(self.solver, {})
        found = cache.get(id(claim))
        if found is not None and found[0] is claim and found[1] is self.config:
            return found[2]
        why = drift_reason(self.config, self.catalog, claim)
        if len(cache) >= _PER_SOLVER_LIMIT:
            cache.clear()
        cache[id(claim)] = (claim, self.config, why)
        return why

    def _empty(self, eligible: list[GroupNode]) -> None:
        for n in eligible:
            if n.removed or n.locked or n.item.pods:
                continue
            assert n.pool is not None
            wait = empty_wait(n.pool)
            since = n.item.empty_since
            if since is None or self.now - since < wait:
                self.skip(n, f"empty: not yet for {wait} (the pool's consolidateAfter, emptyKeepLeadTimes)")
                continue
            if self.allowance(n.pool, "Empty") == 0:
                self.skip(n, f"budget: pool {n.pool.name} allows no more Empty disruption now")
                continue
            self.apply(Decision("Empty", "delete", n.pool.name, (n.name,), (n.claim.id,), n.price,
                                detail=f"empty since {since.isoformat()}"))

    def _multi(self, candidates: list[GroupNode]) -> None:
        pool = candidates[0].pool if candidates else None
        while pool is not None:
            open_ = [n for n in candidates if not n.removed and not n.locked][:MULTI_NODE_MAX_CANDIDATES]
            allowance = self.allowance(pool, "Underutilized")
            top = len(open_) if allowance is None else min(len(open_), allowance)
            if top < 2:
                return
            best: Decision | None = None
            lo, hi = 2, top
            while lo <= hi:
                mid = (lo + hi) // 2
                group = open_[:mid]
                if self.priced_out(group):
                    hi = mid - 1
                    continue
                found = self.evaluate(group, "Underutilized")
                if isinstance(found, Decision) and found.saving > EPS:
                    if best is None or found.saving > best.saving + EPS:
                        best = found
                    lo = mid + 1
                else:
                    hi = mid - 1
            if best is None:
                return
            self.apply(best)

    def _single(self, candidates: list[GroupNode]) -> None:
        """Each candidate on its own. The room elsewhere only shrinks during a pass (nodes go, destinations
        fill), so a node like one already found wanting — same offering, same pods — is not asked about again:
        replicas on identical nodes cost one solver call, not hundreds."""
        failed: dict[tuple[object, ...], str] = {}
        for n in candidates:
            if n.removed:
                continue
            if n.locked:
                self.skip(n, "destination: takes pods moved in this pass")
                continue
            assert n.pool is not None
            if self.allowance(n.pool, "Underutilized") == 0:
                self.skip(n, f"budget: pool {n.pool.name} allows no more Underutilized disruption now")
                continue
            shape = (node_shape(n), node_labels(n.item)) if self.repelling else node_shape(n)
            if shape in failed:
                self.skip(n, failed[shape])
                continue
            found = self.evaluate([n], "Underutilized")
            if isinstance(found, str) or found.saving <= EPS:
                why = found if isinstance(found, str) else "no saving: nothing cheaper holds its pods"
                failed[shape] = why
                self.skip(n, why)
            else:
                self.apply(found)


def consolidate(
    config: Config,
    solver: Solver,
    nodes: Sequence[ConsolidationNode],
    *,
    claims: Sequence[NodeClaim] = (),
    unavailable: Collection[OfferingKey] = (),
    quotas: Mapping[str, int] | None = None,
    outside: Mapping[str, int] | None = None,
    pending: Sequence[ClusterPod] = (),
    max_replacements: int | None = None,
) -> ConsolidationResult:
    """One consolidation pass at `solver.clock.now()`.

    `solver`: the packer's, over the current catalog (build it once; it caches per catalog); `nodes`: every
    Node of the cluster with its claim and pods; `claims`: the live claims (those without a node — in flight,
    or draining — count against limits, quotas and budgets); `unavailable`: offerings marked unavailable;
    `quotas`: vCPU quotas for this pass (default: the solver's); `outside`: the vCPUs per quota key the account's
    other instances use (`quotas.vcpus_outside`, from every live claim); `pending`: the cluster's pods waiting for a
    node (a node one of them would be scheduled on is not a candidate); `max_replacements`: the most new nodes
    one Empty/Underutilized decision may launch (None: no bound; 1 is Karpenter's rule — the simulator's
    karpenter-like policies set it; drift is never bounded).
    """
    return _Pass(config, solver, nodes, claims, unavailable, quotas, pending, max_replacements, outside).run()


def _why_not_on_node(item: ConsolidationNode) -> str | None:
    """What on the node itself keeps it from voluntary disruption: not Ready or cordoned, not initialized (as
    Karpenter's candidates must be), do-not-disrupt on the Node (Karpenter's `ValidateNodeDisruptable`, which no
    disruption class sets aside). Of the node and its claim alone: kept per node object (`_node_why_not`)."""
    node = item.node
    if not node.ready or node.unschedulable:
        return "not ready or cordoned"
    why = _initialization(item)
    if why is not None:
        return f"not initialized: {why}"
    if node.do_not_disrupt:
        return "do-not-disrupt: the node is annotated"
    return None


def _not_initialized(item: ConsolidationNode) -> str | None:
    assert item.claim is not None
    return not_initialized(item.node, claim_requests(item.claim))


_initialization: PerObject[ConsolidationNode, str | None] = PerObject(_not_initialized)
"""Why a node of ours is not initialized yet, or None: asked of a candidate (`_why_not_on_node`) and of a
destination (`_Pass._node`), once per node object."""
_node_why_not: PerObject[ConsolidationNode, str | None] = PerObject(_why_not_on_node)
"""`_why_not_on_node`, kept per node object: every pass asks it of every node, the same object until it changes."""


def _on_the_way(item: ConsolidationNode, claim: NodeClaim) -> Resources:
    """The room the pods on their way to a node will take: what its claim was made for (its recorded requests, the
    packer's or the replacement's plan) less the footprint of the claim's pods already on it. Karpenter schedules
    pending pods and those of deleting nodes in the same simulation as the moving pods, so they compete for that
    room; here only the count of the pods on their way is known, the claim's record says how much they take. A pod
    of the plan that will never come (deleted meanwhile) keeps its room until none is on its way: a destination
    missed, never one overfilled."""
    planned = claim_requests(claim)
    if not planned:
        return Resources()
    mine = set(claim.pods)
    left = planned - sum((e.pod.footprint for e in item.pods if e.pod.uid in mine), Resources())
    return Resources({k: v for k, v in left.items() if v > 0})


def _price(catalog: Catalog, claim: NodeClaim) -> float:
    """What the node costs now: its offering's current price, else what it was launched at."""
    zone = claim.zone or (claim.zones[0] if len(claim.zones) == 1 else None)
    if claim.instance_type and zone:
        price = catalog.price((claim.instance_type, zone, claim.capacity_type))
        if price is not None:
            return price
    return claim.launched_price_per_hour if claim.launched_price_per_hour is not None else claim.price_per_hour


DEAR_GPU_RATIO = 4.0
"""A busy node whose GPUs cost at least this many times the cheapest free GPU's in the cluster is weighed anyway
(`_busy`). The first value tried, not tuned: at 4 times, buying back at once the room its pods take (at the cheap
GPU's price) still leaves three quarters of the dear GPU's price saved."""


def _busy(n: GroupNode, cheapest: float | None) -> str | None:
    """Why a node with pods is not weighed by the underutilized search: its pods request at least the pool's
    `underutilizedBelow` share of it (Cluster Autoscaler's scale-down utilization thresholds). The threshold keeps
    the room a busy node holds for the next arrivals, where moving its pods would save its price only until they
    come. A node whose GPUs cost `DEAR_GPU_RATIO` times the cheapest free GPU (`cheapest`, per physical GPU) is
    weighed anyway: an On-Demand P instance beside Spot g6 room, in a pool weighted first. There its pods moved save
    more than buying that room again costs; the threshold alone kept them on it for as long as they ran (README, the
    simulator's sixteenth round: on the example `cdk.json`, 10.6 % dearer than karpenter-overlay before, 6.7 %
    cheaper after)."""
    below = n.pool.disruption.underutilized_below if n.pool is not None else None
    if below is None:
        return None
    share, what = n.requested_share
    if share < below:
        return None
    own = _gpu_price(n)
    if own is not None and cheapest is not None and own >= DEAR_GPU_RATIO * cheapest:
        return None
    return f"busy: its pods request {share:.0%} of its {what}, not under the pool's underutilizedBelow {below:.0%}"


def _gpu_price(n: GroupNode) -> float | None:
    """The node's price per physical GPU of its type: a time-sliced node advertises each GPU as `replicas` devices
    and a MIG node with the `single` strategy each slice as one, and neither is a cheaper GPU (counted as GPUs, every
    whole-GPU node beside such a pool would look dear); a GPU without MIG in a MIG pool still advertises itself
    whole. None for a node without `nvidia.com/gpu` devices."""
    if n.capacity is None or n.capacity.get(GPU, 0) <= 0 or n.gpus <= 0:
        return None
    return n.price / n.gpus


def _cheapest_free_gpu(nodes: Sequence[GroupNode]) -> float | None:
    """The lowest price per physical GPU among the nodes that may take pods and have a GPU (or slot) free. Read from
    the GPU counts alone: asked on every pass, building each node's whole free room for it cost 0.7 s of
    ours-no-prediction's replay."""
    prices = [price for n in nodes if n.usable and not n.removed and n.capacity is not None
              and n.capacity[GPU] - n.used[GPU] >= 1 and (price := _gpu_price(n)) is not None]
    return min(prices, default=None)


def _born(n: GroupNode) -> datetime:
    node = n.item.node
    return node.created_at if node.created_at is not None else n.claim.created_at


def _last_pod_event(n: GroupNode) -> datetime:
    """Whence `consolidateAfter` counts for a node with pods: its last pod event, else its creation — Karpenter's
    `IsUnderConsolidateAfter` (pkg/utils/disruption/disruption.go: `status.lastPodEventTime`, else the
    NodeClaim's initialization). Pods that just came or went may be followed by more: wait until it settles."""
    changed = n.item.pods_changed_at
    return changed if changed is not None else _born(n)

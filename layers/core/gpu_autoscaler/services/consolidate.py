"""The consolidate use case, every minute: reconcile, then give back what is not needed.

1. List the cluster once; reconcile (`services.reconcile`): registrations, registration timeouts, garbage
   collection of leaked instances and of claims whose instance is gone (`services.garbage_collection`), demand.
2. Build the picture the pure decision needs (`domain.consolidation`): every Node with its claim (by
   providerID), the pods that would move, which of them a PodDisruptionBudget blocks now, how long an empty
   node has been empty (the claim's `emptySince`, kept here), its last pod event (the claim's `podsChangedAt`,
   kept here against the `podSet` fingerprint of last tick), and the pods still on their way to it; the pods
   waiting for a node (a node one of them would be scheduled on stays).
3. Decide, with the packer's solver over the current catalog: the proposals of earlier ticks due for
   validation are looked at again first (`domain.disruption_marks`), then new ones are looked for.
4. Take the disrupted taint off nodes whose mark lapsed (a proposal no tick validated, a drain that gave up).
5. Reject each proposal that no longer holds: its marks off, its taints off.
6. Propose each new decision: mark the nodes' claims (a conditional write: a claim that moved on meanwhile
   drops the decision) and taint the nodes (`domain.drain.DRAIN_TAINT`, NoSchedule), so no new pod lands on
   them; nothing more until a later tick validates it.
7. Carry out each validated decision, in an order that is safe to stop anywhere:
   - mark the nodes' claims as being disrupted until the drain's deadline, with the replacements;
   - store the replacement claims and ask the fleet to launch them (or, where claims other planners stored
     meanwhile leave them no room within the pool's limits, end them and drop the decision: marks and taints off);
   - one voluntary `DrainRequest` per node, naming every replacement: the drain waits until they are all
     Registered and Ready (at most `timeouts.registrationTtl`) before it cordons and evicts, and ends by
     `timeouts.consolidationDrain`.
   A run that stops halfway leaves marks that expire at the deadline and replacement claims that are
   launched (an empty node, consolidated later) or, never launched, ended by the registration timeout.
8. Log each decision with the USD/h it saves; the handler counts them per reason.

From the same list of pods, each tick also counts the GPU pods the in-cluster agent must have reported by now
(`domain.agent_witness`): the stack's one witness of an agent gone silent, which otherwise looks like a quiet
cluster.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.agent_witness import awaiting_report
from gpu_autoscaler.domain.consolidation import (
    EMPTY_SINCE_ATTRIBUTE,
    POD_SET_ATTRIBUTE,
    PODS_CHANGED_AT_ATTRIBUTE,
    ConsolidationNode,
    ConsolidationResult,
    Decision,
    Rejection,
    consolidate,
    empty_since,
    node_pods,
    pod_set,
    pods_changed_at,
    protected_daemons,
)
from gpu_autoscaler.domain.disruption_marks import (
    DISRUPTION_ATTRIBUTE,
    acting,
    disruption_mark,
    disruption_until,
    drain_sent,
    proposal_mark,
    unmarked,
)
from gpu_autoscaler.domain.drain import DRAIN_TAINT, is_drained_by_us
from gpu_autoscaler.domain.packing.quotas import vcpu_budget
from gpu_autoscaler.errors import ClaimExists, KubernetesAccessRefused, KubernetesApiError, NodeNotFound, StaleClaim
from gpu_autoscaler.models.claims import CLAIMED_STATES, ClaimState, NodeClaim, instant_attribute
from gpu_autoscaler.models.messages import DrainRequest, LaunchRequest
from gpu_autoscaler.services.claim_writes import withdraw_beyond_limits
from gpu_autoscaler.services.reconcile import ReconcileOutcome, ReconcileService

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.consolidation import NodePod
    from gpu_autoscaler.domain.packing.solver import Solver
    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
    from gpu_autoscaler.models.messages import ScheduleTick
    from gpu_autoscaler.ports import ClusterAPI, DisruptionBudgets, DrainQueue, LaunchQueue, QuotaSource, StateStore
    from gpu_autoscaler.services.aws_environment import AwsEnvironment

__all__ = ["ConsolidateOutcome", "ConsolidateService", "aws_consolidate_service"]

logger = logging.getLogger(__name__)


@dataclass
class ConsolidateOutcome:
    """What one tick did: the handler's response, logs and metrics."""

    reconcile: ReconcileOutcome
    result: ConsolidationResult
    acted: list[Decision] = field(default_factory=list)
    """Decisions carried out once validated (a decision whose claims moved on meanwhile is dropped)."""
    proposed: list[Decision] = field(default_factory=list)
    """New decisions: nodes tainted and marked, to be validated by a later tick."""
    rejected: list[Rejection] = field(default_factory=list)
    untainted: list[str] = field(default_factory=list)
    """Nodes whose disrupted taint came off: their proposal was rejected or lapsed, or their drain gave up."""
    dropped: list[str] = field(default_factory=list)
    launch_requests: list[list[str]] = field(default_factory=list)
    drain_requests: list[DrainRequest] = field(default_factory=list)
    api_failure: str | None = None
    """The Kubernetes API failed, so the tick stopped there (what it did before stays: every step is
    re-checked by the next tick)."""
    gpu_pods_unschedulable: int = 0
    """GPU pods unschedulable long enough that the agent must have reported them (`domain.agent_witness`); 0 when
    the pods could not be listed."""

    @property
    def saving(self) -> float:
        return sum(d.saving for d in self.acted)

    def by_reason(self) -> dict[str, tuple[int, float]]:
        """Reason → (decisions, USD/h saved)."""
        counts = Counter(d.reason for d in self.acted)
        return {r: (n, sum(d.saving for d in self.acted if d.reason == r)) for r, n in sorted(counts.items())}

    def summary(self) -> dict[str, Any]:
        result = self.result.summary()
        return {
            "reconcile": self.reconcile.summary(),
            "decisions": [d.to_json() for d in self.acted],
            "proposed": [d.to_json() for d in self.proposed],
            "rejected": [{"nodes": list(r.nodes), "reason": r.reason} for r in self.rejected],
            "untainted": self.untainted,
            "dropped": self.dropped,
            "savingPerHour": round(self.saving, 6),
            "skipped": result["skipped"],
            "apiFailure": self.api_failure,
            "budgets": result["budgets"],
            "launchRequests": self.launch_requests,
            "drainRequests": [{"node": r.node_name, "claim": r.claim_id, "reason": r.reason,
                               "replacements": r.replacements, "deadline": r.deadline.isoformat()}
                              for r in self.drain_requests],
        }


class ConsolidateService:
    def __init__(
        self,
        config: Config,
        store: StateStore,
        cluster: ClusterAPI,
        launches: LaunchQueue,
        drains: DrainQueue,
        reconcile: ReconcileService,
        *,
        solver: Callable[[], Solver],
        clock: Clock,
        budgets: DisruptionBudgets | None = None,
        quotas: QuotaSource | None = None,
        max_replacements: int | None = None,
    ) -> None:
        """`solver`: the packer's, over the current catalog (`PackerService.solver`); `budgets`: the cluster's
        PodDisruptionBudgets (without them every pod counts as evictable, and the drain meets the 429s);
        `max_replacements`: `consolidate`'s bound on new nodes per decision (the simulator's karpenter-like
        policies set 1; the Lambdas leave it unbounded)."""
        self.config = config
        self.store = store
        self.cluster = cluster
        self.launches = launches
        self.drains = drains
        self.reconciler = reconcile
        self.solver = solver
        self.clock = clock
        self.budgets = budgets
        self.quotas = quotas
        self.max_replacements = max_replacements

    def run(self, tick: ScheduleTick | None = None) -> ConsolidateOutcome:
        """One tick. A Kubernetes API failure ends it normally, logged with its reason: the schedule's next tick
        is the retry (a failed tick would be retried twice, then dead-lettered, once a minute for as long as
        the API is down — scenario 7 of the chaos suite). Refused access (401, 403) is no outage: it fails the
        tick, saying what grants the access, so that the function's Errors alarm tells someone while nothing is
        reconciled, consolidated or collected."""
        try:
            return self._run(tick)
        except KubernetesApiError as error:
            if error.is_access_refused:
                refused = KubernetesAccessRefused(error)
                logger.error("consolidation tick failed: %s", refused)
                raise refused from error
            logger.warning("consolidation tick stopped: the Kubernetes API failed: %s", error)
            return ConsolidateOutcome(ReconcileOutcome(), ConsolidationResult(), api_failure=str(error))

    def _run(self, tick: ScheduleTick | None) -> ConsolidateOutcome:
        nodes = self.cluster.list_nodes()
        pods = self.cluster.list_pods()
        reconciled = self.reconciler.run(nodes, pods)
        now = self.clock.now()
        claims = self.store.list_claims(CLAIMED_STATES)
        items = self._picture(nodes, pods, claims, now)
        solver = self.solver()
        quotas, outside = vcpu_budget(self.quotas, claims, solver.index.catalog)
        result = consolidate(
            self.config, solver, items, claims=claims, unavailable=self.store.unavailable_offerings(),
            quotas=quotas, outside=outside,
            pending=[p for p in pods if p.node_name is None], max_replacements=self.max_replacements,
        )
        outcome = ConsolidateOutcome(reconciled, result, gpu_pods_unschedulable=len(awaiting_report(pods, now)))
        current = {i.claim.id: i.claim for i in items if i.claim is not None}
        self._untaint_lapsed(items, now, outcome)
        self._resend_unsent(items, now, outcome)
        for rejection in result.invalidated:
            self._reject(rejection, current, outcome)
        for decision in result.decisions:
            self._propose(decision, current, now, outcome)
        for decision in result.validated:
            self._act(decision, current, now, outcome)
        if logger.isEnabledFor(logging.INFO):  # the summary is built for the log alone
            logger.info("consolidation tick", extra={"consolidation": outcome.summary(),
                                                     "scheduledTime": tick.scheduled_time.isoformat()
                                                     if tick is not None and tick.scheduled_time else None})
        return outcome

    # The picture

    def _picture(self, nodes: Sequence[ClusterNode], pods: Sequence[ClusterPod], claims: Sequence[NodeClaim],
                 now: datetime) -> list[ConsolidationNode]:
        by_instance = {c.instance_id: c for c in claims if c.instance_id}
        on_node: dict[str, list[ClusterPod]] = {}
        for pod in pods:
            if pod.node_name is not None:
                on_node.setdefault(pod.node_name, []).append(pod)
        ours = [p for n in nodes if n.instance_id in by_instance for p in on_node.get(n.name, ())]
        blocked = self.budgets.blocked(ours) if self.budgets is not None and ours else set()
        # On their way to a claim: pending pods assigned to it, and the pods still on a draining node that its
        # replacement was planned for (Karpenter's disruption simulation counts deleting nodes' pods, so a node
        # they need is not removed: `SimulateScheduling`, pkg/controllers/disruption/helpers.go).
        draining = {n.name for n in nodes if n.instance_id in by_instance
                    and by_instance[n.instance_id].state is ClaimState.DRAINING}
        waiting = [p.uid for p in pods if (p.node_name is None and p.phase == "Pending") or p.node_name in draining]
        incoming = Counter(self.store.assignments(waiting).values()) if waiting else Counter()
        items = []
        for node in nodes:
            claim = by_instance.get(node.instance_id) if node.instance_id else None
            here = on_node.get(node.name, ())
            members = node_pods(node, here, blocked, now)
            since = changed = None
            if claim is not None and claim.state is ClaimState.REGISTERED:
                claim, since, changed = self._track_pods(claim, members, here, now)
            items.append(ConsolidationNode(node, claim, members, since, incoming[claim.id] if claim else 0,
                                           pods_changed_at=changed,
                                           protected_daemons=protected_daemons(node, here, now)))
        return items

    def _track_pods(self, claim: NodeClaim, members: Sequence[NodePod], here: Sequence[ClusterPod], now: datetime,
                    ) -> tuple[NodeClaim, datetime | None, datetime | None]:
        """Keep the claim's `emptySince` and its last pod event (`podsChangedAt`, with the `podSet` it was
        checked against) current, in one write when either changes; the instants they hold (None: empty since
        never, no pod event known)."""
        previous = instant_attribute(claim, EMPTY_SINCE_ATTRIBUTE)
        since = empty_since(previous, members, now)
        previous_changed = instant_attribute(claim, PODS_CHANGED_AT_ATTRIBUTE)
        current_set = pod_set(here)
        changed = pods_changed_at(previous_changed, claim.attributes.get(POD_SET_ATTRIBUTE), current_set, here, now)
        wanted = {EMPTY_SINCE_ATTRIBUTE: since.isoformat() if since is not None else None,
                  PODS_CHANGED_AT_ATTRIBUTE: changed.isoformat() if changed is not None else None,
                  POD_SET_ATTRIBUTE: current_set}
        if all(claim.attributes.get(k) == v for k, v in wanted.items()):
            return claim, since, changed
        attributes = {k: v for k, v in claim.attributes.items() if k not in wanted}
        attributes.update({k: v for k, v in wanted.items() if v is not None})
        try:
            return self.store.update_claim(claim, attributes=attributes), since, changed
        except StaleClaim:
            return claim, None, now  # it moved on: not a candidate this tick anyway

    # Acting

    def _untaint_lapsed(self, items: Sequence[ConsolidationNode], now: datetime, outcome: ConsolidateOutcome) -> None:
        """Our taint off nodes of ours that are not being drained and whose mark has lapsed (or is gone)."""
        for item in items:
            node, claim = item.node, item.claim
            if claim is None or claim.state is not ClaimState.REGISTERED or is_drained_by_us(node):
                continue
            if not any(t.key == DRAIN_TAINT.key and t.effect == DRAIN_TAINT.effect for t in node.taints):
                continue
            until = disruption_until(claim)
            if (until is None or now >= until) and self.cluster.untaint(node.name, DRAIN_TAINT, unless_cordoned=True):
                outcome.untainted.append(node.name)

    def _untaint_registered(self, nodes: Sequence[str], claim_ids: Sequence[str], outcome: ConsolidateOutcome,
                            ) -> None:
        """Our taint off those of `nodes` whose claim, read again now, is still Registered, the rule
        `_untaint_lapsed` keeps: a claim gone Draining meanwhile (a Spot warning or another notice, which is why
        a proposal is rejected or its mark refused) has a drain that cordoned its node with the same taint, and
        the taint is that drain's now (`is_drained_by_us`)."""
        fresh = self.store.get_claims(claim_ids)
        registered = {c.node_name for c in fresh.values() if c.state is ClaimState.REGISTERED}
        for name in nodes:
            if name in registered and self.cluster.untaint(name, DRAIN_TAINT, unless_cordoned=True):
                outcome.untainted.append(name)

    def _reject(self, rejection: Rejection, current: dict[str, NodeClaim], outcome: ConsolidateOutcome) -> None:
        self._unmark([current[c] for c in rejection.claims if c in current])
        self._untaint_registered(rejection.nodes, rejection.claims, outcome)
        outcome.rejected.append(rejection)
        logger.info("consolidation of %s rejected on validation: %s", ", ".join(rejection.nodes), rejection.reason)

    def _propose(self, decision: Decision, current: dict[str, NodeClaim], now: datetime,
                 outcome: ConsolidateOutcome) -> None:
        """Mark and taint; a later tick validates. The marks come first: a taint without a live mark is taken
        off by the next tick, a mark without a taint only keeps other decisions away until it lapses. A node gone
        since the tick listed it (a Spot reclaim, its Node deleted) drops the decision as a claim that moved on
        does, marks undone (a taint already put on another of its nodes is then one without a live mark): Karpenter
        ignores a NotFound candidate (`RequireNoScheduleTaint`)."""
        mark = proposal_mark(decision.reason, decision.action, decision.claims, now, len(decision.replacements),
                             decision.price_after, self.config.timeouts.consolidation_validation)
        marked = self._mark(decision, current, mark, outcome)
        if marked is None:
            return
        for name in decision.nodes:
            try:
                self.cluster.taint(name, DRAIN_TAINT)
            except NodeNotFound:
                self._unmark(marked)
                outcome.dropped.append(f"{', '.join(decision.nodes)}: node {name} is gone")
                logger.info("consolidation of %s dropped: node %s is gone", ", ".join(decision.nodes), name)
                return
        outcome.proposed.append(decision)

    def _mark(self, decision: Decision, current: dict[str, NodeClaim], mark: str,
              outcome: ConsolidateOutcome) -> list[NodeClaim] | None:
        """Write `mark` on every claim of the decision (conditional writes); None, marks undone, if one moved on."""
        marked: list[NodeClaim] = []
        for claim_id in decision.claims:
            claim = current[claim_id]
            try:
                marked.append(self.store.update_claim(claim, attributes={**claim.attributes,
                                                                         DISRUPTION_ATTRIBUTE: mark}))
            except StaleClaim:
                self._unmark(marked)
                outcome.dropped.append(f"{', '.join(decision.nodes)}: claim {claim_id} moved on")
                logger.info("consolidation of %s dropped: claim %s moved on", ", ".join(decision.nodes), claim_id)
                return None
        current.update({c.id: c for c in marked})
        return marked

    def _act(self, decision: Decision, current: dict[str, NodeClaim], now: datetime,
             outcome: ConsolidateOutcome) -> None:
        deadline = now + self.config.timeouts.consolidation_drain
        # A replacement not Registered and Ready within the registration TTL never will be (reconcile ends it):
        # the drain stops waiting then, and its pods go back to the packer.
        wait_until = min(now + self.config.timeouts.registration_ttl, deadline)
        replacement_ids = [c.id for c in decision.replacements]
        marked = self._mark(decision, current, disruption_mark(decision.reason, deadline, replacement_ids), outcome)
        if marked is None:
            self._untaint_registered(decision.nodes, decision.claims, outcome)
            return
        stored = [c for c in decision.replacements if self._store_replacement(c)]
        kept = withdraw_beyond_limits(self.store, self.solver(), stored, together=True)
        if len(kept) < len(stored):
            self._unmark(marked)
            self._untaint_registered(decision.nodes, decision.claims, outcome)
            why = "claims another planner stored meanwhile leave its replacements no room within the pool's limits"
            outcome.dropped.append(f"{', '.join(decision.nodes)}: {why}")
            logger.info("consolidation of %s dropped: %s", ", ".join(decision.nodes), why)
            return
        launch = [c.id for c in kept]
        if launch:
            self.launches.send(LaunchRequest(cluster=self.config.cluster_name, claim_ids=launch))
            outcome.launch_requests.append(launch)
        for name, claim in zip(decision.nodes, marked, strict=True):
            request = self._drain_request(name, claim, f"consolidation ({decision.reason}): {decision.detail}",
                                          deadline, replacement_ids, wait_until, eventual=decision.reason == "Drifted")
            self.drains.send(request)
            self._record_sent(claim)
            outcome.drain_requests.append(request)
        outcome.acted.append(decision)
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "consolidation %s %s of %s saves %.4f USD/h: %s", decision.reason, decision.action,
                ", ".join(decision.nodes), decision.saving, decision.detail,
                extra={"decision": decision.to_json(), "savingPerHour": round(decision.saving, 6)},
            )

    def _drain_request(self, node: str, claim: NodeClaim, reason: str, deadline: datetime,
                       replacement_ids: Sequence[str], wait_until: datetime, *, eventual: bool) -> DrainRequest:
        """A voluntary drain of one node of a decision: its pool's `terminationGracePeriod` alone may end it early.
        `eventual`: a drift's (Karpenter's Eventual class), which pods that block eviction do not refuse when the
        pool has that period (`DrainRequest.eventual`)."""
        pool = next((p for p in self.config.node_pools if p.name == claim.pool), None)
        return DrainRequest(
            cluster=self.config.cluster_name, node_name=node, instance_id=claim.instance_id, claim_id=claim.id,
            reason=reason, involuntary=False, deadline=deadline,
            replacement_claim_id=replacement_ids[0] if replacement_ids else None,
            replacement_claim_ids=list(replacement_ids[1:]), wait_until=wait_until,
            termination_grace_period=pool.termination_grace_period if pool is not None else None, eventual=eventual,
        )

    def _record_sent(self, claim: NodeClaim) -> None:
        """Note on the mark that its drain is queued. A conflict (the drain, or another writer, moved the claim
        on first) leaves it unnoted: a later tick sends the drain again if the claim is still only marked."""
        raw = claim.attributes.get(DISRUPTION_ATTRIBUTE)
        if not raw:
            return
        try:
            self.store.update_claim(claim, attributes={**claim.attributes, DISRUPTION_ATTRIBUTE: drain_sent(raw)})
        except StaleClaim:
            logger.info("claim %s moved on before its drain was noted as sent", claim.id)

    def _resend_unsent(self, items: Sequence[ConsolidationNode], now: datetime, outcome: ConsolidateOutcome
                       ) -> None:
        """A tick that died between marking a validated decision and queueing its drain left the node marked as
        being disrupted and no drain working on it, until the mark lapsed (`timeouts.consolidationDrain`): send
        that drain now. Only a Registered claim can be in that state (a drain that started made it Draining)."""
        for item in items:
            claim = item.claim
            mark = acting(claim) if claim is not None else None
            if claim is None or mark is None or mark.drain_sent or claim.state is not ClaimState.REGISTERED \
                    or now >= mark.until:
                continue
            request = self._drain_request(
                item.node.name, claim, f"consolidation ({mark.reason}), sent again: the tick that decided it "
                "stopped before sending its drain", mark.until, list(mark.replacements),
                min(now + self.config.timeouts.registration_ttl, mark.until), eventual=mark.reason == "Drifted")
            logger.warning("node %s was marked for consolidation but its drain was never sent: sending it",
                           item.node.name)
            self.drains.send(request)
            self._record_sent(claim)
            outcome.drain_requests.append(request)

    def _store_replacement(self, claim: NodeClaim) -> bool:
        """Store a replacement claim; True if it should be (re)sent for launch (new, or still Pending)."""
        try:
            self.store.create_claim(claim)
            return True
        except ClaimExists:
            found = self.store.get_claim(claim.id)
            return found is not None and found.state is ClaimState.PENDING

    def _unmark(self, claims: Sequence[NodeClaim]) -> None:
        for claim in claims:
            try:
                self.store.update_claim(claim, attributes=unmarked(claim.attributes))
            except StaleClaim:
                logger.info("claim %s moved on; its disruption mark expires by itself", claim.id)


def aws_consolidate_service(env: AwsEnvironment, *, cluster: ClusterAPI | None = None,
                            budgets: DisruptionBudgets | None = None) -> ConsolidateService:
    """The service as the Lambda runs it: configuration from SSM, catalog from EC2, state in DynamoDB, the
    cluster through the Kubernetes API with an EKS token, launches and drains on their queues (the handler takes
    the tick's lease from the same environment: `AwsEnvironment.tick_lease`). `cluster` and `budgets` stand in
    for the Kubernetes API where there is none (tests, the simulator)."""
    config, store = env.config, env.store
    launches, drains = env.launch_queue, env.drain_queue
    if cluster is None:
        from gpu_autoscaler.adapters.aws.eks_token import eks_api_client
        from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
        from gpu_autoscaler.adapters.kubernetes.disruption_budgets import KubernetesDisruptionBudgets

        api = eks_api_client(config, env.clients, env.clock)
        cluster = KubernetesCluster(api)
        budgets = budgets or KubernetesDisruptionBudgets(api)
    from gpu_autoscaler.adapters.aws.fleet import Ec2Compute
    from gpu_autoscaler.services.garbage_collection import GarbageCollector

    ec2 = Ec2Compute(env.clients.client("ec2"), config.cluster_name)
    collector = GarbageCollector(config, store, ec2, ec2, env.terminations, cluster, clock=env.clock)
    reconcile = ReconcileService(config, store, cluster, env.terminations, clock=env.clock, collector=collector,
                                 drains=drains)
    return ConsolidateService(
        config, store, cluster, launches, drains, reconcile,
        solver=env.packer.solver, clock=env.clock, budgets=budgets, quotas=env.quotas,
    )

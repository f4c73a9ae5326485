"""The consolidate use case, every minute: reconcile, then give back what is not needed.

1. List the cluster once; reconcile (`services.reconcile`): registrations, registration timeouts, garbage
   collection of leaked instances and of claims whose instance is gone (`services.garbage_collection`), demand.
2. Build the picture the pure decision needs (`domain.consolidation`): every Node with its claim (by
   providerID), the pods that would move, which of them a PodDisruptionBudget blocks now, how long an empty
   node has been empty (the claim's `emptySince`, kept here), and the pods still on their way to it.
3. Decide, with the packer's solver over the current catalog.
4. Act on each decision, in an order that is safe to stop anywhere:
   - mark the nodes' claims as being disrupted (a conditional write: a claim that moved on meanwhile drops
     the decision), so the next tick neither decides again nor plans pods onto them;
   - store the replacement claims and ask the fleet to launch them;
   - one voluntary `DrainRequest` per node, naming every replacement: the drain waits until they are all
     Registered and Ready (at most `timeouts.registrationTtl`) before it cordons and evicts, and ends by
     `timeouts.consolidationDrain`.
   A run that stops halfway leaves marks that expire at the deadline and replacement claims that are
   launched (an empty node, consolidated later) or, never launched, ended by the registration timeout.
5. Log each decision with the USD/h it saves; the handler counts them per reason.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.consolidation import (
    DISRUPTION_ATTRIBUTE,
    EMPTY_SINCE_ATTRIBUTE,
    ConsolidationNode,
    ConsolidationResult,
    Decision,
    consolidate,
    disruption_mark,
    empty_since,
    node_pods,
)
from gpu_autoscaler.errors import ClaimExists, StaleClaim
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.messages import DrainRequest, LaunchRequest
from gpu_autoscaler.services.reconcile import CLAIMED_STATES, ReconcileOutcome, ReconcileService

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.consolidation import NodePod
    from gpu_autoscaler.domain.packing.solver import Solver
    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
    from gpu_autoscaler.models.messages import ScheduleTick
    from gpu_autoscaler.ports import ClusterAPI, DisruptionBudgets, DrainQueue, LaunchQueue, QuotaSource, StateStore
    from gpu_autoscaler.settings import FunctionSettings

__all__ = ["ConsolidateOutcome", "ConsolidateService", "aws_consolidate_service"]

logger = logging.getLogger(__name__)


@dataclass
class ConsolidateOutcome:
    """What one tick did: the handler's response, logs and metrics."""

    reconcile: ReconcileOutcome
    result: ConsolidationResult
    acted: list[Decision] = field(default_factory=list)
    """Decisions carried out (a decision whose claims moved on meanwhile is dropped)."""
    dropped: list[str] = field(default_factory=list)
    launch_requests: list[list[str]] = field(default_factory=list)
    drain_requests: list[DrainRequest] = field(default_factory=list)

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
            "dropped": self.dropped,
            "savingPerHour": round(self.saving, 6),
            "skipped": result["skipped"],
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
    ) -> None:
        """`solver`: the packer's, over the current catalog (`PackerService.solver`); `budgets`: the cluster's
        PodDisruptionBudgets (without them every pod counts as evictable, and the drain meets the 429s)."""
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

    def run(self, tick: ScheduleTick | None = None) -> ConsolidateOutcome:
        nodes = self.cluster.list_nodes()
        pods = self.cluster.list_pods()
        reconciled = self.reconciler.run(nodes, pods)
        now = self.clock.now()
        claims = self.store.list_claims(CLAIMED_STATES)
        items = self._picture(nodes, pods, claims, now)
        result = consolidate(
            self.config, self.solver(), items, claims=claims, unavailable=self.store.unavailable_offerings(),
            quotas=self.quotas.vcpu_quotas() if self.quotas is not None else None,
        )
        outcome = ConsolidateOutcome(reconciled, result)
        current = {i.claim.id: i.claim for i in items if i.claim is not None}
        for decision in result.decisions:
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
        waiting = [p.uid for p in pods if p.node_name is None and p.phase == "Pending"]
        incoming = Counter(self.store.assignments(waiting).values()) if waiting else Counter()
        items = []
        for node in nodes:
            claim = by_instance.get(node.instance_id) if node.instance_id else None
            members = node_pods(node, on_node.get(node.name, ()), blocked)
            since = None
            if claim is not None and claim.state is ClaimState.REGISTERED:
                claim, since = self._track_empty(claim, members, now)
            items.append(ConsolidationNode(node, claim, members, since, incoming[claim.id] if claim else 0))
        return items

    def _track_empty(self, claim: NodeClaim, members: Sequence[NodePod], now: datetime,
                     ) -> tuple[NodeClaim, datetime | None]:
        """Keep the claim's `emptySince` current; the instant it holds (None while the node has pods)."""
        raw = claim.attributes.get(EMPTY_SINCE_ATTRIBUTE)
        previous = _instant(raw)
        since = empty_since(previous, members, now)
        if since == previous and (raw is None) == (since is None):
            return claim, since
        attributes = {k: v for k, v in claim.attributes.items() if k != EMPTY_SINCE_ATTRIBUTE}
        if since is not None:
            attributes[EMPTY_SINCE_ATTRIBUTE] = since.isoformat()
        try:
            return self.store.update_claim(claim, attributes=attributes), since
        except StaleClaim:
            return claim, None  # it moved on: not a candidate this tick anyway

    # Acting

    def _act(self, decision: Decision, current: dict[str, NodeClaim], now: datetime,
             outcome: ConsolidateOutcome) -> None:
        deadline = now + self.config.timeouts.consolidation_drain
        # A replacement not Registered and Ready within the registration TTL never will be (reconcile ends it):
        # the drain stops waiting then, and its pods go back to the packer.
        wait_until = min(now + self.config.timeouts.registration_ttl, deadline)
        replacement_ids = [c.id for c in decision.replacements]
        mark = disruption_mark(decision.reason, deadline, replacement_ids)
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
                return
        current.update({c.id: c for c in marked})
        launch = [c.id for c in decision.replacements if self._store_replacement(c)]
        if launch:
            self.launches.send(LaunchRequest(cluster=self.config.cluster_name, claim_ids=launch))
            outcome.launch_requests.append(launch)
        for name, claim in zip(decision.nodes, marked, strict=True):
            request = DrainRequest(
                cluster=self.config.cluster_name, node_name=name, instance_id=claim.instance_id, claim_id=claim.id,
                reason=f"consolidation ({decision.reason}): {decision.detail}", involuntary=False,
                deadline=deadline, replacement_claim_id=replacement_ids[0] if replacement_ids else None,
                replacement_claim_ids=replacement_ids[1:], wait_until=wait_until,
            )
            self.drains.send(request)
            outcome.drain_requests.append(request)
        outcome.acted.append(decision)
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "consolidation %s %s of %s saves %.4f USD/h: %s", decision.reason, decision.action,
                ", ".join(decision.nodes), decision.saving, decision.detail,
                extra={"decision": decision.to_json(), "savingPerHour": round(decision.saving, 6)},
            )

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
                self.store.update_claim(claim, attributes={k: v for k, v in claim.attributes.items()
                                                           if k != DISRUPTION_ATTRIBUTE})
            except StaleClaim:
                logger.info("claim %s moved on; its disruption mark expires by itself", claim.id)


def _instant(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw)
    except ValueError:
        return None


def aws_consolidate_service(settings: FunctionSettings, clock: Clock | None = None, *,
                            cluster: ClusterAPI | None = None, budgets: DisruptionBudgets | None = None,
                            ) -> ConsolidateService:
    """The service as the Lambda runs it: configuration from SSM, catalog from EC2, state in DynamoDB, the
    cluster through the Kubernetes API with an EKS token, launches and drains on their queues. `cluster` and
    `budgets` stand in for the Kubernetes API where there is none (tests, the simulator)."""
    from gpu_autoscaler.services.aws_environment import AwsEnvironment

    env = AwsEnvironment(settings, clock)
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
    reconcile = ReconcileService(config, store, cluster, env.terminations, clock=env.clock, collector=collector)
    return ConsolidateService(
        config, store, cluster, launches, drains, reconcile,
        solver=env.packer.solver, clock=env.clock, budgets=budgets, quotas=env.quotas,
    )

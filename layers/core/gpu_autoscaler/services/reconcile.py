"""Reconcile, on the consolidation schedule: claims against the Nodes that joined, and the demand history.

1. Registration: a Launched claim whose instance has a Node (providerID `aws:///<zone>/<instance-id>`)
   becomes Registered with the Node's name. The pool's settings digest (and its version) is stamped on it then,
   and the pool's image for a claim whose launch did not record the one it named (`drift`), so a later change
   of either shows as drift.
2. Registration timeout: a claim whose Node has not joined within `timeouts.registrationTtl` of its launch
   (or, never launched, of its creation) is ended through the fleet — its instance terminated if there is
   one, the claim Terminated, its pods released so the packer plans them again.
3. Initialization and boot times: the first tick that sees a claim's Node initialized (Ready, no ephemeral
   taint — the cloud controller manager's `uninitialized` among them —, every resource it was made for
   allocatable: `domain.initialization`) records when (`initializedAt`): the node takes pods from then, and the
   packer's `schedulingGrace` counts from it. The first tick that sees it Ready with GPUs allocatable records its
   boot (launch → Node Ready → GPUs allocatable, `domain.boot_times.observe_boot`) in the store for
   `measuredLeadTime.history`, and marks the claim (`bootSeconds`) so it is recorded once. Pre-warm turns a
   pool's samples into its lead time. A Registered claim whose node is still not initialized `registrationTtl`
   after its registration is ended as one whose node never joined (its GPUs never came: a broken driver or device
   plugin, a node that never turns Ready): the same allowance again, from the Node to a node that can take pods.
   One whose node runs pods (other than DaemonSets'), or may have been initialized before the time was
   recorded (`was_initialized`), is left alone.
4. Room given back (`domain.orphaned_claims`): a claim in flight none of whose pods waits for it any more (each
   started on another node since, or was deleted) is left with no pods and no recorded requests, its pods'
   assignments released, so the packer places the next pending pods in its room instead of buying another
   node; it boots as free room, and consolidation removes it empty if no pod comes.
5. Garbage collection (`services.garbage_collection`, where the service is given a collector): owned instances
   no live claim accounts for are terminated, claims whose instance is gone are closed.
6. Stalled drains (`domain.drain_progress`, where the service is given the drain queue): a Draining claim no drain
   has worked on for `DRAIN_STALLED_AFTER` is sent its drain again, or, past its node's termination time, ended.
7. Nodes deleted through the API (`kubectl delete node`): no finalizer of ours holds a Node, so it goes at once
   (PodGC deletes its pods) and its kubelet does not register it again, while the instance runs and is paid for.
   A Registered or Draining claim that had a Node, whose Node has been missing from the list for
   `NODE_MISSING_GRACE` (first seen missing: `NODE_MISSING_ATTRIBUTE`), is ended through the fleet unless EC2
   shows its instance gone already (garbage collection closes those). A list of no Node at all is not believed.
8. Demand: per pool, the GPUs of the pods running on its nodes plus the pending pods assigned to its claims,
   in the current 5-minute bucket (`services.demand`, shared with the packer).

Every step is safe to repeat: the lifecycle writes are conditional and the fleet's termination idempotent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.boot_times import BOOT_ATTRIBUTE, observe_boot
from gpu_autoscaler.domain.drain import movable, termination_time
from gpu_autoscaler.domain.drain_progress import drain_progress, progress_attributes, stalled_after
from gpu_autoscaler.domain.drift import (
    IMAGE_ATTRIBUTE,
    POOL_HASH_ATTRIBUTE,
    POOL_HASH_VERSION,
    POOL_HASH_VERSION_ATTRIBUTE,
    expected_image,
    pool_hash,
    restamp,
)
from gpu_autoscaler.domain.initialization import (
    INITIALIZED_ATTRIBUTE,
    initialization_overdue,
    initialized_at,
    not_initialized,
    was_initialized,
)
from gpu_autoscaler.domain.orphaned_claims import orphaned_claims
from gpu_autoscaler.domain.packing.results import REQUESTS_ATTRIBUTE, claim_requests, requests_attribute
from gpu_autoscaler.errors import StaleClaim
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.claims import (
    CLAIMED_STATES,
    IN_FLIGHT_STATES,
    ClaimState,
    instant_attribute,
    launched_at,
)
from gpu_autoscaler.services.demand import pool_gpus, record_demand
from gpu_autoscaler.wiring import visibility_timeout

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.models.boot import BootSample
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
    from gpu_autoscaler.models.resources import Resources
    from gpu_autoscaler.ports import ClusterAPI, DrainQueue, StateStore
    from gpu_autoscaler.services.drain import FleetTermination
    from gpu_autoscaler.services.garbage_collection import CollectionOutcome, GarbageCollector

__all__ = ["DRAIN_STALLED_AFTER", "ReconcileOutcome", "ReconcileService"]

logger = logging.getLogger(__name__)

NODE_MISSING_ATTRIBUTE = "nodeMissingSince"
"""NodeClaim attribute: when a tick first found the claim's Node missing (ISO 8601); dropped when it is back."""
NODE_MISSING_GRACE = timedelta(minutes=5)
"""How long a joined claim's Node may be missing before the claim is ended. A kubelet whose Node was deleted
registers it again, where it does (kubernetes#123535), at its next status sync (10 s); one restarting registers as
it starts; a reboot, a stop or a NotReady node keeps its Node object. Five ticks ride all of those out, and five
minutes of a GPU instance are little against one running, unused, until someone notices."""

DRAIN_STALLED_AFTER = stalled_after(timedelta(seconds=visibility_timeout("drain")))
"""A Draining claim no drain has stamped for this long has lost its drain (`domain.drain_progress.stalled_after`:
the drain queue's visibility timeout, 30 minutes, after the longest continuation delay, 15, and a minute's
heartbeat: 46 minutes)."""


@dataclass
class ReconcileOutcome:
    registered: list[str] = field(default_factory=list)
    """Claim ids marked Registered."""
    timed_out: list[str] = field(default_factory=list)
    """Claim ids ended because no Node joined in time, or their Node was not initialized in time."""
    initialized: list[str] = field(default_factory=list)
    """Claim ids whose node was first seen initialized this tick."""
    demand: dict[str, float] = field(default_factory=dict)
    boots: list[BootSample] = field(default_factory=list)
    """Boot times recorded this tick."""
    freed: list[str] = field(default_factory=list)
    """Claim ids in flight whose room was given back: none of their pods waits for them any more."""

    node_missing: list[str] = field(default_factory=list)
    """Claim ids ended because their Node stayed missing (deleted through the API) while the instance ran."""
    drains_resent: list[str] = field(default_factory=list)
    """Claim ids Draining with no drain working on them whose drain was sent again."""
    drains_ended: list[str] = field(default_factory=list)
    """Claim ids Draining with no drain working on them past their node's termination time: ended."""

    collected: CollectionOutcome | None = None

    def summary(self) -> dict[str, Any]:
        return {"registered": self.registered, "initialized": self.initialized, "timedOut": self.timed_out,
                "freed": self.freed, "nodeMissing": self.node_missing, "drainsResent": self.drains_resent,
                "drainsEnded": self.drains_ended,
                "boots": [{"claim": b.claim_id, "instanceType": b.instance_type,
                           "readySeconds": b.to_ready.total_seconds(), "gpusSeconds": b.to_gpus.total_seconds()}
                          for b in self.boots],
                "demandGpus": {k: round(v, 3) for k, v in sorted(self.demand.items())},
                "garbageCollection": self.collected.summary() if self.collected is not None else None}


class ReconcileService:
    def __init__(self, config: Config, store: StateStore, cluster: ClusterAPI, fleet: FleetTermination, *,
                 clock: Clock, collector: GarbageCollector | None = None, drains: DrainQueue | None = None) -> None:
        """`collector`: the garbage collector to run each tick (the Lambda's; the simulator has no leaks);
        `drains`: where stalled drains are sent again (the Lambda's drain queue; the simulator loses none)."""
        self.drains = drains
        self.config = config
        self.store = store
        self.cluster = cluster
        self.fleet = fleet
        self.clock = clock
        self.collector = collector

    def run(self, nodes: Sequence[ClusterNode] | None = None, pods: Sequence[ClusterPod] | None = None,
            ) -> ReconcileOutcome:
        """`nodes`, `pods`: the cluster as just listed (listed here when not given)."""
        nodes = self.cluster.list_nodes() if nodes is None else nodes
        pods = self.cluster.list_pods() if pods is None else pods
        now = self.clock.now()
        outcome = ReconcileOutcome()
        by_instance = {n.instance_id: n for n in nodes if n.instance_id}
        claims = self.store.list_claims(CLAIMED_STATES)
        busy = {p.node_name for p in pods if p.node_name and movable(p)}
        for claim in claims:
            node = by_instance.get(claim.instance_id) if claim.instance_id else None
            if nodes and _joined(claim):
                watched = self._watch_node(claim, node, nodes, now, outcome)
                if watched is None:
                    continue
                claim = watched
            if claim.state is ClaimState.REGISTERED:
                claim = self._restamp(claim)
            if claim.state is ClaimState.LAUNCHED and node is not None:
                self._register(claim, node, now, outcome)
            elif claim.state is ClaimState.REGISTERED and node is not None and (
                    BOOT_ATTRIBUTE not in claim.attributes or initialized_at(claim) is None):
                self._observe(claim, node, now, outcome, busy=node.name in busy)
            elif claim.state in IN_FLIGHT_STATES and node is None:
                self._maybe_time_out(claim, now, outcome)
            elif claim.state is ClaimState.DRAINING and self.drains is not None:
                self._resume_drain(claim, self.drains, now, outcome)

        moved = {*outcome.registered, *outcome.timed_out}
        self._give_back_orphaned([c for c in claims if c.id not in moved], nodes, pods, now, outcome)
        if self.collector is not None:
            outcome.collected = self.collector.run(nodes)
        outcome.demand = self._demand(nodes, pods, claims)
        record_demand(self.store, self.config, outcome.demand, now)
        return outcome

    def _restamp(self, claim: NodeClaim) -> NodeClaim:
        """The claim stamped again if it was stamped under an older hash version (`drift.restamp`: once, after an
        upgrade), as stored; else as read."""
        try:
            pool = self.config.pool(claim.pool)
        except KeyError:
            return claim
        changes = restamp(claim, pool, self.config.overhead)
        if changes is None:
            return claim
        try:
            return self.store.update_claim(claim, attributes={**claim.attributes, **changes})
        except StaleClaim:
            logger.info("claim %s changed before its pool hash was stamped again; next tick", claim.id)
            return claim

    def _watch_node(self, claim: NodeClaim, node: ClusterNode | None, nodes: Sequence[ClusterNode], now: datetime,
                    outcome: ReconcileOutcome) -> NodeClaim | None:
        """Step 7 for a claim that had a Node: the claim as it stands, or None once ended. A Node not yet given its
        providerID (a kubelet registering again, before the cloud controller manager sets it) counts by name."""
        present = node is not None or any(n.name == claim.node_name and n.instance_id is None for n in nodes)
        since = instant_attribute(claim, NODE_MISSING_ATTRIBUTE)
        if present or since is None:
            change = {k: v for k, v in claim.attributes.items() if k != NODE_MISSING_ATTRIBUTE} if present else {
                **claim.attributes, NODE_MISSING_ATTRIBUTE: now.isoformat()}
            if change == claim.attributes:
                return claim
            try:
                return self.store.update_claim(claim, attributes=change)
            except StaleClaim:
                logger.info("claim %s changed before its Node's absence was recorded; next tick", claim.id)
                return claim
        if now - since < NODE_MISSING_GRACE or self.fleet.instance_gone(claim):
            return claim  # an instance already gone: garbage collection closes its claim
        reason = (f"node {claim.node_name} deleted (missing since {since.isoformat()}) while instance "
                  f"{claim.instance_id} still ran")
        try:
            self.fleet.terminate(claim, reason)
        except StaleClaim:
            logger.info("claim %s changed while it was ended; looked at again next tick", claim.id)
            return claim
        outcome.node_missing.append(claim.id)
        logger.warning("claim %s ended: %s (kubectl delete node is no graceful removal here: drain the node "
                       "first)", claim.id, reason)
        return None

    def _resume_drain(self, claim: NodeClaim, drains: DrainQueue, now: datetime, outcome: ReconcileOutcome) -> None:
        """A Draining claim no drain has stamped for `DRAIN_STALLED_AFTER` lost its drain (dead-lettered, or never
        sent: `domain.drain_progress`). Past the node's termination time (an involuntary drain's deadline, a
        voluntary one's `cordonedAt + terminationGracePeriod`) it is ended through the fleet, as that drain would
        have ended it at that time; before it, or with none (a voluntary drain forces nothing), the recorded drain
        is sent again, its backoff reset, and the claim stamped first (conditionally: two ticks send it once), so
        the next is sent only if this one is lost too. The drain keeps its taint, cordon and budgets, as asked."""
        progress = drain_progress(claim)
        if progress is None or now - progress.seen_at < DRAIN_STALLED_AFTER:
            return
        request = progress.request
        idle = now - progress.seen_at
        node_time = termination_time(request)
        if node_time is not None and now >= node_time:
            logger.warning("claim %s: no drain has worked on it for %s and its node's termination time (%s) has "
                           "passed: ended", claim.id, idle, node_time.isoformat())
            try:
                self.fleet.terminate(claim, f"drain stalled past the node's termination time: {request.reason}")
            except StaleClaim:
                logger.info("claim %s kept changing while it was ended; looked at again next tick", claim.id)
                return
            outcome.drains_ended.append(claim.id)
            return
        try:
            self.store.update_claim(claim, attributes=progress_attributes(claim.attributes, request, now))
        except StaleClaim:
            logger.info("claim %s changed before its drain was sent again; looked at again next tick", claim.id)
            return
        drains.send(request.model_copy(update={"attempt": request.attempt + 1, "backoff": 0}))
        outcome.drains_resent.append(claim.id)
        logger.warning("claim %s has been Draining with no drain working on it for %s (dead-lettered, or never "
                       "sent): its drain is sent again", claim.id, idle)

    def give_back(self, nodes: Sequence[ClusterNode], pods: Sequence[ClusterPod]) -> list[str]:
        """Step 4 alone, on the cluster as just listed: the ids of the claims in flight whose room was given back.
        The simulator runs it on the minutes between registrations (`run` does it as part of every tick)."""
        outcome = ReconcileOutcome()
        claims = self.store.list_claims(IN_FLIGHT_STATES)
        self._give_back_orphaned(claims, nodes, pods, self.clock.now(), outcome)
        return outcome.freed

    def _give_back_orphaned(self, claims: Sequence[NodeClaim], nodes: Sequence[ClusterNode],
                            pods: Sequence[ClusterPod], now: datetime, outcome: ReconcileOutcome) -> None:
        joined = {n.instance_id: n.name for n in nodes if n.instance_id}
        for claim in orphaned_claims(claims, pods, now, joined):
            self._give_back(claim, outcome)

    def _give_back(self, claim: NodeClaim, outcome: ReconcileOutcome) -> None:
        """Leave the claim with no pods and no recorded requests, and release its pods' assignments (those still
        its own): its room is free for the packer's next pending pods. Conditional on the claim as read this
        tick: one that moved on meanwhile is looked at again on the next."""
        try:
            self.store.update_claim(claim, pods=(), attributes={
                **claim.attributes, REQUESTS_ATTRIBUTE: requests_attribute({})})
        except StaleClaim:
            logger.info("claim %s changed before its room could be given back; looked at again next tick", claim.id)
            return
        owned = [uid for uid, owner in self.store.assignments(list(claim.pods)).items() if owner == claim.id]
        if owned:
            self.store.release_pods(owned)
        outcome.freed.append(claim.id)
        logger.info("claim %s: none of its %d pod(s) waits for it any more (started elsewhere or deleted); its room "
                    "is free for the next pending pods", claim.id, len(claim.pods))

    @staticmethod
    def _first_seen(claim: NodeClaim, node: ClusterNode, now: datetime,
                    attributes: dict[str, str]) -> tuple[BootSample | None, str | None]:
        """Record in `attributes` what is seen of the claim's node for the first time: its initialization
        (`initializedAt`) and, once it is initialized, its boot (`bootSeconds`): a boot time without the other
        stands for initialization (`initialized_at`, claims from before it was recorded), so it is never written
        first — a node whose GPUs came before its EFAs (or its startup taints' end) would otherwise be taken as
        initialized from the next tick, and never given up. Returns the boot sample taken now, if any, and why the
        node is not initialized (None once it is, now or before)."""
        why = None
        if initialized_at(claim) is None:
            why = not_initialized(node, claim_requests(claim))
            if why is None:
                attributes[INITIALIZED_ATTRIBUTE] = now.isoformat()
        boot = None
        if BOOT_ATTRIBUTE not in attributes and why is None:
            boot = observe_boot(claim, node, launched_at(claim), now)
            if boot is not None:
                attributes[BOOT_ATTRIBUTE] = f"{boot.to_gpus.total_seconds():.0f}"
        return boot, why

    def _register(self, claim: NodeClaim, node: ClusterNode, now: datetime, outcome: ReconcileOutcome) -> None:
        attributes = dict(claim.attributes)
        boot, _ = self._first_seen(claim, node, now, attributes)
        initialized = INITIALIZED_ATTRIBUTE in attributes and INITIALIZED_ATTRIBUTE not in claim.attributes
        try:
            pool = self.config.pool(claim.pool)
        except KeyError:
            pool = None  # the pool is gone: drift says so without a digest
        if pool is not None:
            attributes[POOL_HASH_ATTRIBUTE] = pool_hash(pool, self.config.overhead)
            attributes[POOL_HASH_VERSION_ATTRIBUTE] = POOL_HASH_VERSION
            # The fleet records the image it launched from; a claim launched before it did gets its pool's.
            image = expected_image(self.config, pool, "arm64" if node.labels.get(L.ARCH) == "arm64" else "x86_64")
            if image and IMAGE_ATTRIBUTE not in attributes:
                attributes[IMAGE_ATTRIBUTE] = image
        try:
            self.store.transition(claim, ClaimState.REGISTERED, f"node {node.name} joined", node_name=node.name,
                                  attributes=attributes)
        except StaleClaim:
            logger.info("claim %s moved on before it could be marked Registered", claim.id)
            return
        outcome.registered.append(claim.id)
        logger.info("claim %s registered as node %s%s", claim.id, node.name, " (initialized)" if initialized else "")
        if initialized:
            outcome.initialized.append(claim.id)
        if boot is not None:
            self._record(boot, outcome)

    def _observe(self, claim: NodeClaim, node: ClusterNode, now: datetime, outcome: ReconcileOutcome, *,
                 busy: bool) -> None:
        """A registered claim whose node's initialization or boot time is not recorded yet: record each once seen
        (in one write); end the claim if its node is past its registration allowance without being initialized —
        unless pods other than DaemonSets' run on it (`busy`: it took pods, so it was usable once; a drain, not
        this, is how such a node leaves) or it may have been initialized before the time was recorded."""
        attributes = dict(claim.attributes)
        boot, why = self._first_seen(claim, node, now, attributes)
        initialized = INITIALIZED_ATTRIBUTE in attributes and INITIALIZED_ATTRIBUTE not in claim.attributes
        if why is not None and not busy and initialization_overdue(
                claim, now, self.config.timeouts.registration_ttl) and not was_initialized(
                node, claim, claim_requests(claim)):
            self._give_up_uninitialized(claim, node, why, outcome)
            return
        if attributes == claim.attributes:
            return
        try:
            self.store.update_claim(claim, attributes=attributes)
        except StaleClaim:
            logger.info("claim %s changed before its node's initialization or boot time was recorded; looked at "
                        "again next tick", claim.id)
            return
        if initialized:
            outcome.initialized.append(claim.id)
            logger.info("claim %s: node %s initialized", claim.id, node.name)
        if boot is not None:
            self._record(boot, outcome)

    def _give_up_uninitialized(self, claim: NodeClaim, node: ClusterNode, why: str,
                               outcome: ReconcileOutcome) -> None:
        ttl = self.config.timeouts.registration_ttl
        reason = f"registration timeout: node {node.name} was not initialized within {ttl} of registration ({why})"
        try:
            self.fleet.terminate(claim, reason)
        except StaleClaim:
            logger.info("claim %s changed while timing out; looked at again next tick", claim.id)
            return
        outcome.timed_out.append(claim.id)
        logger.warning("claim %s ended: %s", claim.id, reason)

    def _record(self, boot: BootSample, outcome: ReconcileOutcome) -> None:
        self.store.record_boot_time(boot, self.config.measured_lead_time.history)
        outcome.boots.append(boot)
        logger.info("claim %s (%s) booted: Ready after %.0f s, GPUs allocatable after %.0f s", boot.claim_id,
                    boot.instance_type, boot.to_ready.total_seconds(), boot.to_gpus.total_seconds())

    def _maybe_time_out(self, claim: NodeClaim, now: datetime, outcome: ReconcileOutcome) -> None:
        ttl = self.config.timeouts.registration_ttl
        since = launched_at(claim) if claim.state is ClaimState.LAUNCHED else claim.created_at
        if now - since < ttl:
            return
        what = f"instance {claim.instance_id}'s node did not join" if claim.instance_id else "it was not launched"
        reason = f"registration timeout: {what} within {ttl}"
        try:
            self.fleet.terminate(claim, reason)
        except StaleClaim:
            logger.info("claim %s changed while timing out; looked at again next tick", claim.id)
            return
        outcome.timed_out.append(claim.id)
        logger.warning("claim %s ended: %s", claim.id, reason)

    def _demand(self, nodes: Sequence[ClusterNode], pods: Sequence[ClusterPod], claims: Sequence[NodeClaim],
                ) -> dict[str, float]:
        """Requested GPUs per pool: running on its nodes, and pending on its claims."""
        live = {c.id: c for c in claims}
        by_instance = {c.instance_id: c.pool for c in live.values() if c.instance_id}
        node_pool: dict[str, str] = {}
        for node in nodes:
            pool = by_instance.get(node.instance_id) if node.instance_id else None
            pool = pool or node.labels.get(L.NODE_POOL)
            if pool:
                node_pool[node.name] = pool
        pending = [p for p in pods if p.node_name is None and movable(p)]
        owners = self.store.assignments([p.uid for p in pending]) if pending else {}
        pairs: list[tuple[str, Resources]] = []
        for pod in pods:
            if not movable(pod):
                continue
            if pod.node_name is not None:
                pool = node_pool.get(pod.node_name)
            else:
                owner = live.get(owners.get(pod.uid, ""))
                pool = owner.pool if owner is not None else None
            if pool:
                pairs.append((pool, pod.requests))
        demand = dict.fromkeys((p.name for p in self.config.node_pools), 0.0)
        demand.update(pool_gpus(self.config, pairs))
        return demand


def _joined(claim: NodeClaim) -> bool:
    """Registered, or Draining after it was: the claim had a Node (one Draining from Launched never did)."""
    return claim.state is ClaimState.REGISTERED or (claim.state is ClaimState.DRAINING and any(
        t.state is ClaimState.REGISTERED for t in claim.history))

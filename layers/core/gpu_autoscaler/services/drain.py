"""The drain use case: one `DrainRequest` in; the node cordoned, its pods evicted, then the node gone.

`domain.drain` decides each look at the node; this module acts and keeps going:

1. Ownership: the request's claim (or the claim of its instance) must exist, and the Node must be that claim's
   instance (EC2 reuses private DNS names). A drain of anything else is acknowledged and dropped.
2. Passes: look (node, pods, replacements), act (cordon + claim → Draining on the first eviction pass, evict),
   then wait the step's delay and look again while the invocation's budget lasts and the delay is short. A
   Draining claim is stamped with the drain and the time (`domain.drain_progress`; at most a write a pass, once a
   minute), so the consolidate tick can send a drain that was lost again (`services.reconcile`).
   Otherwise the request goes back on the drain queue with that delay (attempt + 1, at most 15 minutes), and
   this message is done: a 30-minute PodDisruptionBudget wait becomes a handful of messages, and an
   invocation that dies leaves the original message to be redelivered.
3. Finish (no pod left to wait for, node gone, or its termination time reached): delete what remains; wait
   while its VolumeAttachments are still attached and, on a Spot warning, until AWS reclaims the instance
   (`domain.drain.hold_termination`); then terminate the instance through the fleet (the only termination
   path), and look again every `INSTANCE_POLL` until EC2 says the instance no longer exists before deleting
   the Node object, as Karpenter's node termination controller does (`awaitInstanceTermination`, requeued
   every 5 s): a `shutting-down` instance may still run its containers' graceful shutdown (nodeadm gives it
   150 s), and deleting its Node would let PodGC delete its pods, so their controllers start successors (a
   StatefulSet's under the same identity) while they still run. The garbage collector deletes the Node if
   this drain does not see the end (`domain.garbage_collection`).

Replacements count as ready once initialized (`domain.initialization`): Registered, the Node Ready, its
ephemeral taints gone and every extended resource the claim was made for allocatable — not at Node Ready,
when the device plugin has not yet advertised a single GPU.

Just before pods are evicted or deleted (or deleted with their Node), they are taken off the replacement claims
still in flight that were made for them (`free_replaced_room`, `services.packer.free_room` says why then):
their controllers recreate them with new uids, and those must find the replacement's room free, not look full
and get a second node.

Every step is safe to repeat: cordoning is idempotent, evicting a pod already gone reports `gone`, the claim's
lifecycle writes are conditional, so a duplicated or redelivered request does no harm.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from gpu_autoscaler.domain.disruption_marks import DISRUPTION_ATTRIBUTE, unmarked
from gpu_autoscaler.domain.drain import (
    DRAIN_TAINT,
    Continuation,
    DrainAction,
    DrainStep,
    Replacements,
    continuation,
    hold_termination,
    movable,
    plan_drain,
    termination_time,
)
from gpu_autoscaler.domain.drain_progress import progress_attributes, stamp_due
from gpu_autoscaler.domain.initialization import not_initialized
from gpu_autoscaler.domain.interruption import replacement_pods
from gpu_autoscaler.domain.pod_events import deletion_events, disruption_events, failed_draining_events
from gpu_autoscaler.errors import (
    GpuAutoscalerError,
    KubernetesAccessRefused,
    KubernetesApiError,
    NodeNotFound,
    StaleClaim,
)
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.cluster import EvictionOutcome
from gpu_autoscaler.services.claim_writes import write_fresh

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.domain.pod_events import EventRecorder
    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
    from gpu_autoscaler.models.messages import DrainRequest
    from gpu_autoscaler.ports import ClusterAPI, DrainQueue, StateStore
    from gpu_autoscaler.settings import FunctionSettings

__all__ = [
    "DrainOutcome",
    "DrainService",
    "FleetTermination",
    "WrongCluster",
    "aws_drain_service",
    "free_replaced_room",
    "node_of",
]

logger = logging.getLogger(__name__)

_STARTED = (ClaimState.LAUNCHED, ClaimState.REGISTERED)
_API_REFUSAL = EvictionOutcome(pod="", evicted=False, blocked=True, message="Kubernetes API failed")
MAX_WAIT_IN_PLACE = timedelta(seconds=15)
"""Longer waits go through the queue (a delayed message costs nothing; a sleeping Lambda does)."""
INSTANCE_POLL = timedelta(seconds=10)
"""How often a finished drain asks EC2 whether the instance is gone yet, before deleting its Node."""


class FleetTermination(Protocol):
    """The fleet's termination path (`services.fleet.FleetService`): EC2 terminate plus the claim → Terminated."""

    def terminate(self, claim: NodeClaim, reason: str) -> object: ...

    def instance_gone(self, claim: NodeClaim) -> bool:
        """EC2 shows the claim's instance terminated, or no longer at all (`shutting-down` still exists)."""
        ...


class WrongCluster(GpuAutoscalerError):
    """A drain request for another cluster reached this one's drain queue."""


@dataclass
class DrainOutcome:
    """What one drain invocation did, for the handler's response, logs and metrics."""

    node: str
    status: str = "continued"
    """`finished`, `continued` (re-enqueued), `abandoned` (do-not-disrupt, no replacement) or `ignored`."""
    reason: str = ""
    passes: int = 0
    evicted: list[str] = field(default_factory=list)
    blocked: int = 0
    """Evictions refused (429) over all passes."""
    deleted: list[str] = field(default_factory=list)
    terminated: bool = False
    next_attempt: int | None = None
    delay: timedelta | None = None
    duration: timedelta | None = None
    """Since the drain's first attempt, once it finished."""
    events_refused: int = 0
    """Events on the evicted or deleted pods, and on the node for refused evictions, that the API server refused to
    take (`Recorded.refused`), over all passes."""

    def summary(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "status": self.status,
            "reason": self.reason,
            "passes": self.passes,
            "evicted": self.evicted,
            "blocked": self.blocked,
            "deleted": self.deleted,
            "terminated": self.terminated,
            "nextAttempt": self.next_attempt,
            "delaySeconds": int(self.delay.total_seconds()) if self.delay is not None else None,
            "durationSeconds": round(self.duration.total_seconds(), 3) if self.duration is not None else None,
            "eventsRefused": self.events_refused,
        }


def free_replaced_room(store: StateStore, claim: NodeClaim, pods: Sequence[ClusterPod],
                       replacements: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
    """Before `pods` leave `claim`'s node for good (evicted, deleted, or gone with the node): take them off the
    claims in flight made for them (`services.packer.free_room`) — `replacements`, and whichever claim their
    assignments name (a replacement may have put some on a claim already in flight) — and drop their
    assignments, since those uids will never be pending again. Claim id → the uids taken off it."""
    moving = [p for p in pods if movable(p)]
    if not moving:
        return {}
    owners = store.assignments([p.uid for p in moving])
    claim_ids = [c for c in dict.fromkeys([*replacements, *owners.values()]) if c != claim.id]
    if not claim_ids:
        return {}
    # Imported here: the packer's module brings the solver (numpy), which only this step of a drain needs.
    from gpu_autoscaler.services.packer import free_room

    freed = free_room(store, claim_ids, replacement_pods(moving))
    released = [uid for taken in freed.values() for uid in taken]
    if released:
        store.release_pods(released)
    return freed


def node_of(nodes: Sequence[ClusterNode], claim: NodeClaim, name: str | None = None) -> ClusterNode | None:
    """The claim's Node: the one whose providerID names the claim's instance, whatever it is called (on EKS the
    private DNS name by default, which EC2 reuses; the instance id only with nodeadm's opt-in
    `InstanceIdNodeName`). By `name` only where one side has no instance to compare (a claim not launched yet,
    a Node without providerID)."""
    if claim.instance_id:
        found = next((n for n in nodes if n.instance_id == claim.instance_id), None)
        if found is not None:
            return found
    if name is None:
        return None
    return next((n for n in nodes if n.name == name and not (claim.instance_id and n.instance_id)), None)


class DrainService:
    events: EventRecorder | None = None
    """Where evicted and deleted pods are told why their node goes (Kubernetes Events); set by `aws_drain_service`."""

    def __init__(
        self,
        cluster_name: str,
        store: StateStore,
        cluster: ClusterAPI,
        fleet: FleetTermination,
        queue: DrainQueue,
        *,
        clock: Clock,
        sleep: Callable[[float], None] = time.sleep,
        max_wait_in_place: timedelta = MAX_WAIT_IN_PLACE,
    ) -> None:
        self.cluster_name = cluster_name
        self.store = store
        self.cluster = cluster
        self.fleet = fleet
        self.queue = queue
        self.clock = clock
        self._sleep = sleep
        self._max_wait = max_wait_in_place

    def drain(self, request: DrainRequest, budget: timedelta = timedelta(0)) -> DrainOutcome:
        """Work on the drain for up to `budget` (waits included), then re-enqueue it if it is not finished."""
        if request.cluster != self.cluster_name:
            raise WrongCluster(f"drain request for cluster '{request.cluster}' reached '{self.cluster_name}'")
        outcome = DrainOutcome(node=request.node)
        claim = self._claim(request)
        if claim is None:
            outcome.status, outcome.reason = "ignored", "no claim of ours for this node"
            logger.warning("drain of %s ignored: %s", request.node, outcome.reason)
            return outcome
        began = self.clock.now()
        request = request if request.started_at else request.model_copy(update={"started_at": began})
        while True:
            outcome.passes += 1
            claim = self._stamp(request, claim)
            try:
                after = self._pass(request, claim, outcome)
            except KubernetesApiError as error:
                after = self._api_failed(request, claim, error, outcome)
            if after is None:
                return outcome
            request = after.request
            if after.delay > self._max_wait or (self.clock.now() - began) + after.delay > budget:
                return self._requeue(after, outcome)
            self._sleep(after.delay.total_seconds())
            claim = self.store.get_claim(claim.id) or claim

    def _pass(self, request: DrainRequest, claim: NodeClaim, outcome: DrainOutcome) -> Continuation | None:
        """One look and what it calls for; the continuation, or None when this drain is over."""
        now = self.clock.now()
        node = node_of(self.cluster.list_nodes(), claim, request.node_name or claim.node_name)
        if node is not None:
            outcome.node = node.name
        if claim.state is ClaimState.TERMINATED:
            if node is not None:  # its pods go with the Node object this finish deletes
                self._free_room(request, claim, self.cluster.list_pods(node.name, volume_zones=False))
            return self._finish(request, claim, node, DrainStep(DrainAction.FINISH, "claim already ended"), outcome)
        # Every pass (every few seconds while evicting): the pods alone, no claims or volumes (nothing re-planned).
        pods = self.cluster.list_pods(node.name, volume_zones=False) if node is not None else []
        replacements = self._replacements(request) if node is not None else Replacements.READY
        step = plan_drain(request, node, pods, now, replacements=replacements)
        if step.action is DrainAction.ABANDON:
            outcome.status, outcome.reason = "abandoned", step.reason
            logger.info("drain of %s abandoned: %s", request.node, step.reason)
            if node is not None:  # consolidation's taint: the node takes pods again
                self.cluster.untaint(node.name, DRAIN_TAINT)
            self._unmark(claim)
            return None
        if step.cordon and node is not None:
            claim = self._start(node, claim, request)
        self._free_room(request, claim, (*step.delete, *step.evict))
        self._delete(request, claim, node.name if node is not None else request.node, step, outcome)
        if step.action is DrainAction.FINISH:
            held = hold_termination(request, pods, self.cluster.volume_attachments(node.name), now) if node else None
            if held is None:
                return self._finish(request, claim, node, step, outcome)
            step = held
        outcomes = self._evict(step, outcome)
        self._tell_evicted(request, claim, node.name if node is not None else request.node, step.evict, outcomes,
                           outcome)
        outcome.reason = step.reason
        return continuation(request, step, outcomes, now)

    def _api_failed(self, request: DrainRequest, claim: NodeClaim, error: KubernetesApiError,
                    outcome: DrainOutcome) -> Continuation | None:
        """The Kubernetes API failed mid-pass. Before the node's termination time (or without one: a voluntary
        drain never forces): try again soon, backing off like a refused eviction (SQS would only redeliver after
        its visibility timeout). At or past it: the instance goes anyway, through the fleet; the Node object is
        left for the API to come back. Refused access (401, 403) is no outage: before that time the drain fails,
        saying what grants the access (SQS redelivers it, then dead-letters it: the DLQ's alarm), rather than
        re-enqueue itself for ever."""
        now = self.clock.now()
        node_time = termination_time(request)
        waiting = node_time is None or now < node_time
        if error.is_access_refused:
            refused = KubernetesAccessRefused(error)
            logger.error("drain of %s failed: %s", request.node, refused)
            if waiting:
                raise refused from error
            error = refused
        else:
            logger.warning("drain of %s: Kubernetes API failed: %s", request.node, error)
        outcome.reason = f"Kubernetes API failed: {error}"
        if waiting:
            after = continuation(request, DrainStep(DrainAction.EVICT, outcome.reason), [_API_REFUSAL], now)
            # Whether the cordon went through is unknown: a cordon time is only ever recorded by a pass that
            # saw it (a later one, at worst: the grace period then starts late, never early).
            return Continuation(after.request.model_copy(update={"cordoned_at": request.cordoned_at}), after.delay)
        current = self.store.get_claim(claim.id) or claim
        if current.state is not ClaimState.TERMINATED:
            self.fleet.terminate(current, f"drain deadline passed with the Kubernetes API failing: {request.reason}")
            outcome.terminated = True
        outcome.status = "finished"
        return None

    # Steps

    def _claim(self, request: DrainRequest) -> NodeClaim | None:
        claim = self.store.get_claim(request.claim_id) if request.claim_id else None
        if claim is None and request.instance_id:
            claim = self.store.claim_for_instance(request.instance_id)
        if claim is not None and request.instance_id and claim.instance_id not in (None, request.instance_id):
            logger.warning("drain of %s names instance %s but claim %s has %s", request.node,
                           request.instance_id, claim.id, claim.instance_id)
            return None
        return claim

    def _unmark(self, claim: NodeClaim) -> None:
        """The abandoned decision's mark goes with its taint: the node is a consolidation candidate again at the
        next tick, not only once the drain's deadline has passed (Karpenter un-taints the candidates of a
        command whose replacement failed and starts over). Retried: a lost write keeps the node out until then."""
        def still(fresh: NodeClaim) -> bool:
            return fresh.state is ClaimState.REGISTERED and DISRUPTION_ATTRIBUTE in fresh.attributes

        if not still(claim):
            return
        try:
            write_fresh(self.store, claim,
                        lambda fresh: self.store.update_claim(fresh, attributes=unmarked(fresh.attributes)), still)
        except StaleClaim:
            logger.info("claim %s moved on; its disruption mark lapses by itself", claim.id)

    def _start(self, node: ClusterNode, claim: NodeClaim, request: DrainRequest) -> NodeClaim:
        """Cordon and taint; the claim becomes Draining, so its pods are free to be planned elsewhere."""
        try:
            self.cluster.cordon(node.name, DRAIN_TAINT)
        except NodeNotFound:
            logger.info("node %s vanished while being cordoned", node.name)
        return self._mark_draining(claim, request)

    def _mark_draining(self, claim: NodeClaim, request: DrainRequest) -> NodeClaim:
        """Draining, with this drain stamped on the claim in the same write (`domain.drain_progress`)."""
        for _ in range(3):
            if claim.state not in _STARTED:
                return claim
            try:
                return self.store.transition(
                    claim, ClaimState.DRAINING, f"drain: {request.reason}",
                    attributes=progress_attributes(claim.attributes, request, self.clock.now()))
            except StaleClaim:
                claim = self.store.get_claim(claim.id) or claim
        return claim

    def _stamp(self, request: DrainRequest, claim: NodeClaim) -> NodeClaim:
        """Record on a Draining claim that this drain works on it, and as what (`domain.drain_progress`): at most
        one write a pass, and only once `HEARTBEAT` has passed since the last stamp. The consolidate tick sends a
        drain again for a claim left unstamped too long. A write another writer got in first with is not retried:
        the claim is read again and the next pass stamps it."""
        now = self.clock.now()
        if not stamp_due(claim, now):
            return claim
        try:
            return self.store.update_claim(claim, attributes=progress_attributes(claim.attributes, request, now))
        except StaleClaim:
            return self.store.get_claim(claim.id) or claim

    def _tell_evicted(self, request: DrainRequest, claim: NodeClaim, node_name: str, pods: Sequence[ClusterPod],
                      outcomes: Sequence[EvictionOutcome], outcome: DrainOutcome) -> None:
        """Each evicted pod hears why its node goes; the node, which evictions a budget refused."""
        if self.events is None:
            return
        evicted = [pod for pod, result in zip(pods, outcomes, strict=False) if result.evicted]
        told = disruption_events(evicted, node_name, claim, request.reason)
        told += failed_draining_events(node_name, [result for result in outcomes if result.blocked])
        outcome.events_refused += self.events.record(told).refused

    def _evict(self, step: DrainStep, outcome: DrainOutcome) -> list[EvictionOutcome]:
        results = []
        for pod in step.evict:
            result = self.cluster.evict(pod)
            results.append(result)
            if result.evicted:
                outcome.evicted.append(pod.key)
            elif result.blocked:
                outcome.blocked += 1
                logger.info("eviction of %s refused: %s", pod.key, result.message)
        return results

    def _delete(self, request: DrainRequest, claim: NodeClaim, node_name: str, step: DrainStep,
                outcome: DrainOutcome) -> None:
        """Pods whose deletion time has come: deleted with what is left of the node's time as grace period, and
        each told so (an Event: it went past its budget and do-not-disrupt, which its owner should see)."""
        for pod in step.delete:
            self.cluster.delete_pod(pod, step.delete_grace)
            outcome.deleted.append(pod.key)
        if not step.delete:
            return
        logger.warning("drain of %s deleted %s (grace %ss): their node's termination time comes", request.node,
                       ", ".join(p.key for p in step.delete), step.delete_grace)
        if self.events is not None:
            told = deletion_events(step.delete, node_name, claim, request.reason, step.delete_grace,
                                   termination_time(request))
            outcome.events_refused += self.events.record(told).refused

    def _finish(self, request: DrainRequest, claim: NodeClaim, node: ClusterNode | None, step: DrainStep,
                outcome: DrainOutcome) -> Continuation | None:
        """Terminate the instance; delete the Node once the instance no longer exists (until then: look again)."""
        current = self.store.get_claim(claim.id) or claim
        if current.state is not ClaimState.TERMINATED:
            self.fleet.terminate(current, f"drained ({step.reason}): {request.reason}")
            outcome.terminated = True
        if node is not None:
            if not self.fleet.instance_gone(current):
                outcome.reason = f"{step.reason}; {node.name} kept until {current.instance_id} is terminated"
                return Continuation(request.model_copy(update={"attempt": request.attempt + 1}), INSTANCE_POLL)
            self.cluster.delete_node(node.name)
        outcome.status, outcome.reason = "finished", step.reason
        outcome.duration = self.clock.now() - (request.started_at or self.clock.now())
        return None

    def _free_room(self, request: DrainRequest, claim: NodeClaim, pods: Sequence[ClusterPod]) -> None:
        freed = free_replaced_room(self.store, claim, pods, request.replacements)
        if freed:
            logger.info("drain of %s freed the room of %d pods on %s", request.node,
                        sum(len(u) for u in freed.values()), ", ".join(sorted(freed)))

    def _requeue(self, after: Continuation, outcome: DrainOutcome) -> DrainOutcome:
        self.queue.send(after.request, after.delay)
        outcome.status = "continued"
        outcome.next_attempt, outcome.delay = after.request.attempt, after.delay
        return outcome

    def _replacements(self, request: DrainRequest) -> Replacements:
        """READY once every replacement is Registered with an initialized node; FAILED if one ended (or vanished)
        without ever registering; WAITING otherwise."""
        # Imported here: the packing package loads numpy and the solver, which the interruption function's
        # import of this module (for its helpers) must not pay before its cordon (issue 17).
        from gpu_autoscaler.domain.packing.results import claim_requests

        nodes: list[ClusterNode] | None = None
        waiting = False
        for claim_id in request.replacements:
            claim = self.store.get_claim(claim_id)
            if claim is None:
                return Replacements.FAILED
            registered = claim.state is ClaimState.REGISTERED or any(
                t.state is ClaimState.REGISTERED for t in claim.history)
            if claim.state in (ClaimState.DRAINING, ClaimState.TERMINATED):
                if not registered:
                    return Replacements.FAILED
                continue
            if claim.state is not ClaimState.REGISTERED:
                waiting = True
                continue
            nodes = self.cluster.list_nodes() if nodes is None else nodes
            node = node_of(nodes, claim, claim.node_name)
            why = not_initialized(node, claim_requests(claim)) if node is not None else "its Node is gone"
            if why is not None:
                logger.info("drain of %s waits for replacement %s: %s", request.node, claim.id, why)
                waiting = True
        return Replacements.WAITING if waiting else Replacements.READY


def aws_drain_service(settings: FunctionSettings, clock: Clock | None = None) -> DrainService:
    """The service as the Lambda runs it: configuration from SSM, state in DynamoDB, the cluster through the
    Kubernetes API with an EKS token, terminations through the fleet, progress on the drain queue."""
    from gpu_autoscaler.services.aws_environment import AwsEnvironment

    env = AwsEnvironment(settings, clock)
    service = DrainService(env.config.cluster_name, env.store, env.cluster, env.terminations, env.drain_queue,
                           clock=env.clock)
    service.events = env.pod_events
    return service

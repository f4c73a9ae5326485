"""The interruption use case: one AWS notice about an instance in; the node replaced, drained or closed.

`domain.interruption` parses the notice and decides; this module acts, per instance the notice names:

- Not ours (no claim for the instance): acknowledged, logged at debug, nothing else.
- State change (stopping, stopped, shutting-down, terminated): the claim is closed through the fleet (its pods
  released for planning elsewhere). The Node object is deleted (its pods go with it, to be recreated and reported
  pending) on `terminated` only, whoever ended the claim: until then the instance may still be running its
  containers' graceful shutdown (`domain.garbage_collection` says why; it deletes the Node if this event is missed).
- Spot warning, capacity reservation warning, Capacity Block expiration: cordon and taint at once; the offering
  is marked unavailable; the claim becomes Draining (its pods are no longer covered by it); a replacement is
  planned for the node's pods through the packer (claims stored, launch requested) and an involuntary drain is
  requested with the warning's deadline.
- Rebalance (unless the pool ignores it), AWS Health scheduled change: replacement first, then a drain that
  waits for it to be initialized (or `rebalanceDrainAfter`, or shortly before the scheduled start). A
  rebalance drain is voluntary (it forces nothing unless the pool has a `terminationGracePeriod`); a scheduled
  change is involuntary: the instance goes at its start.
- A Spot warning's drain does not terminate the instance before the warning's `instance-action-time`.

A Capacity Block's expiration warning names the reservation, not instances: its instances are the live reserved
claims running in it (`NodeClaim.reservation_id`, recorded at launch), and, where a claim does not say, the
instances DescribeInstances shows running in it (`CapacityReservationId`). Each is then handled as above, its drain
due 30 minutes before the block ends (when EC2 starts terminating), the replacement planned on what the pool allows
besides the block.

A repeated notice acts once (the handler's idempotency); everything here is also safe to repeat on its own
(the packer keys replacement claims by the notice, the lifecycle writes are conditional).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from gpu_autoscaler.domain.catalog import unavailable_key
from gpu_autoscaler.domain.drain import DRAIN_TAINT, movable, protected_pods, voluntary_refusal
from gpu_autoscaler.domain.drain_progress import progress_attributes
from gpu_autoscaler.domain.interruption import decide, replacement_pods
from gpu_autoscaler.domain.packing.results import SOURCE_ATTRIBUTE
from gpu_autoscaler.errors import KubernetesAccessRefused, KubernetesApiError, NodeNotFound, StaleClaim
from gpu_autoscaler.models.claims import CLAIMED_STATES, ClaimState
from gpu_autoscaler.models.messages import DrainRequest
from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler.services.drain import free_replaced_room, node_of

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.interruption import Notice, Response
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.cluster import ClusterNode
    from gpu_autoscaler.ports import ClusterAPI, DrainQueue, OwnedInstances, StateStore
    from gpu_autoscaler.services.drain import FleetTermination
    from gpu_autoscaler.services.packer import PackerService
    from gpu_autoscaler.settings import FunctionSettings

__all__ = ["InterruptionOutcome", "InterruptionService", "aws_interruption_service"]

logger = logging.getLogger(__name__)


@dataclass
class InterruptionOutcome:
    """What one notice did to one instance, for the handler's response, logs and metrics."""

    event_id: str
    kind: str
    instance_id: str
    action: str = "ignored"
    """`ignored` (not ours, already ended, pool setting), `closed`, `replace-and-drain`, `drain`."""
    claim_id: str | None = None
    node: str | None = None
    cordoned: bool = False
    pods: list[str] = field(default_factory=list)
    """The node's pods a replacement was planned for (namespace/name): none when the node held no pod that moves
    by the time the notice was acted on."""
    replacements: list[str] = field(default_factory=list)
    unschedulable: list[str] = field(default_factory=list)
    drain: DrainRequest | None = None
    reason: str = ""

    def summary(self) -> dict[str, Any]:
        return {
            "eventId": self.event_id,
            "kind": self.kind,
            "instanceId": self.instance_id,
            "action": self.action,
            "claimId": self.claim_id,
            "node": self.node,
            "cordoned": self.cordoned,
            "pods": self.pods,
            "replacements": self.replacements,
            "unschedulable": self.unschedulable,
            "drain": self.drain.model_dump(mode="json", by_alias=True) if self.drain else None,
            "reason": self.reason,
        }


class InterruptionService:
    def __init__(
        self,
        config: Config,
        store: StateStore,
        cluster: ClusterAPI,
        fleet: FleetTermination,
        packer: PackerService,
        drains: DrainQueue,
        *,
        clock: Clock,
        inventory: OwnedInstances | None = None,
    ) -> None:
        """`inventory`: EC2's list of the cluster's instances, to find a Capacity Block's nodes no claim names."""
        self.config = config
        self.store = store
        self.cluster = cluster
        self.fleet = fleet
        self.packer = packer
        self.drains = drains
        self.clock = clock
        self.inventory = inventory

    def handle(self, notice: Notice) -> list[InterruptionOutcome]:
        return [self.handle_instance(notice, instance_id) for instance_id in self.instances_for(notice)]

    def instances_for(self, notice: Notice) -> list[str]:
        """The instances a notice is about: named in it, or, for a reservation, the ones running in it."""
        if notice.instance_ids or notice.reservation_id is None:
            return list(notice.instance_ids)
        # Imported here: reconcile's module graph loads numpy and the solver, which a Spot warning's cold start
        # must not pay before its cordon (issue 17).
        from gpu_autoscaler.models.claims import CLAIMED_STATES

        reservation = notice.reservation_id
        live = [c for c in self.store.list_claims(CLAIMED_STATES) if c.instance_id]
        # Reserved claims only: one recorded before claims named the reservation they run in may name the one it was
        # planned on, then fell back to On-Demand from.
        found = [c.instance_id for c in live
                 if c.reservation_id == reservation and c.capacity_type == "reserved" and c.instance_id]
        if self.inventory is not None:
            found += [i.instance_id for i in self.inventory.owned_instances()
                      if i.capacity_reservation_id == reservation and not i.gone]
        instances = list(dict.fromkeys(found))
        logger.info("reservation %s: %d instance(s) of this cluster run in it", reservation, len(instances))
        return instances

    def handle_instance(self, notice: Notice, instance_id: str) -> InterruptionOutcome:
        """Act on the notice for one instance. Refused access (401, 403) fails it saying what grants the access
        (the record is redelivered, then dead-lettered: the DLQ's alarm), as a consolidation tick or a drain does;
        any other API failure fails it as the API gave it."""
        try:
            return self._handle_instance(notice, instance_id)
        except KubernetesApiError as error:
            if not error.is_access_refused:
                raise
            refused = KubernetesAccessRefused(error)
            logger.error("%s for %s failed: %s", notice.kind, instance_id, refused)
            raise refused from error

    def _handle_instance(self, notice: Notice, instance_id: str) -> InterruptionOutcome:
        outcome = InterruptionOutcome(event_id=notice.event_id, kind=str(notice.kind), instance_id=instance_id)
        claim = self.store.claim_for_instance(instance_id)
        if claim is None:
            outcome.reason = "instance not launched by this cluster"
            logger.debug("%s for %s ignored: %s", notice.kind, instance_id, outcome.reason)
            return outcome
        outcome.claim_id = claim.id
        pool = next((p for p in self.config.node_pools if p.name == claim.pool), None)
        now = self.clock.now()
        response = decide(notice, instance_id, claim, pool, now, drain_timeout=self.config.timeouts.interruption_drain)
        if claim.state is ClaimState.TERMINATED:
            # Whoever ended it (a drain, the fleet, an earlier notice) freed its pods; its Node goes once the
            # instance no longer exists.
            if notice.state == "terminated":
                self._delete_node(claim)
            outcome.reason = "claim already ended"
            return outcome
        if not (response.close or response.drain or response.replace):
            outcome.reason = response.reason
            logger.info("%s for %s: %s", notice.kind, instance_id, response.reason)
            return outcome
        nodes = self.cluster.list_nodes()
        node = node_of(nodes, claim, claim.node_name)
        outcome.node = node.name if node is not None else None
        if response.close:
            return self._close(claim, node, response, outcome, gone=notice.state == "terminated")
        if response.drain and not response.involuntary and node is not None:
            refused = voluntary_refusal(node, protected_pods(self.cluster.list_pods(node.name), now))
            if refused is not None:  # the drain would leave the node alone: a replacement would only idle
                outcome.reason = f"{response.reason}: nothing replaced, a voluntary drain would be refused: {refused}"
                logger.info("%s for %s: %s", notice.kind, instance_id, outcome.reason)
                return outcome
        if response.cordon_now and node is not None:
            outcome.cordoned = self._cordon(node)
        if response.mark_unavailable:
            self._mark_unavailable(claim, response.reason)
        if response.involuntary:
            claim = self._draining(claim, self._drain_request(claim, node, response, []))
        if response.replace:
            self._replace(notice, claim, node, outcome)
        if response.drain:
            outcome.drain = self._drain_request(claim, node, response, outcome.replacements)
            self.drains.send(outcome.drain)
        outcome.action = "replace-and-drain" if response.replace else "drain"
        outcome.reason = response.reason
        return outcome

    # Steps

    def _close(self, claim: NodeClaim, node: ClusterNode | None, response: Response, outcome: InterruptionOutcome,
               *, gone: bool) -> InterruptionOutcome:
        """The instance is gone or going: end the claim, drop its Node if the instance no longer exists (`gone`),
        free its pods for planning elsewhere — and the room a replacement made for them holds, if it is still on
        its way (the instance went before its drain had moved them): their controllers' new pods take it."""
        on_node = self.cluster.list_pods(node.name) if node is not None else []
        free_replaced_room(self.store, claim, on_node)
        self.fleet.terminate(claim, response.reason)
        if node is not None and gone:
            self.cluster.delete_node(node.name)
        self.store.release_pods(list(dict.fromkeys([*claim.pods, *(p.uid for p in on_node)])))
        outcome.action, outcome.reason = "closed", response.reason
        return outcome

    def _delete_node(self, claim: NodeClaim) -> None:
        node = node_of(self.cluster.list_nodes(), claim, claim.node_name)
        if node is None:
            return
        self.cluster.delete_node(node.name)
        logger.info("node %s deleted: its instance %s is terminated", node.name, claim.instance_id)

    def _cordon(self, node: ClusterNode) -> bool:
        try:
            self.cluster.cordon(node.name, DRAIN_TAINT)
        except NodeNotFound:
            logger.info("node %s vanished before it could be cordoned", node.name)
            return False
        return True

    def _mark_unavailable(self, claim: NodeClaim, reason: str) -> None:
        """The offering the node ran on: a reservation's record names it (`unavailable_key`), so a block's end leaves
        the other reservations of its type and zone on offer."""
        if claim.instance_type and claim.zone:
            offering = unavailable_key(claim.instance_type, claim.zone, claim.capacity_type, claim.reservation_id)
            self.store.mark_unavailable(offering, self.config.timeouts.unavailable_offering_ttl, reason)

    def _draining(self, claim: NodeClaim, drain: DrainRequest) -> NodeClaim:
        """The node is doomed: its claim stops covering pods, so the replacement can take them. The drain it is
        to get is recorded in the same write (`domain.drain_progress`): should this invocation fail before
        sending it, every time, the consolidate tick sends it (or, past its deadline, ends the claim)."""
        for _ in range(3):
            if claim.state not in (ClaimState.LAUNCHED, ClaimState.REGISTERED):
                return claim
            try:
                return self.store.transition(
                    claim, ClaimState.DRAINING, drain.reason,
                    attributes=progress_attributes(claim.attributes, drain, self.clock.now()))
            except StaleClaim:
                claim = self.store.get_claim(claim.id) or claim
        return claim

    def _replace(self, notice: Notice, claim: NodeClaim, node: ClusterNode | None,
                 outcome: InterruptionOutcome) -> None:
        """Plan the node's pods as pending pods (the packer's path: in-flight claims first, the offering just
        lost unavailable), store the claims, request their launch; record which claims now cover them."""
        source = f"{notice.kind}#{claim.instance_id}"
        pods = [p for p in self.cluster.list_pods(node.name) if movable(p)] if node is not None else []
        if not pods:
            outcome.replacements = self._planned_before(source)
            return
        outcome.pods = [p.key for p in pods]
        uids = [p.uid for p in pods]
        self.store.release_pods(uids)
        document = PendingPodsDocument(schema_version=1, cluster=self.config.cluster_name, sent_at=self.clock.now(),
                                       pods=replacement_pods(pods))
        packed = self.packer.handle(document, source=source, running={p.uid: p.started_at for p in pods})
        covering = self.store.assignments(uids)
        outcome.replacements = sorted({cid for cid in covering.values() if cid != claim.id})
        outcome.unschedulable = [u.name for u in packed.unschedulable]
        if outcome.unschedulable:
            logger.warning("no replacement for %s: %s", claim.id, ", ".join(outcome.unschedulable))

    def _planned_before(self, source: str) -> list[str]:
        """The replacements an earlier attempt at this notice planned, still live: the node holds no pod that moves
        any more because that attempt's drain took them (it sent the drain, then failed; or this is a redelivery
        racing it). Found by the claims' source (`SOURCE_ATTRIBUTE`: the packer's claims keep the document they
        were planned for), so this outcome and the drain it sends name them, not a node replaced by nothing."""
        planned = sorted(c.id for c in self.store.list_claims(CLAIMED_STATES)
                         if c.live and c.attributes.get(SOURCE_ATTRIBUTE) == source)
        if planned:
            logger.info("no pod left to move on the node of %s: the replacements planned before are %s",
                        source, ", ".join(planned))
        return planned

    def _drain_request(self, claim: NodeClaim, node: ClusterNode | None, response: Response,
                       replacements: list[str]) -> DrainRequest:
        now = self.clock.now()
        deadline = response.drain_deadline or now
        return DrainRequest(
            cluster=self.config.cluster_name,
            node_name=node.name if node is not None else claim.node_name,
            instance_id=claim.instance_id,
            claim_id=claim.id,
            reason=response.reason,
            involuntary=response.involuntary,
            deadline=deadline,
            replacement_claim_id=replacements[0] if replacements else None,
            replacement_claim_ids=replacements[1:],
            wait_until=response.wait_until if response.wait_for_replacement else now,
            terminate_after=response.terminate_after,
            termination_grace_period=response.termination_grace_period,
        )


def aws_interruption_service(settings: FunctionSettings, clock: Clock | None = None, *,
                             clients: AwsClients | None = None) -> InterruptionService:
    """The service as the Lambda runs it: configuration from SSM, state in DynamoDB, the cluster through the
    Kubernetes API with an EKS token, replacements through the packer, drains on the drain queue. What the
    cordon does not need (packer, fleet, drain queue, EC2 inventory) is built on first use, after it: a cold
    start on a Spot warning spends its seconds on the cordon first (issue 17)."""
    from gpu_autoscaler.services.aws_environment import AwsEnvironment, Deferred

    env = AwsEnvironment(settings, clock, clients=clients)

    def inventory() -> OwnedInstances:
        from gpu_autoscaler.adapters.aws.fleet import Ec2Compute

        return Ec2Compute(env.clients.client("ec2"), env.config.cluster_name)

    return InterruptionService(
        env.config, env.store, env.cluster,
        cast("FleetTermination", Deferred(lambda: env.terminations)),
        cast("PackerService", Deferred(lambda: env.packer)),
        cast("DrainQueue", Deferred(lambda: env.drain_queue)),
        clock=env.clock, inventory=cast("OwnedInstances", Deferred(inventory)))

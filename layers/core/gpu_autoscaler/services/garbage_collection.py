"""The garbage collector, run by reconcile on the consolidation schedule (rate(1 minute)).

One DescribeInstances listing of the cluster's owned instances (tag `gpu-autoscaler/cluster`), then the claims;
`domain.garbage_collection` decides, this acts:

- a leaked instance (no live claim, older than `timeouts.garbageCollectionGrace`) is terminated (IAM lets this
  function terminate only what carries the ownership tag);
- a live claim whose instance is gone is closed through the fleet's one termination path (claim Terminated, its
  pods released for the packer); one the listing misses is first looked up by id (one DescribeInstances for all),
  and left alone, logged and counted (`OwnershipTagLost`), if EC2 still has it without our tag;
- the Node of an instance that no longer exists (terminated, by whoever) is deleted (`domain.garbage_collection`
  says why only then).

Safe to repeat: termination is idempotent and the claim writes are conditional.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.garbage_collection import collect
from gpu_autoscaler.errors import StaleClaim
from gpu_autoscaler.models.claims import CLAIMED_STATES
from gpu_autoscaler.models.labels import TAG_CLUSTER

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.models.cluster import ClusterNode
    from gpu_autoscaler.ports import ClusterAPI, Compute, OwnedInstances, StateStore
    from gpu_autoscaler.services.drain import FleetTermination

__all__ = ["CollectionOutcome", "GarbageCollector"]

logger = logging.getLogger(__name__)


@dataclass
class CollectionOutcome:
    terminated: list[str] = field(default_factory=list)
    """Leaked instance ids terminated."""
    closed: list[str] = field(default_factory=list)
    """Claim ids closed because their instance is gone."""
    ownership_lost: list[str] = field(default_factory=list)
    """Instances of live claims that still exist without our ownership tag: left alone (`OwnershipTagLost`)."""

    def summary(self) -> dict[str, Any]:
        return {"terminatedInstances": self.terminated, "closedClaims": self.closed,
                "ownershipLost": self.ownership_lost}


class GarbageCollector:
    def __init__(self, config: Config, store: StateStore, inventory: OwnedInstances, compute: Compute,
                 fleet: FleetTermination, cluster: ClusterAPI, *, clock: Clock) -> None:
        self.config = config
        self.store = store
        self.inventory = inventory
        self.compute = compute
        self.fleet = fleet
        self.cluster = cluster
        self.clock = clock

    def run(self, nodes: Sequence[ClusterNode]) -> CollectionOutcome:
        instances = self.inventory.owned_instances()  # the cloud first, then the claims (see the domain module)
        claims = self.store.list_claims(CLAIMED_STATES)  # ended claims (kept 30 days) decide nothing here
        decision = collect(instances, claims, self.clock.now(), self.config.timeouts.garbage_collection_grace)
        if decision.unlisted:  # not gone on the tag-filtered listing's word alone (see the domain module)
            decision = decision.settled(self.compute.instance_states(decision.unlisted))
        outcome = CollectionOutcome(ownership_lost=decision.ownership_lost)
        for instance_id in decision.ownership_lost:
            logger.error("instance %s of a live claim still exists but no longer carries %s=%s (re-tagged or "
                         "untagged in EC2): its claim and Node are left alone, and this cluster can no longer end it; "
                         "put the tag back", instance_id, TAG_CLUSTER, self.config.cluster_name)
        node_of = {n.instance_id: n for n in nodes if n.instance_id}
        if decision.leaked:
            ids = [i.instance_id for i in decision.leaked]
            outcome.terminated = self.compute.terminate(ids)
            for instance_id in ids:
                logger.warning("instance %s has no live claim: %s", instance_id,
                               "terminated" if instance_id in outcome.terminated else "termination not confirmed")
        for claim in decision.gone:
            try:
                self.fleet.terminate(claim, f"instance {claim.instance_id} is gone (garbage collection)")
            except StaleClaim:
                logger.info("claim %s changed while being closed; looked at again next tick", claim.id)
                continue
            outcome.closed.append(claim.id)
            logger.warning("claim %s closed: its instance %s is gone", claim.id, claim.instance_id)
        for instance_id in decision.ended:
            self._delete_node(node_of.get(instance_id))
        return outcome

    def _delete_node(self, node: ClusterNode | None) -> None:
        if node is None:
            return
        self.cluster.delete_node(node.name)  # a Node gone meanwhile (the cloud controller manager's doing) is fine
        logger.info("node %s deleted: its instance %s no longer exists", node.name, node.instance_id)

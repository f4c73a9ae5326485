"""Garbage collection: what EC2 has and the claims do not agree on, decided from the two lists (and EC2's word by id).

As Karpenter's `instance.garbagecollection` controller does (list the cloud first, then the claims): an owned
instance that no live claim accounts for, older than the grace period, is a leak (a launch recorded nowhere, a
termination that did not take, a claim closed while EC2 still had the instance pending) and is terminated. The
other way round, a claim whose instance EC2 no longer shows (or shows shutting down, stopping or stopped) for
longer than the grace period has lost its capacity without a state-change event reaching us, and is closed (its
instance terminated), as that event would have closed it. The grace covers both EC2's eventual consistency (a
just-launched instance may be missing from DescribeInstances for a while) and the seconds between CreateFleet and
the claim write.

A Node goes only once its instance no longer exists (EC2 shows it `terminated`, or no longer shows it), whoever
terminated it: Karpenter keeps a Node until the cloud provider no longer finds its instance (node termination
controller, `awaitInstanceTermination`), since a `shutting-down` instance may still run its containers' graceful
shutdown, and its pods, deleted with the Node by PodGC, would be recreated elsewhere while they still run. EC2
shows a terminated instance for about an hour: this collector, every minute, deletes the Nodes the drain or the
interruption function (each deleting the Node when it sees the instance terminated) did not.

The listing is filtered by our ownership tag, which anyone in the account with `ec2:CreateTags` or `ec2:DeleteTags`
can change. So a live claim whose instance the listing misses is not gone on the listing's word alone: EC2 is asked
for those instances by id (one DescribeInstances, only for the claims that look gone, `Collection.unlisted`), and
one it still has (pending, running, stopping, stopped) has only lost our tag: its claim stays open and its Node
stays (`ownership_lost`, logged and counted). Karpenter's NodeClaim garbage collection likewise leaves a claim alone
whose instance its tag-filtered list misses while the Node is Ready (kubernetes-sigs/karpenter
pkg/controllers/nodeclaim/garbagecollection/controller.go: "we know that the kubelet process is still running if
the Node Ready condition is true"). Closing it would delete a Node whose pods still run, and leave the instance
running and billing with no one to end it (IAM refuses this cluster's roles to terminate it without our tag). One
EC2 shows shutting down is gone, but its Node waits for `terminated`, as above; one it shows terminated, or does
not know, is gone with its Node.

An instance launched for a claim still Pending is not a leak at any age: the fleet is recording that launch (or
its message comes back and asks EC2 the same request again, under the same ClientToken, and is handed the same
instances), and keeps the instance or ends it itself. A single claim's instance names its claim from launch; the
instances of a request for several claims carry the request's token (`gpu-autoscaler/launch`), which each of its
claims records as its attempt, until each is tagged with its claim. Terminating them on age alone (issue 19: the
claim tags were throttled past the grace) left their claims to be recorded Launched on terminated instances.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.fleet import ATTEMPT_ATTRIBUTE, Attempt
from gpu_autoscaler.models.claims import ClaimState, launched_at

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime, timedelta

    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.fleet import OwnedInstance

__all__ = ["STILL_EXISTS", "Collection", "collect"]

_HAS_INSTANCE = frozenset({ClaimState.LAUNCHED, ClaimState.REGISTERED, ClaimState.DRAINING})
STILL_EXISTS = frozenset({"pending", "running", "stopping", "stopped"})
"""EC2's states of an instance that still exists (and may run): one the listing misses in them has lost our tag."""


@dataclass
class Collection:
    leaked: list[OwnedInstance] = field(default_factory=list)
    """Owned instances no live claim accounts for: terminate them."""
    gone: list[NodeClaim] = field(default_factory=list)
    """Live claims whose instance EC2 no longer has, or has stopped: close them."""
    ended: list[str] = field(default_factory=list)
    """Instances that no longer exist (EC2 shows them terminated, or a live claim's no more): their Nodes go."""
    unlisted: list[str] = field(default_factory=list)
    """The instances of `gone` claims the listing does not show at all: EC2 is asked for them by id (`settled`)."""
    ownership_lost: list[str] = field(default_factory=list)
    """Instances the listing missed that EC2 still has (`STILL_EXISTS`): our tag changed or went; left alone."""

    def settled(self, states: Mapping[str, str]) -> Collection:
        """This decision once EC2 has said by id what it has of the `unlisted` instances (`states`: state name by
        id, an id missing being one EC2 does not know): a claim whose instance still exists is not gone, one shutting
        down is gone but its Node waits, one terminated or unknown is gone with its Node."""
        lost = [i for i in self.unlisted if states.get(i) in STILL_EXISTS]
        ended = [i for i in self.unlisted if states.get(i, "terminated") == "terminated"]
        return replace(self, gone=[c for c in self.gone if c.instance_id not in lost], ended=[*self.ended, *ended],
                       unlisted=[], ownership_lost=lost)


def _attempt_token(claim: NodeClaim) -> str | None:
    """The ClientToken of the launch attempt recorded on a claim, if any (an unreadable one: none)."""
    raw = claim.attributes.get(ATTEMPT_ATTRIBUTE)
    if not raw:
        return None
    try:
        return Attempt.from_json(raw)[1]
    except (ValueError, KeyError, TypeError):
        return None


def collect(instances: Sequence[OwnedInstance], claims: Sequence[NodeClaim], now: datetime,
            grace: timedelta) -> Collection:
    """`instances`: listed before `claims` were read, so a claim written in between is seen, never missed."""
    live = [c for c in claims if c.state is not ClaimState.TERMINATED]
    by_instance = {c.instance_id: c for c in live if c.instance_id}
    pending = {c.id for c in live if c.state is ClaimState.PENDING}
    launching = {token for c in live if c.state is ClaimState.PENDING and (token := _attempt_token(c))}
    out = Collection()
    for instance in instances:
        if instance.gone or instance.instance_id in by_instance:
            continue
        if instance.claim_id in pending or (instance.launch_token and instance.launch_token in launching):
            continue  # launched for a claim whose launch is being recorded: the fleet keeps it or ends it
        if instance.launched_at is None or now - instance.launched_at < grace:
            continue
        out.leaked.append(instance)
    present = {i.instance_id for i in instances if i.serving}
    for claim in live:
        if claim.state in _HAS_INSTANCE and claim.instance_id and claim.instance_id not in present:
            if now - launched_at(claim) >= grace:
                out.gone.append(claim)
    listed = {i.instance_id for i in instances}
    out.ended = [i.instance_id for i in instances if i.terminated]
    out.unlisted = sorted({c.instance_id for c in out.gone if c.instance_id and c.instance_id not in listed})
    return out

"""Claims in flight whose pods no longer wait for them: every pod they were made for started on another node
since, or is gone.

A claim records the pods it was bought for, and the packer counts their requests as taken on it until its node
comes (`REQUESTS_ATTRIBUTE`): that is what keeps a burst from buying a second node for the same pods. But
kube-scheduler binds a pending pod to whichever node has room first — room that freed on a node already up
when a pod there ended, or another claim's node that came sooner — and the owner may delete a pod while it
waits. The claim then boots for nothing, and its room, still counted as taken, makes the packer buy yet
another node for the next pod that would have fitted it. On the shared-GPU trace (gpushare80, seed 0) 1,015
of ours-no-prediction's 2,466 launches lost every pod they were made for before their node was Ready, and
138 launches were bought while such a claim of the same pool, big enough, was still booting.

Karpenter has no such record: its scheduler places the pods still pending on the NodeClaims in flight each
time it runs, so a NodeClaim whose pods bound elsewhere is free room for the next ones. This module finds
those claims, so the reconcile step can give their room back (`services.reconcile`).

Two rules keep the room of pods that still need it:
- only a pod that *started* after the claim was made counts as placed elsewhere (`started_since`, on
  `ClusterPod.started_at`, the pod's `status.startTime`): the replacements consolidation and the interruption
  function plan for a doomed node's pods list pods still running there, which started before the replacement
  claim and wait for it (the interruption function's plan asks the same question the other way round: a claim
  made before such a pod started is not its replacement);
- only a claim last written before the pods were listed, by `LIST_MARGIN`, counts a pod missing from the list as
  gone: a pod created after the list and planned at once (on a new claim, or added to one in flight) is not in
  it, but it is on a claim written since.

A claim keeps its pods while any one of them still waits for it (pending, or on its own node already); held
room (`HELD_ATTRIBUTE`, for evicted pods' successors), warm holds and gangs are left alone.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from gpu_autoscaler.models.claims import IN_FLIGHT_STATES

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime

    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.cluster import ClusterPod

__all__ = ["LIST_MARGIN", "orphaned_claims", "started_since"]

LIST_MARGIN = timedelta(minutes=1)
"""How long before the pod list a claim must have been last written for its pods' absence from that list to mean
they are gone: the list is taken before the clock is read, and a pod created meanwhile could be planned before
it is listed."""


def orphaned_claims(claims: Iterable[NodeClaim], pods: Sequence[ClusterPod], now: datetime,
                    instance_nodes: Mapping[str, str]) -> list[NodeClaim]:
    """The claims in flight (Pending, Launched) that list pods, none of which waits for them any more: each
    started on another node since the claim was made, or (the claim last written `LIST_MARGIN` before `now` or
    earlier) is missing from `pods`, the cluster's pods as listed just before `now`. `instance_nodes`: instance
    id → Node name, the nodes that joined (a Launched claim's node may join before it is marked Registered)."""
    by_uid = {p.uid: p for p in pods}
    found = []
    for claim in claims:
        if claim.state not in IN_FLIGHT_STATES or not claim.pods or claim.gang or claim.warm:
            continue
        own_node = instance_nodes.get(claim.instance_id) if claim.instance_id else None
        listed_long_after = (claim.updated_at or claim.created_at) <= now - LIST_MARGIN
        if all(_no_longer_waits(by_uid.get(uid), claim.created_at, own_node, listed_long_after)
               for uid in claim.pods):
            found.append(claim)
    return found


def _no_longer_waits(pod: ClusterPod | None, made: datetime, own_node: str | None, listed_long_after: bool) -> bool:
    if pod is None:
        return listed_long_after
    if pod.node_name is None or pod.node_name == own_node:
        return False
    return started_since(pod.started_at, made)


def started_since(started_at: datetime | None, made: datetime) -> bool:
    """Whether a running pod started after a claim listing it was made: it was bound elsewhere, and the claim's
    room is another pod's. A pod that started before was running when the claim was made for it: a
    replacement it waits for. Unknown start (None): not since."""
    return started_at is not None and started_at >= made

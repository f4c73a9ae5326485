"""Draining a node: which pods to evict, hold or delete, when it is done, and when to look again.

Pure: a node, its pods, the `DrainRequest` and the time in; a `DrainStep` out, then a `Continuation` once the
step's evictions have been tried. The drain service acts on these; the simulator can too.

The rules, as Karpenter's termination controller applies them (kubernetes-sigs/karpenter
`pkg/controllers/node/termination/terminator/`, `pkg/utils/pod/scheduling.go`):

- The drain waits for every pod of the node except mirror (static) pods, finished pods (Succeeded, Failed),
  pods that tolerate the drain taint (they may stay: a DaemonSet tolerating everything, a node agent) and pods
  stuck terminating (`deletionTimestamp` — the end of their grace period — more than `STUCK_TERMINATING` ago:
  their kubelet is gone, the pod garbage collector removes them with the Node).
- A terminating pod is never evicted again: it is on its way out.
- Evictions go in tiers, each only once the one before is gone: non-critical pods, non-critical DaemonSet pods,
  critical pods (priority class `system-cluster-critical` / `system-node-critical`), critical DaemonSet pods —
  Kubernetes' graceful node shutdown order, so a node's logging and networking outlive its workloads.
- `karpenter.sh/do-not-disrupt` (on a pod: `"true"` or a duration since the pod started; on the Node:
  `"true"`) makes a voluntary drain leave the node alone if it has not started — on a pod, not an eventual one
  (drift with a `terminationGracePeriod`, Karpenter's Eventual class); a started drain, or an involuntary or
  eventual one, holds such pods — it neither evicts nor deletes them until their deletion time.
- Replacement first: while a replacement is not initialized and `wait_until` has not come, wait, node
  untouched. A voluntary drain whose replacement failed, or is still not initialized at the deadline, leaves the
  node alone: without the replacement its pods would have nowhere to go.
- Evictions go through the Eviction API; a 429 (PodDisruptionBudget) is retried with exponential backoff.
- Deletion (bypassing budgets and do-not-disrupt) has a node termination time: an involuntary (or forced)
  drain's deadline, or a voluntary drain's `cordonedAt + terminationGracePeriod`; a voluntary drain without a
  termination grace period never deletes. Each pod is deleted at that time minus its own
  `terminationGracePeriodSeconds`, so its grace ends no later than the node; at the time itself what remains is
  deleted and the node goes.
- Once no pod is left to wait for, the node still stays while VolumeAttachments of its volumes are not detached
  (until the node's termination time, if it has one) and before `terminate_after` (the moment AWS reclaims a
  Spot instance); then the instance is terminated through the fleet and the Node object deleted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

from gpu_autoscaler.models.taints import Taint

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod, EvictionOutcome, VolumeAttachment
    from gpu_autoscaler.models.messages import DrainRequest

__all__ = [
    "BACKOFF_BASE",
    "DRAIN_TAINT",
    "LOAD_BALANCER_EXCLUSION",
    "MAX_BACKOFF",
    "MAX_DELAY",
    "REPLACEMENT_POLL",
    "SETTLE",
    "STUCK_TERMINATING",
    "VOLUME_POLL",
    "Continuation",
    "DrainAction",
    "DrainStep",
    "Replacements",
    "continuation",
    "drainable",
    "eviction_tiers",
    "hold_termination",
    "is_drained_by_us",
    "movable",
    "plan_drain",
    "protected_pods",
    "termination_time",
    "voluntary_refusal",
]

DRAIN_TAINT = Taint(key="gpu-autoscaler/disrupted", value="", effect="NoSchedule")
"""Ours, like Karpenter's `karpenter.sh/disrupted:NoSchedule`: put on a node when consolidation chooses it (so no
new pod lands there while it is re-validated and its replacements boot) and kept by its drain, which also sets
`spec.unschedulable`. Pods that tolerate it are left on the node."""

LOAD_BALANCER_EXCLUSION = ("node.kubernetes.io/exclude-from-external-load-balancers", "gpu-autoscaler")
"""The label (key, our value) a cordon sets in the same patch as the taint: neither `spec.unschedulable` nor a
taint of ours takes a node out of a LoadBalancer Service's targets, this label does (kubernetes/cloud-provider
controllers/service/controller.go `nodeIncludedPredicate`; aws-load-balancer-controller's traffic-proxy node
selector). Karpenter's terminator sets it for that reason (terminator.go: no 500s from a node draining); like
NTH (`removeLabelIfValueMatches`), a label already there is left as it is and only ours is taken off again."""

BACKOFF_BASE = timedelta(seconds=5)
MAX_BACKOFF = timedelta(seconds=60)
"""Refused evictions are retried at least once a minute: a budget that lets go is noticed within a minute, and
a retry is one cheap invocation."""
MAX_DELAY = timedelta(seconds=900)
"""SQS's largest DelaySeconds: a drain never sleeps longer between two looks, however long the PDB wait."""
SETTLE = timedelta(seconds=2)
"""After evictions went through: time for the pods to terminate before looking again."""
REPLACEMENT_POLL = timedelta(seconds=20)
VOLUME_POLL = timedelta(seconds=5)
STUCK_TERMINATING = timedelta(minutes=1)
"""Past its `deletionTimestamp` by this much, a terminating pod counts as gone (Karpenter's `IsStuckTerminating`)."""


class Replacements(StrEnum):
    """Where the capacity a drain waits for stands."""

    READY = "ready"
    """None asked for, or every one Registered with an initialized node."""
    WAITING = "waiting"
    FAILED = "failed"
    """One ended (or vanished) before it was ever Registered: a voluntary drain has lost its reason to go on."""


class DrainAction(StrEnum):
    ABANDON = "abandon"
    """Voluntary, not started, and the node (or a pod on it) is do-not-disrupt: leave it as it is."""
    WAIT = "wait"
    """Not yet: a replacement is not initialized, volumes are still attached, or AWS has not reclaimed the node."""
    EVICT = "evict"
    FINISH = "finish"
    """Nothing left to wait for, or past the termination time: delete what remains, terminate, delete the Node."""


@dataclass(frozen=True)
class DrainStep:
    action: DrainAction
    reason: str
    cordon: bool = False
    """Mark the node unschedulable and taint it: the drain starts now."""
    evict: tuple[ClusterPod, ...] = ()
    delete: tuple[ClusterPod, ...] = ()
    """Deleted, bypassing budgets and do-not-disrupt: their deletion time has come."""
    delete_grace: int | None = None
    """Grace period (seconds) for those deletions: what is left until the node's termination time."""
    held: tuple[ClusterPod, ...] = ()
    """do-not-disrupt pods the drain waits for without evicting them."""
    skipped: tuple[ClusterPod, ...] = ()
    """Pods the drain does not wait for: mirror, finished, tolerating the drain taint, stuck terminating."""
    poll: timedelta | None = None
    """WAIT: how often to look (None: `REPLACEMENT_POLL`)."""
    until: datetime | None = None
    """Look again no later than this (a WAIT's end, the next pod's deletion time)."""


@dataclass(frozen=True)
class Continuation:
    """The drain is not finished: look again after `delay` with `request` (its attempt and backoff moved on)."""

    request: DrainRequest
    delay: timedelta


def movable(pod: ClusterPod) -> bool:
    """A pod that needs room elsewhere when its node goes (Karpenter's `IsReschedulable`): not a DaemonSet pod
    (it has its place on every node), not a mirror or finished pod, and not terminating — its controller's new
    pod is pending already and reported as such — except a StatefulSet's, whose successor waits for it to go."""
    if pod.owner_kind == "DaemonSet" or pod.mirror or pod.finished:
        return False
    return pod.deletion_timestamp is None or pod.owner_kind == "StatefulSet"


def protected_pods(pods: Iterable[ClusterPod], now: datetime) -> tuple[ClusterPod, ...]:
    """The pods `karpenter.sh/do-not-disrupt` protects now among those a drain would wait for."""
    return tuple(p for p in pods if drainable(p, now) and p.deletion_timestamp is None and p.do_not_disrupt_active(now))


def voluntary_refusal(node: ClusterNode, protected: Sequence[ClusterPod]) -> str | None:
    """Why a voluntary drain that has not started leaves the node alone (`protected`: `protected_pods`), or None."""
    if node.do_not_disrupt:
        return f"node {node.name} is do-not-disrupt"
    if protected:
        return f"do-not-disrupt pods {', '.join(p.key for p in protected)}"
    return None


def _tolerates_drain(pod: ClusterPod) -> bool:
    return any(t.tolerates(DRAIN_TAINT) for t in pod.tolerations)


def drainable(pod: ClusterPod, now: datetime) -> bool:
    """A pod the drain must see gone before the node can go (Karpenter's `IsWaitingEviction`)."""
    if pod.mirror or pod.finished or _tolerates_drain(pod):
        return False
    return pod.deletion_timestamp is None or now - pod.deletion_timestamp <= STUCK_TERMINATING


def eviction_tiers(pods: Iterable[ClusterPod]) -> list[tuple[ClusterPod, ...]]:
    """Non-critical, non-critical DaemonSet, critical, critical DaemonSet: the order pods leave a node."""
    tiers: list[list[ClusterPod]] = [[], [], [], []]
    for pod in pods:
        tiers[2 * pod.critical + (pod.owner_kind == "DaemonSet")].append(pod)
    return [tuple(t) for t in tiers]


def is_drained_by_us(node: ClusterNode) -> bool:
    """Cordoned by a drain: unschedulable and carrying our taint (the taint alone is consolidation's mark)."""
    return node.unschedulable and any(t.key == DRAIN_TAINT.key and t.effect == DRAIN_TAINT.effect
                                      for t in node.taints)


def termination_time(request: DrainRequest, now: datetime | None = None) -> datetime | None:
    """When the node goes whatever its pods say: an involuntary (or forced) drain's deadline; a voluntary one's
    `cordonedAt + terminationGracePeriod` (once cordoned; `now` stands in for a drain cordoning now); else None."""
    if request.involuntary or request.force:
        return request.deadline
    if request.termination_grace_period is None:
        return None
    cordoned = request.cordoned_at or now
    return cordoned + request.termination_grace_period if cordoned is not None else None


def _deletion_due(pod: ClusterPod, node_time: datetime, now: datetime) -> bool:
    """Karpenter's `needsForceDelete`: a pod not yet terminating is deleted once its own grace period would run
    past the node's termination time; a terminating one again only if its grace ends after it."""
    if pod.deletion_timestamp is not None:
        return pod.deletion_timestamp > max(node_time, now) + timedelta(seconds=1)
    return now >= node_time - timedelta(seconds=pod.termination_grace_period_seconds)


def _grace(node_time: datetime, now: datetime) -> int:
    return max(1, math.ceil((node_time - now).total_seconds()))


def plan_drain(request: DrainRequest, node: ClusterNode | None, pods: Iterable[ClusterPod], now: datetime,
               *, replacements: Replacements = Replacements.READY) -> DrainStep:
    """One look at the node, given where its replacements are."""
    if node is None:
        return DrainStep(DrainAction.FINISH, "node is gone")
    pods = list(pods)
    waiting = tuple(p for p in pods if drainable(p, now))
    skipped = tuple(p for p in pods if p not in waiting)
    voluntary = not request.involuntary and not request.force
    started = is_drained_by_us(node)
    protected = protected_pods(waiting, now)
    if voluntary and not started:
        # An eventual drain has a termination time that ends the hold: only the Node's annotation refuses it.
        eventual = request.eventual and request.termination_grace_period is not None
        refused = voluntary_refusal(node, () if eventual else protected)
        if refused is not None:
            return DrainStep(DrainAction.ABANDON, f"voluntary drain refused: {refused}", skipped=skipped,
                             held=protected)
        if now >= request.deadline and waiting and replacements is not Replacements.READY:
            return DrainStep(DrainAction.ABANDON, "replacement not initialized by the deadline", skipped=skipped)
    node_time = termination_time(request, None if started else now)
    if node_time is not None and now >= node_time:
        return DrainStep(DrainAction.FINISH, "termination time reached", cordon=not started,
                         delete=tuple(p for p in waiting if _deletion_due(p, node_time, now)), delete_grace=1,
                         skipped=skipped)
    if not waiting:
        return DrainStep(DrainAction.FINISH, "node is empty", skipped=skipped)
    if replacements is Replacements.FAILED and voluntary and not started:
        return DrainStep(DrainAction.ABANDON, "replacement failed before it was initialized", skipped=skipped)
    if replacements is Replacements.WAITING and now < (request.wait_until or request.deadline):
        return DrainStep(DrainAction.WAIT, "replacement not initialized yet", skipped=skipped,
                         until=request.wait_until or request.deadline)
    due = tuple(p for p in waiting if node_time is not None and _deletion_due(p, node_time, now))
    rest = [p for p in waiting if p not in due]
    tier = next((t for t in eviction_tiers(rest) if t), ())
    active = [p for p in tier if p.deletion_timestamp is None]
    held = tuple(p for p in active if p in protected)
    evict = tuple(p for p in active if p not in protected)
    reason = "evicting" if evict or due else "holding do-not-disrupt pods" if held else "waiting for pods to terminate"
    next_due = None
    if node_time is not None:  # look again no later than the next pod's deletion time, and the node's
        times = [node_time - timedelta(seconds=p.termination_grace_period_seconds) for p in rest]
        next_due = min((t for t in times if t > now), default=node_time)
    return DrainStep(DrainAction.EVICT, reason, cordon=not started, evict=evict, held=held, skipped=skipped,
                     delete=due, delete_grace=_grace(node_time, now) if due and node_time is not None else None,
                     until=next_due)


def hold_termination(request: DrainRequest, pods: Sequence[ClusterPod], attachments: Sequence[VolumeAttachment],
                     now: datetime) -> DrainStep | None:
    """With no pod left to wait for: what still keeps the instance (a WAIT step), or None when it may go.

    VolumeAttachments of the node's volumes must be detached first (the attach/detach controller deletes them
    once their pods are gone), except those of pods that stay (tolerating the drain, stuck) and inline ones
    — Karpenter's `filterVolumeAttachments` — and no longer once the node's termination time has passed.
    A Spot node is not terminated before AWS reclaims it (`terminate_after`)."""
    node_time = termination_time(request)
    staying = {f"{p.namespace}/{c}" for p in pods if not drainable(p, now) for c in p.volume_claims}
    pending = [a for a in attachments if a.persistent_volume and a.claim not in staying]
    if pending and (node_time is None or now < node_time):
        names = ", ".join(sorted(a.name for a in pending))
        return DrainStep(DrainAction.WAIT, f"waiting for VolumeAttachments to detach: {names}", poll=VOLUME_POLL,
                         until=node_time)
    if request.terminate_after is not None and now < request.terminate_after:
        return DrainStep(DrainAction.WAIT, f"AWS reclaims the instance at {request.terminate_after.isoformat()}",
                         poll=request.terminate_after - now, until=request.terminate_after)
    return None


def continuation(request: DrainRequest, step: DrainStep, outcomes: Sequence[EvictionOutcome],
                 now: datetime) -> Continuation:
    """When to look again after a WAIT or EVICT step: never past the node's termination time (at which it
    goes), nor past the next pod's deletion time."""
    backoff = request.backoff
    if step.action is DrainAction.WAIT:
        delay = step.poll or REPLACEMENT_POLL
    else:
        progressed = any(o.evicted or o.gone for o in outcomes) or bool(step.delete)
        refused = any(o.blocked for o in outcomes) or bool(step.held)
        if progressed:
            backoff, delay = 0, SETTLE
        elif refused:
            delay = min(BACKOFF_BASE * (2 ** min(backoff, 10)), MAX_BACKOFF)
            backoff += 1
        else:
            delay = SETTLE
    if step.until is not None:
        delay = min(delay, max(step.until - now, timedelta(0)))
    cordoned = request.cordoned_at
    if cordoned is None and step.action is DrainAction.EVICT:
        cordoned = now
    moved = request.model_copy(update={"attempt": request.attempt + 1, "backoff": backoff,
                                       "started_at": request.started_at or now, "cordoned_at": cordoned})
    node_time = termination_time(moved)
    if node_time is not None:
        delay = min(delay, max(node_time - now, timedelta(0)))
    delay = min(delay, MAX_DELAY)
    delay = timedelta(seconds=max(1, math.ceil(delay.total_seconds())))
    return Continuation(moved, delay)

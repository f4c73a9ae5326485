"""Draining a node: which pods to evict, skip, hold or delete, when it is done, and when to look again.

Pure: a node, its pods, the `DrainRequest` and the time in; a `DrainStep` out, then a `Continuation` once the
step's evictions have been tried. The drain service acts on these; the simulator can too.

The rules, as Kubernetes' `kubectl drain` and Karpenter's termination controller apply them:

- DaemonSet pods and mirror (static) pods are never evicted: their controller would put them straight back,
  and they go with the node. Pods that have finished (Succeeded, Failed) hold nothing.
- A voluntary drain (consolidation, rebalance, scheduled change) that is not forced leaves a node alone if a
  pod on it carries `karpenter.sh/do-not-disrupt: "true"` when the drain would start. If such a pod appears
  after the drain started, it is held, not evicted, until the deadline.
- An involuntary drain (Spot, capacity reservation) evicts do-not-disrupt pods too: the node goes anyway.
- Replacement first: while a replacement is not Ready and `wait_until` has not come, wait, node untouched. A
  voluntary drain whose replacement failed, or is still not Ready at the deadline, leaves the node alone:
  without the replacement its pods would have nowhere to go.
- Evictions go through the Eviction API; a 429 (PodDisruptionBudget) is retried with exponential backoff.
- At the deadline, what remains is deleted (no PDB), and the node goes: the instance terminated through the
  fleet, the Node object deleted. An empty node goes at once.
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

    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod, EvictionOutcome
    from gpu_autoscaler.models.messages import DrainRequest

__all__ = [
    "BACKOFF_BASE",
    "DRAIN_TAINT",
    "MAX_BACKOFF",
    "MAX_DELAY",
    "REPLACEMENT_POLL",
    "SETTLE",
    "Continuation",
    "DrainAction",
    "DrainStep",
    "Replacements",
    "continuation",
    "is_drained_by_us",
    "movable",
    "plan_drain",
]

DRAIN_TAINT = Taint(key="gpu-autoscaler/disrupted", value="", effect="NoSchedule")
"""Ours, next to `spec.unschedulable`: says who cordoned the node, and that a drain has started."""

BACKOFF_BASE = timedelta(seconds=5)
MAX_BACKOFF = timedelta(seconds=60)
"""Refused evictions are retried at least once a minute: a budget that lets go is noticed within a minute, and
a retry is one cheap invocation."""
MAX_DELAY = timedelta(seconds=900)
"""SQS's largest DelaySeconds: a drain never sleeps longer between two looks, however long the PDB wait."""
SETTLE = timedelta(seconds=2)
"""After evictions went through: time for the pods to terminate before looking again."""
REPLACEMENT_POLL = timedelta(seconds=20)

_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


class Replacements(StrEnum):
    """Where the capacity a drain waits for stands."""

    READY = "ready"
    """None asked for, or every one Registered with a Ready node."""
    WAITING = "waiting"
    FAILED = "failed"
    """One ended (or vanished) before it was ever Registered: a voluntary drain has lost its reason to go on."""


class DrainAction(StrEnum):
    ABANDON = "abandon"
    """Voluntary, not forced, and the node runs a do-not-disrupt pod: leave it as it is."""
    WAIT = "wait"
    """A replacement is not Ready yet and `wait_until` has not come: look again later."""
    EVICT = "evict"
    FINISH = "finish"
    """Empty (of pods that matter) or past the deadline: delete what remains, terminate, delete the Node."""


@dataclass(frozen=True)
class DrainStep:
    action: DrainAction
    reason: str
    cordon: bool = False
    """Mark the node unschedulable and taint it: the drain starts now."""
    evict: tuple[ClusterPod, ...] = ()
    delete: tuple[ClusterPod, ...] = ()
    held: tuple[ClusterPod, ...] = ()
    """do-not-disrupt pods a started voluntary drain waits for."""
    skipped: tuple[ClusterPod, ...] = ()
    """DaemonSet, mirror and finished pods: left to go with the node."""


@dataclass(frozen=True)
class Continuation:
    """The drain is not finished: look again after `delay` with `request` (its attempt and backoff moved on)."""

    request: DrainRequest
    delay: timedelta


def movable(pod: ClusterPod) -> bool:
    """A pod the drain must move off the node before it can go."""
    return pod.owner_kind != "DaemonSet" and not pod.mirror and pod.phase not in _FINISHED_PHASES


def is_drained_by_us(node: ClusterNode) -> bool:
    return any(t.key == DRAIN_TAINT.key and t.effect == DRAIN_TAINT.effect for t in node.taints)


def plan_drain(request: DrainRequest, node: ClusterNode | None, pods: Iterable[ClusterPod], now: datetime,
               *, replacements: Replacements = Replacements.READY) -> DrainStep:
    """One look at the node, given where its replacements are."""
    if node is None:
        return DrainStep(DrainAction.FINISH, "node is gone")
    pods = list(pods)
    moving = tuple(p for p in pods if movable(p))
    skipped = tuple(p for p in pods if not movable(p))
    voluntary = not request.involuntary and not request.force
    protected = tuple(p for p in moving if p.do_not_disrupt) if voluntary else ()
    started = is_drained_by_us(node)
    if protected and not started:
        names = ", ".join(p.key for p in protected)
        return DrainStep(DrainAction.ABANDON, f"voluntary drain refused: do-not-disrupt pods {names}",
                         skipped=skipped, held=protected)
    if now >= request.deadline:
        if voluntary and not started and moving and replacements is not Replacements.READY:
            return DrainStep(DrainAction.ABANDON, "replacement not Ready by the deadline", skipped=skipped)
        return DrainStep(DrainAction.FINISH, "deadline passed", cordon=not started, delete=moving, skipped=skipped)
    if not moving:
        return DrainStep(DrainAction.FINISH, "node is empty", skipped=skipped)
    if replacements is Replacements.FAILED and voluntary and not started:
        return DrainStep(DrainAction.ABANDON, "replacement failed before it was Ready", skipped=skipped)
    if replacements is Replacements.WAITING and now < (request.wait_until or request.deadline):
        return DrainStep(DrainAction.WAIT, "replacement not Ready yet", skipped=skipped)
    evict = tuple(p for p in moving if p not in protected)
    reason = "evicting" if evict else "holding do-not-disrupt pods"
    return DrainStep(DrainAction.EVICT, reason, cordon=not started, evict=evict, held=protected, skipped=skipped)


def continuation(request: DrainRequest, step: DrainStep, outcomes: Sequence[EvictionOutcome],
                 now: datetime) -> Continuation:
    """When to look again after a WAIT or EVICT step, never past the deadline (at which the node goes)."""
    backoff = request.backoff
    if step.action is DrainAction.WAIT:
        delay = REPLACEMENT_POLL
        wait_until = request.wait_until or request.deadline
        delay = min(delay, max(wait_until - now, timedelta(0)))
    else:
        progressed = any(o.evicted or o.gone for o in outcomes)
        refused = any(o.blocked for o in outcomes) or bool(step.held)
        if progressed:
            backoff, delay = 0, SETTLE
        elif refused:
            delay = min(BACKOFF_BASE * (2 ** min(backoff, 10)), MAX_BACKOFF)
            backoff += 1
        else:
            delay = SETTLE
    delay = min(delay, MAX_DELAY, max(request.deadline - now, timedelta(0)))
    delay = timedelta(seconds=max(1, math.ceil(delay.total_seconds())))
    moved = request.model_copy(update={"attempt": request.attempt + 1, "backoff": backoff,
                                       "started_at": request.started_at or now})
    return Continuation(moved, delay)

"""What the server side can tell of the in-cluster agent without it: the pods the agent must have reported by now.

The agent reports each unbound GPU pod the scheduler found no node for at once, and again every resync window (60 s
by default): its rule is `gpu_autoscaler_agent.selection.PodSelector.reportable`, its resync
`gpu_autoscaler_agent.dispatcher.Dispatcher.tick`. With no such pod it sends nothing, so an agent that is not
installed, crash-loops or is refused by SQS looks exactly like a quiet cluster: an empty queue, which publishes no
metrics at all once idle ("Available CloudWatch metrics for Amazon SQS", SQS developer guide). The consolidate tick
lists the cluster's pods each minute anyway; it counts those the agent must have been reporting for a while, and an
alarm weighs that count against what reached the pending-pods queue (`infra.monitoring`).

Counted here is a subset of what the agent reports, never more: a GPU asked for in the pod's requests (the agent
also takes a GPU pool's toleration, a Dynamic Resource Allocation claim, and limits alone), and a pod waiting on a
preemption (`status.nominatedNodeName`, which the agent leaves out) is not told apart, a case lasting seconds.
A pod counted that the agent would not report could raise the alarm while the agent is well; one it reports that
is not counted only makes the witness blind to it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from gpu_autoscaler.models.resources import is_gpu_resource

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from gpu_autoscaler.models.cluster import ClusterPod

__all__ = ["AGENT_REPORTS_WITHIN", "awaiting_report"]

AGENT_REPORTS_WITHIN = timedelta(minutes=3)
"""Three of the agent's default resync windows: a pod unbound this long (an unbound pod has been pending since its
creation) has been in at least two of its reports, even if the scheduler marked it unschedulable late."""


def awaiting_report(pods: Iterable[ClusterPod], now: datetime) -> list[ClusterPod]:
    """Unbound, Pending, not terminating, no DaemonSet's, marked unschedulable by the scheduler, asking for a GPU,
    and created `AGENT_REPORTS_WITHIN` ago or more."""
    return [
        pod for pod in pods
        if pod.node_name is None and pod.phase == "Pending" and not pod.terminating and pod.owner_kind != "DaemonSet"
        and pod.unschedulable and pod.created_at is not None and now - pod.created_at >= AGENT_REPORTS_WITHIN
        and any(is_gpu_resource(name) and amount > 0 for name, amount in pod.requests.as_dict().items())
    ]

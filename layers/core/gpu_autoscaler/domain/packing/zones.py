"""Where a pod may go beyond its node selector: its volumes' zones, its zone spread, its anti-affinity.

Both become plain zone requirements on the pod (a copy, same uid), so everything downstream — offering masks,
candidates, claims' zones, reasons ("… in us-east-1a") — treats them as if the pod had selected the zone:

- `volumeZones` (the zones its persistent volumes can be attached in: an EBS volume lives in one) is ANDed into
  every node affinity term, as kube-scheduler's VolumeBinding filter requires of the node;
- a `DoNotSchedule` zone spread constraint shares the pods that carry it out over the zones that can hold
  them, each pod pinned to one, levelling from the counts the agent reported (water-filling keeps the skew
  at most one, within any `maxSkew`). Gang members are not spread: a gang is placed whole in one zone.

Required pod anti-affinity on the node (`kubernetes.io/hostname`) among pods the term matches becomes a request
of one unit of a resource every node has one of (`one_per_node`), so no plan puts two of them on one node.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import TYPE_CHECKING

from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.requirements import NodeSelectorTerm, Requirement

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from gpu_autoscaler.models.pods import PendingPod

__all__ = ["ONE_PER_NODE_PREFIX", "SPREAD_KEYS", "one_per_node", "pin_to_zones", "spread_over_zones", "spreads",
           "with_volume_zones"]

SPREAD_KEYS = frozenset({L.ZONE, "topology.ebs.csi.aws.com/zone"})
HOSTNAME = "kubernetes.io/hostname"
ONE_PER_NODE_PREFIX = "gpu-autoscaler/one-per-node-"


def one_per_node(pod: PendingPod) -> dict[str, int]:
    """One unit of the pod's anti-affinity group (namespace and selector) per hostname-keyed term."""
    out = {}
    for term in pod.pod_anti_affinity:
        if term.topology_key == HOSTNAME:
            text = json.dumps([pod.namespace, term.label_selector], sort_keys=True)
            out[ONE_PER_NODE_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:12]] = 1
    return out


def pin_to_zones(pod: PendingPod, zones: Iterable[str]) -> PendingPod:
    """The pod with `zone In zones` added to each of its node affinity terms (or as the only term)."""
    requirement = Requirement(key=L.ZONE, operator="In", values=tuple(sorted(set(zones))))
    terms = pod.required_node_affinity or (NodeSelectorTerm(match_expressions=()),)
    pinned = tuple(NodeSelectorTerm(match_expressions=(*t.match_expressions, requirement)) for t in terms)
    return pod.model_copy(update={"required_node_affinity": pinned})


def with_volume_zones(pods: Sequence[PendingPod]) -> list[PendingPod]:
    """Pods whose volumes constrain the zone, pinned to those zones (others unchanged)."""
    return [pin_to_zones(p, p.volume_zones) if p.volume_zones is not None else p for p in pods]


def spreads(pod: PendingPod) -> bool:
    return pod.pod_group is None and any(
        s.topology_key in SPREAD_KEYS and s.when_unsatisfiable == "DoNotSchedule" for s in pod.topology_spread)


def spread_over_zones(pods: Sequence[PendingPod], zones_for: Callable[[PendingPod], Sequence[str]]) -> list[PendingPod]:
    """Each spreading pod pinned to one zone, in turn to the zone with fewest (reported + already pinned) pods
    of its group; a group is the pods that share the constraints and the zones they may use."""
    counts: dict[tuple[object, ...], dict[str, int]] = defaultdict(dict)
    out = []
    for pod in pods:
        if not spreads(pod):
            out.append(pod)
            continue
        zones = sorted(zones_for(pod))
        if not zones:
            out.append(pod)  # nowhere to go: left as is, and the reason says why
            continue
        group = (pod.namespace, tuple((s.topology_key, s.max_skew) for s in pod.topology_spread), tuple(zones))
        seen = counts[group]
        if not seen:
            reported = [s.zone_counts for s in pod.topology_spread if s.topology_key in SPREAD_KEYS]
            for zone in zones:
                seen[zone] = max((c.get(zone, 0) for c in reported), default=0)
        zone = min(zones, key=lambda z: (seen[z], z))
        seen[zone] += 1
        out.append(pin_to_zones(pod, (zone,)))
    return out

"""Where a pod may go beyond its node selector: its volumes' zones, its spread, its pod (anti-)affinity, its host
ports.

These become plain zone requirements on the pod (a copy, same uid), so everything downstream — offering masks,
candidates, claims' zones, reasons ("… in us-east-1a") — treats them as if the pod had selected the zone:

- `volumeZones` (the zones its persistent volumes can be attached in: an EBS volume lives in one) is ANDed into
  every node affinity term, as kube-scheduler's VolumeBinding filter requires of the node;
- a `DoNotSchedule` zone spread constraint shares the pods that carry it out over the zones that can hold
  them, each pod pinned to one, levelling from the counts the agent reported (water-filling keeps the skew
  at most one, within any `maxSkew`). Gang members are not spread: a gang is placed whole in one zone;
- required pod anti-affinity on the zone among pods the term matches gives each pod a zone of its own where none
  of its group runs; a pod for which no such zone is left is unschedulable, with the reason;
- required pod affinity keeps a pod to the zones where the pods it selects run (`affine_over_zones`).

Rules that cap how many pods of a group one node takes become a resource every node has `PER_NODE_UNITS` of, a
pod capped at m per node asking `PER_NODE_UNITS // m` of it (`per_node`): required pod anti-affinity on the node
(`kubernetes.io/hostname`) among pods the term matches (1 per node), and a `DoNotSchedule` spread on the node
(`maxSkew` per node: a new node holds none of the group, so kube-scheduler's global minimum is 0 there; Karpenter
assumes the same, "Because Karpenter can always create a new domain for hostname, we assume the global minimum is
always zero", pkg/controllers/provisioning/scheduling/topologygroup.go). A group is its namespaces and selector; a
pod under two rules of one group asks the larger share, so the stricter cap holds.

Host ports are such groups too (kube-scheduler's NodePorts filter; Karpenter's pkg/scheduling/hostportusage.go): one
pod per port and protocol on every address (0.0.0.0), while pods on distinct single addresses may share a node. A pod
on every address asks all of its (port, protocol) group; one on a single address asks 1 unit of it and all of its
(port, protocol, address) group: two on one address, or one on it and one on every address, never fit together.
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

    from gpu_autoscaler.models.pods import PendingPod, PodAffinity, PodAntiAffinity

__all__ = ["PER_NODE_PREFIX", "PER_NODE_UNITS", "SPREAD_KEYS", "affine_over_zones", "apart_groups", "apart_over_zones",
           "per_node", "pin_to_zones", "place_over_zones", "repels_in_zones", "spread_over_zones", "spreads",
           "with_volume_zones"]

SPREAD_KEYS = frozenset({L.ZONE, "topology.ebs.csi.aws.com/zone"})
PER_NODE_PREFIX = "gpu-autoscaler/per-node-"
PER_NODE_UNITS = 720_720
"""What every node has of each per-node resource: divisible by 1 to 16, so a cap of m per node is exact there, and
`PER_NODE_UNITS // (PER_NODE_UNITS // m)` is still m up to `MAX_PER_NODE`."""
MAX_PER_NODE = 800
"""Caps above it are taken as it: no node holds that many pods (kubelet's `maxPods` stays within a few hundred)."""


def per_node(pod: PendingPod) -> dict[str, int]:
    """The pod's share of each per-node resource its rules cap (see the module's docstring)."""
    out: dict[str, int] = {}

    def cap(group: object, most: int) -> None:
        name = _name(group)
        out[name] = max(out.get(name, 0), PER_NODE_UNITS // min(most, MAX_PER_NODE))

    for term in pod.pod_anti_affinity:
        if term.topology_key == L.HOSTNAME:
            cap(_group(pod, term), 1)
    for spread in pod.topology_spread:
        if spread.topology_key == L.HOSTNAME and spread.when_unsatisfiable == "DoNotSchedule" \
                and spread.label_selector is not None:
            cap([[pod.namespace], spread.label_selector], spread.max_skew)
    for port in pod.host_ports:
        group = ["host-port", port.port, port.protocol]
        if port.host_ip in ("", "0.0.0.0"):
            cap(group, 1)
        else:
            out[_name(group)] = max(out.get(_name(group), 0), 1)
            cap([*group, port.host_ip], 1)
    return out


def apart_groups(pod: PendingPod) -> frozenset[str]:
    """The per-node resources of its anti-affinity terms on the node: two pods that share one never share a node."""
    return frozenset(_name(_group(pod, t)) for t in pod.pod_anti_affinity if t.topology_key == L.HOSTNAME)


def _group(pod: PendingPod, term: PodAntiAffinity | PodAffinity) -> list[object]:
    """The pods a pod (anti-)affinity term counts: its namespaces (every one: "*") and its selector."""
    spaces = ["*"] if term.namespace_selector is not None else sorted(set(term.namespaces)) or [pod.namespace]
    return [spaces, term.label_selector]


def _name(group: object) -> str:
    return PER_NODE_PREFIX + hashlib.sha256(json.dumps(group, sort_keys=True).encode()).hexdigest()[:12]


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


def repels_in_zones(pod: PendingPod) -> bool:
    return pod.pod_group is None and any(t.topology_key in SPREAD_KEYS for t in pod.pod_anti_affinity)


Refused = list[tuple["PendingPod", str]]
"""Pods no zone can take, each with the reason."""


def place_over_zones(pods: Sequence[PendingPod],
                     zones_for: Callable[[PendingPod], Sequence[str]]) -> tuple[list[PendingPod], Refused]:
    """Pods repelling their group in a zone each given a zone of their own (`apart_over_zones`), then spreading pods
    levelled over zones (`spread_over_zones`); those no zone can take, with the reason."""
    beside, unmet = affine_over_zones(pods, zones_for)
    apart, refused = apart_over_zones(beside, zones_for)
    spread, beyond = spread_over_zones(apart, zones_for)
    return spread, unmet + refused + beyond


def affine_over_zones(pods: Sequence[PendingPod],
                      zones_for: Callable[[PendingPod], Sequence[str]]) -> tuple[list[PendingPod], Refused]:
    """Pods with required pod affinity where kube-scheduler's InterPodAffinity will let them run (Karpenter:
    `nextDomainAffinity`, scheduling/topologygroup.go): on the zone, pinned to the zones where a pod the term
    selects runs, or, for a group that selects itself and runs nowhere yet, all to one zone; on the node, nowhere new
    when such a pod runs (its node is not ours to buy), else the first of a group that selects itself alone (the
    others join its node once it runs). A term that selects only pods that do not run yet cannot be met now."""
    chosen: dict[str, str] = {}
    first: set[str] = set()
    out: list[PendingPod] = []
    refused: Refused = []
    for pod in pods:
        if not pod.pod_affinity or not zones_for(pod):
            out.append(pod)  # no rule, or nowhere to go: left as is, and the reason says why
            continue
        allowed = set(zones_for(pod))
        why: str | None = None
        leads: list[str] = []
        pins: list[str] = []
        for term in pod.pod_affinity:
            group = json.dumps(_group(pod, term), sort_keys=True)
            why = _unmet(term, group, first)
            if why is not None:
                break
            running = {z for z, n in term.zone_counts.items() if n > 0}
            if term.topology_key == L.HOSTNAME:
                leads.append(group)
            elif running:
                allowed &= running
            elif pod.pod_group is None:
                pins.append(group)
        if why is None and pins:
            zone = next((chosen[g] for g in pins if g in chosen), None) or min(allowed, default=None)
            if zone is None or zone not in allowed:
                why = "pod affinity: the first pod of its group is planned in another zone, where it cannot go"
            else:
                allowed = {zone}
                chosen.update(dict.fromkeys(pins, zone))
        if why is None and not allowed:
            why = "pod affinity: no zone it may use holds a pod it must share a zone with"
        if why is not None:
            refused.append((pod, why))
            continue
        first.update(leads)
        out.append(pin_to_zones(pod, allowed) if allowed != set(zones_for(pod)) else pod)
    return out, refused


def _unmet(term: PodAffinity, group: str, first: set[str]) -> str | None:
    """Why no node we launch now meets a pod affinity term (`first`: node groups whose first pod is planned)."""
    if term.topology_key == L.HOSTNAME:
        if term.nodes:
            return (f"pod affinity: it must run on a node where a pod it selects runs ({', '.join(term.nodes)}); no "
                    "new node can take it")
        if not term.self_match:
            return "pod affinity: no pod it must run beside runs yet"
        if group in first:
            return "pod affinity on the node: it joins the first pod of its group, planned now, once that one runs"
        return None
    if not any(n > 0 for n in term.zone_counts.values()) and not term.self_match:
        return "pod affinity: no pod it must share a zone with runs yet"
    return None


def apart_over_zones(pods: Sequence[PendingPod],
                     zones_for: Callable[[PendingPod], Sequence[str]]) -> tuple[list[PendingPod], Refused]:
    """Each pod with required anti-affinity on the zone pinned to a zone where no pod of its group runs (the agent's
    counts) or is pinned: kube-scheduler's InterPodAffinity refuses a node whose zone holds one (Karpenter:
    `nextDomainAntiAffinity`, scheduling/topologygroup.go). A pod every zone of which is taken can run nowhere."""
    taken: dict[str, set[str]] = {}
    out: list[PendingPod] = []
    refused: Refused = []
    for pod in pods:
        if not repels_in_zones(pod):
            out.append(pod)
            continue
        zones = sorted(zones_for(pod))
        if not zones:
            out.append(pod)  # nowhere to go: left as is, and the reason says why
            continue
        groups = []
        for term in pod.pod_anti_affinity:
            if term.topology_key in SPREAD_KEYS:
                group = json.dumps(_group(pod, term), sort_keys=True)
                taken.setdefault(group, {z for z, n in term.zone_counts.items() if n > 0})
                groups.append(group)
        free = [z for z in zones if all(z not in taken[g] for g in groups)]
        if not free:
            refused.append((pod, "zone anti-affinity: one pod of its group per zone, and every zone it may use "
                                 f"({', '.join(zones)}) has one"))
            continue
        for group in groups:
            taken[group].add(free[0])
        out.append(pin_to_zones(pod, (free[0],)))
    return out, refused


def spread_over_zones(pods: Sequence[PendingPod],
                      zones_for: Callable[[PendingPod], Sequence[str]]) -> tuple[list[PendingPod], Refused]:
    """Each spreading pod pinned to one zone, in turn to the zone with fewest (reported + already pinned) pods
    of its group; a group is the pods that share the constraints and the zones they may use.

    A zone takes a pod only while its count stays within `maxSkew` of the least count over every zone
    kube-scheduler counts: those the agent reported (0 included, where no pool may launch for it too) and those the
    pod may use; the least is 0 while they are fewer than `minDomains` (kubernetes.io, Pod Topology Spread
    Constraints; Karpenter's `domainMinCount`, scheduling/topologygroup.go). A pod no zone takes is refused."""
    counts: dict[tuple[object, ...], dict[str, int]] = defaultdict(dict)
    out: list[PendingPod] = []
    refused: Refused = []
    for pod in pods:
        if not spreads(pod):
            out.append(pod)
            continue
        zones = sorted(zones_for(pod))
        if not zones:
            out.append(pod)  # nowhere to go: left as is, and the reason says why
            continue
        group = (pod.namespace, tuple((s.topology_key, s.max_skew) for s in pod.topology_spread), tuple(zones))
        enforced = [s for s in pod.topology_spread if s.topology_key in SPREAD_KEYS
                    and s.when_unsatisfiable == "DoNotSchedule"]
        seen = counts[group]
        if not seen:
            for zone in {*zones, *(z for s in enforced for z in s.zone_counts)}:
                seen[zone] = max((s.zone_counts.get(zone, 0) for s in enforced), default=0)
        zone = min(zones, key=lambda z: (seen[z], z))
        skew = min(s.max_skew for s in enforced)
        least = min(seen.values())
        fewer = max(s.min_domains or 1 for s in enforced)
        if len(seen) < fewer:
            least = 0
        if seen[zone] + 1 - least > skew:
            refused.append((pod, _spread_reason(seen, zones, least, skew, fewer)))
            continue
        seen[zone] += 1
        out.append(pin_to_zones(pod, (zone,)))
    return out, refused


def _spread_reason(seen: dict[str, int], zones: list[str], least: int, skew: int, fewer: int) -> str:
    if len(seen) < fewer:
        why = f"{len(seen)} zones, fewer than its minDomains {fewer}"
    else:
        low = sorted(z for z, n in seen.items() if n == least)
        why = f"{' and '.join(low)} {'holds' if len(low) == 1 else 'hold'} {least} of its group and no pool can " \
              f"launch there for it"
    return f"zone spread: {why}, so a zone may hold {least + skew} (maxSkew {skew}), as {' and '.join(zones)} do"

"""Where a pending pod may go, beyond its node selector: its volumes' zones, its spread, its pod (anti-)affinity and
its host ports.

- Volumes: a pod's persistent volume claims (and generic ephemeral volumes, whose claim is `<pod>-<volume>`).
  A bound claim's PersistentVolume says where it can be attached in its `spec.nodeAffinity` (the EBS CSI driver
  writes `topology.ebs.csi.aws.com/zone`, newer versions `topology.kubernetes.io/zone`); an unbound claim of a
  `WaitForFirstConsumer` class will be provisioned where the pod lands, within the class's `allowedTopologies`.
  kube-scheduler's VolumeBinding filter requires the node to satisfy all of them, so the zones are intersected.
  (https://kubernetes.io/docs/concepts/storage/storage-classes/#volume-binding-mode, #allowed-topologies)
  Both are read by `gpu_autoscaler.models.volumes`, as the functions' cluster adapter reads bound pods' volumes.
  A claim kube-scheduler places on no node — missing (an ephemeral volume's before its controller makes it),
  being deleted, Lost, bound to a volume that does not exist, unbound without a class, or unbound of an
  `Immediate` class — makes the pod unplannable, with the reason, as Karpenter's `ValidatePersistentVolumeClaims`
  refuses it (pkg/controllers/provisioning/scheduling/volumetopology.go). A read the agent is not allowed
  (403) is an error, never taken for "no restriction".
- Spread: `topologySpreadConstraints` keyed on the zone with `whenUnsatisfiable: DoNotSchedule` are copied
  with their `minDomains` and how many matching pods already run in each zone kube-scheduler counts, 0 included:
  the zones of the nodes its inclusion policies keep (`spread_nodes`), counting the pods on those nodes
  (terminating and finished pods are not counted, as kube-scheduler does not count them; `matchLabelKeys` narrow
  the selector to the pod's own values), so new nodes even them out within `maxSkew` of the least.
  (https://kubernetes.io/docs/concepts/scheduling-eviction/topology-spread-constraints/)

- Spread on the node (`kubernetes.io/hostname`, `DoNotSchedule`) that counts the pod itself is copied with the
  selector it counts by: a new node holds none of the group, so it may take `maxSkew` of them.

- Host ports (a container's `hostPort`; every container port of a `hostNetwork` pod): one pod per port, protocol
  and address on a node (kube-scheduler's NodePorts filter).

- Anti-affinity: required pod anti-affinity terms keyed on the node (`kubernetes.io/hostname`) or the zone that
  match the pod itself are copied: no two such pods may share a node (a zone), so the packer gives each its own;
  a zone term with how many matching pods already run in each zone, where none may go.
- Affinity: required pod affinity terms keyed on the node or the zone are copied, each saying whether it selects
  the pod itself, with where the pods it selects run (per zone, or their nodes): kube-scheduler places the pod
  only beside them, or anywhere for the first of a group that selects itself when none runs.
  (https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity)

Reads are cached for a few seconds: a Deployment's replicas share their claims' class and their selector.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler.models.labels import HOSTNAME
from gpu_autoscaler.models.pod_spec import required_node_affinity, required_pod_terms
from gpu_autoscaler.models.pods import selects
from gpu_autoscaler.models.requirements import NodeSelectorTerm, terms_match
from gpu_autoscaler.models.taints import Taint, Toleration, tolerates_all
from gpu_autoscaler.models.volumes import ZONE_KEYS, persistent_volume_zones, zones_of_terms

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from datetime import datetime

    from gpu_autoscaler.clock import Clock

__all__ = ["ZONE_KEYS", "KubernetesPlacement", "VolumesUnplannable", "host_ports", "label_selector_text",
           "node_spread", "pod_affinity", "pod_anti_affinity", "selects", "spread_nodes", "spread_selector",
           "zone_spread"]

log = logging.getLogger(__name__)

_NOT_FOUND = 404


class VolumesUnplannable(Exception):
    """A volume of the pod that no node can serve: the message says which and why."""


class _ClaimPlace(NamedTuple):
    zones: frozenset[str] | None
    """Where the claim's volume can be used; None: any zone."""
    refused: str | None = None
    """Why no node can serve it (kube-scheduler would place the pod nowhere)."""


def zone_spread(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's zone spread constraints kube-scheduler enforces, as written."""
    return [dict(c) for c in spec.get("topologySpreadConstraints") or ()
            if c.get("topologyKey") in ZONE_KEYS and c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"]


def spread_nodes(spec: Mapping[str, Any], constraint: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool]:
    """Which nodes (`labels`, `taints`, `name`) a spread constraint of the pod counts domains on, as kube-scheduler
    does: nodes with the key of every one of its DoNotSchedule constraints that pass the pod's nodeSelector and
    required node affinity (`nodeAffinityPolicy: Honor`, the default) and, under `nodeTaintsPolicy: Honor` only, whose
    taints it tolerates (default Ignore: "If this value is nil, the behavior is equivalent to the Ignore policy",
    core/v1 TopologySpreadConstraint)."""
    keys = [c.get("topologyKey") for c in spec.get("topologySpreadConstraints") or ()
            if c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"]
    selector = dict(spec.get("nodeSelector") or {}) if constraint.get("nodeAffinityPolicy", "Honor") == "Honor" else {}
    terms = [NodeSelectorTerm.model_validate(t) for t in required_node_affinity(spec)] \
        if constraint.get("nodeAffinityPolicy", "Honor") == "Honor" else []
    tolerations = [Toleration.model_validate(t) for t in spec.get("tolerations") or ()] \
        if constraint.get("nodeTaintsPolicy", "Ignore") == "Honor" else None

    def eligible(node: Mapping[str, Any]) -> bool:
        labels = node["labels"]
        if any(k not in labels for k in keys) or any(labels.get(k) != v for k, v in selector.items()):
            return False
        if terms and not terms_match(terms, labels, node.get("name")):
            return False
        return tolerations is None or tolerates_all(tolerations, [
            Taint(key=t["key"], value=t.get("value") or "", effect=t.get("effect") or "NoSchedule")
            for t in node.get("taints") or ()])

    return eligible


def node_spread(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's `DoNotSchedule` spread constraints on the node (`kubernetes.io/hostname`) whose pods it is one of,
    each with the selector it counts by: a new node may take `maxSkew` of them (a constraint the pod is not in
    counts none of the new pods, so it caps nothing there)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    out = []
    for c in (pod.get("spec") or {}).get("topologySpreadConstraints") or ():
        if c.get("topologyKey") != HOSTNAME or c.get("whenUnsatisfiable", "DoNotSchedule") != "DoNotSchedule":
            continue
        selector = spread_selector(c, labels)
        if selects(selector, labels):
            out.append({"maxSkew": c.get("maxSkew", 1), "topologyKey": HOSTNAME, "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": selector})
    return out


def host_ports(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ports the pod holds on its node, as kube-scheduler's NodePorts filter counts them (`GetHostPorts`,
    kubernetes pkg/scheduler/util): the `hostPort` of its app containers and sidecars (restartable init containers);
    under `hostNetwork` every container port, which the API server defaults the host port to."""
    containers = [*(c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"),
                  *(spec.get("containers") or ())]
    out = []
    for container in containers:
        for port in container.get("ports") or ():
            number = port.get("hostPort") or (port.get("containerPort") if spec.get("hostNetwork") else None)
            if number:
                out.append({"hostPort": int(number), "protocol": port.get("protocol") or "TCP",
                            "hostIP": port.get("hostIP") or ""})
    return out


def spread_selector(constraint: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any] | None:
    """The pods a spread constraint counts: its `labelSelector`, ANDed with the pod's own values of its
    `matchLabelKeys` ("The keys are used to lookup values from the incoming pod labels, those key-value labels are
    ANDed with labelSelector"; a key the pod lacks is ignored: kubernetes.io, Pod Topology Spread Constraints).
    An API server that merged them into the selector already (MatchLabelKeysInPodTopologySpreadSelectorMerge)
    gets the same requirement twice, which selects the same pods."""
    selector = constraint.get("labelSelector")
    if selector is None:
        return None
    extra = [{"key": k, "operator": "In", "values": [labels[k]]}
             for k in constraint.get("matchLabelKeys") or () if k in labels]
    if not extra:
        return dict(selector)
    return {**selector, "matchExpressions": [*(selector.get("matchExpressions") or ()), *extra]}


def _terms(pod: Mapping[str, Any], kind: str) -> list[tuple[dict[str, Any], bool]]:
    """Each required `kind` (`podAffinity`, `podAntiAffinity`) term on the node or the zone, as sent, and whether the
    pod is among the pods it counts: in its namespaces (the pod's own, those it names, or every one for
    `namespaceSelector: {}`, "An empty selector ({}) matches all namespaces", core/v1 PodAffinityTerm) and selected.
    A term with any other namespace selector is left out: which namespaces it selects depends on their labels."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    own = metadata.get("namespace") or "default"
    out = []
    for term in required_pod_terms(pod.get("spec") or {}, kind):
        key, every = term.get("topologyKey"), term.get("namespaceSelector")
        if (key != HOSTNAME and key not in ZONE_KEYS) or every:
            continue
        namespaces = list(term.get("namespaces") or ())
        entry: dict[str, Any] = {"topologyKey": key, "labelSelector": term.get("labelSelector") or {}}
        if every is not None:
            entry["namespaceSelector"] = {}
        elif namespaces:
            entry["namespaces"] = namespaces
        in_scope = every is not None or not namespaces or own in namespaces
        out.append((entry, in_scope and selects(term.get("labelSelector"), labels)))
    return out


def pod_anti_affinity(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Required anti-affinity terms on the node or the zone that count the pod itself (`_terms`)."""
    return [entry for entry, mine in _terms(pod, "podAntiAffinity") if mine]


def pod_affinity(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Required affinity terms on the node or the zone (`_terms`), each saying whether it counts the pod itself."""
    return [{**entry, "selfMatch": mine} for entry, mine in _terms(pod, "podAffinity")]


def label_selector_text(selector: Mapping[str, Any] | None) -> str | None:
    """A LabelSelector as the `labelSelector` query string; None when it cannot be written as one."""
    if not selector:
        return None
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or ():
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or ()
        if op in ("In", "NotIn"):
            parts.append(f"{key} {op.lower()} ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            return None
    return ",".join(parts) or None


class KubernetesPlacement:
    def __init__(self, api_client: client.ApiClient, clock: Clock, ttl: timedelta = timedelta(seconds=10), *,
                 core_api: client.CoreV1Api | None = None, storage_api: client.StorageV1Api | None = None) -> None:
        self._core = core_api or client.CoreV1Api(api_client)
        self._storage = storage_api or client.StorageV1Api(api_client)
        self._clock = clock
        self._ttl = ttl
        self._cache: dict[tuple[str, ...], tuple[datetime, Any]] = {}

    def _cached(self, key: tuple[str, ...], fetch: Callable[[], Any]) -> Any:
        now = self._clock.now()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        value = fetch()
        if len(self._cache) > 4096:
            self._cache = {k: v for k, v in self._cache.items() if now - v[0] < self._ttl}
        self._cache[key] = (now, value)
        return value

    def _read(self, call: Callable[..., Any], *args: str) -> dict[str, Any] | None:
        """The object; None when it does not exist (any other failure is raised)."""
        try:
            response: Any = call(*args, _preload_content=False)
        except ApiException as error:
            if error.status == _NOT_FOUND:
                return None
            raise
        found: dict[str, Any] = json.loads(response.data)
        return found

    # Volumes

    def volume_zones(self, pod: Mapping[str, Any]) -> list[str] | None:
        """Zones where every persistent volume of the pod can be used; None when they do not restrict it.
        Raises VolumesUnplannable for a claim no node can serve."""
        metadata = pod.get("metadata") or {}
        namespace = metadata.get("namespace") or "default"
        result: set[str] | None = None
        for volume in (pod.get("spec") or {}).get("volumes") or ():
            if claim := (volume.get("persistentVolumeClaim") or {}).get("claimName"):
                name = claim
            elif volume.get("ephemeral"):
                name = f"{metadata.get('name')}-{volume.get('name')}"
            else:
                continue
            place: _ClaimPlace = self._cached(("pvc", namespace, name), partial(self._claim_place, namespace, name))
            if place.refused is not None:
                raise VolumesUnplannable(place.refused)
            if place.zones is not None:
                result = set(place.zones) if result is None else result & set(place.zones)
        return sorted(result) if result is not None else None

    def _claim_place(self, namespace: str, name: str) -> _ClaimPlace:
        claim = self._read(self._core.read_namespaced_persistent_volume_claim, name, namespace)
        if claim is None:
            return _ClaimPlace(None, f"its PersistentVolumeClaim {name} does not exist")
        if (claim.get("metadata") or {}).get("deletionTimestamp"):
            return _ClaimPlace(None, f"its PersistentVolumeClaim {name} is being deleted")
        spec = claim.get("spec") or {}
        volume = spec.get("volumeName")
        if (claim.get("status") or {}).get("phase") == "Lost":
            return _ClaimPlace(None, f"its PersistentVolumeClaim {name} is Lost: its PersistentVolume {volume} "
                                     "no longer exists")
        if volume:
            pv = self._read(self._core.read_persistent_volume, volume)
            if pv is None:
                return _ClaimPlace(None, f"the PersistentVolume {volume} of its PersistentVolumeClaim {name} does "
                                         "not exist")
            return _ClaimPlace(persistent_volume_zones(pv))
        class_name = spec.get("storageClassName")
        if not class_name:
            return _ClaimPlace(None, f"its PersistentVolumeClaim {name} is not bound and names no StorageClass to "
                                     "provision it")
        storage_class = self._read(self._storage.read_storage_class, class_name)
        if storage_class is None:
            return _ClaimPlace(None, f"the StorageClass {class_name} of its PersistentVolumeClaim {name} does not "
                                     "exist")
        if storage_class.get("volumeBindingMode", "Immediate") != "WaitForFirstConsumer":
            return _ClaimPlace(None, f"its PersistentVolumeClaim {name} is not bound, and a claim of StorageClass "
                                     f"{class_name}, with immediate volume binding mode, must be bound before the "
                                     "pod can be scheduled")
        topologies = storage_class.get("allowedTopologies") or ()
        zones = zones_of_terms(topologies, "matchLabelExpressions") if topologies else None
        return _ClaimPlace(frozenset(zones) if zones is not None else None)

    # Spread

    def zone_counts(self, namespace: str | None, selector: Mapping[str, Any] | None,
                    eligible: Callable[[Mapping[str, Any]], bool] | None = None,
                    key: str | None = None) -> dict[str, int]:
        """Running pods the selector matches in the namespace (None: in every one), per zone of their nodes. With
        `eligible` (a node test), only pods on such nodes count, and every zone (`key`'s value) of such a node is
        there, 0 included."""
        text = label_selector_text(selector)
        if eligible is None:
            if text is None:
                return {}
            found = text
            per_node = self._cached(("spread", namespace or "", found), lambda: self._count(namespace, found))
            zone_of = {n: z for n, (labels, _) in self._cached(("nodes",), self._nodes).items()
                       if (z := _zone(labels))}
            return dict(Counter(zone_of[n] for n in per_node.elements() if n in zone_of))
        nodes = self._cached(("nodes",), self._nodes)
        zone_of = {n: labels[key] for n, (labels, taints) in nodes.items()
                   if key in labels and eligible({"name": n, "labels": labels, "taints": taints})}
        counts = dict.fromkeys(sorted(set(zone_of.values())), 0)
        if text is not None:
            per_node = self._cached(("spread", namespace or "", text), lambda: self._count(namespace, text))
            for node in per_node.elements():
                if node in zone_of:
                    counts[zone_of[node]] += 1
        return counts

    def term_counts(self, term: Mapping[str, Any], namespace: str) -> dict[str, int]:
        """Running pods a pod (anti-)affinity term (as `_terms` sends it) matches, per zone of their nodes."""
        counts: Counter[str] = Counter()
        for space in _term_namespaces(term, namespace):
            counts.update(self.zone_counts(space, term.get("labelSelector")))
        return dict(counts)

    def term_nodes(self, term: Mapping[str, Any], namespace: str) -> list[str]:
        """The nodes running pods a pod affinity term (as `_terms` sends it) matches."""
        text = label_selector_text(term.get("labelSelector"))
        if text is None:
            return []
        return sorted({node for space in _term_namespaces(term, namespace)
                       for node in self._cached(("spread", space or "", text), partial(self._count, space, text))})

    def _count(self, namespace: str | None, selector: str) -> Counter[str]:
        """Bound pods that are neither finished nor terminating per node: those kube-scheduler counts (Karpenter's
        `IgnoredForTopology` skips the others too)."""
        response: Any = (
            self._core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
            if namespace is not None else
            self._core.list_pod_for_all_namespaces(label_selector=selector, _preload_content=False))
        return Counter(node for p in json.loads(response.data).get("items") or ()
                       if (node := (p.get("spec") or {}).get("nodeName"))
                       and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                       and not (p.get("metadata") or {}).get("deletionTimestamp"))

    def _nodes(self) -> dict[str, tuple[dict[str, str], list[dict[str, Any]]]]:
        """Every node's labels and taints."""
        response: Any = self._core.list_node(_preload_content=False)
        return {node["metadata"]["name"]: (dict((node.get("metadata") or {}).get("labels") or {}),
                                           list((node.get("spec") or {}).get("taints") or ()))
                for node in json.loads(response.data).get("items") or ()}


def _term_namespaces(term: Mapping[str, Any], namespace: str) -> tuple[str | None, ...]:
    """The namespaces a term as sent counts (None: every one)."""
    return (None,) if "namespaceSelector" in term else tuple(term.get("namespaces") or (namespace,))


def _zone(labels: Mapping[str, str]) -> str | None:
    return next((labels[k] for k in sorted(ZONE_KEYS) if k in labels), None)

"""The scheduler: kube-scheduler's default profile, written from its documentation, not from the packer.

kubernetes.io, "Scheduling Framework", "Scheduler Configuration" (default plugins) and "Resource Bin
Packing"; the pod request rules from "Resource Management for Pods", "Init Containers" and "Pod Overhead":

- Queue (PrioritySort): higher `spec.priority` first, then older pods.
- Filter: NodeUnschedulable (a cordoned node, unless the pod tolerates `node.kubernetes.io/unschedulable`),
  TaintToleration (every NoSchedule/NoExecute taint tolerated), NodeAffinity (`nodeSelector` and the
  required node affinity terms: terms ORed, expressions ANDed, `matchFields` on `metadata.name`), and
  NodeResourcesFit (the pod's requests plus one pod slot within allocatable less the requests of the pods
  already bound; a resource the node does not have is zero), and VolumeBinding for bound claims ("Scheduling
  Framework", default plugins; "Persistent Volumes", Node Affinity: "A PV can specify node affinity to define
  constraints that limit what nodes this volume can be accessed from. Pods that use a PV will only be
  scheduled to nodes that are selected by the node affinity"): every PersistentVolumeClaim the pod mounts
  must exist (else `persistentvolumeclaim "<name>" not found`), and the required node affinity of the
  volume it is bound to must select the node (else `node(s) had volume node affinity conflict`). A claim
  not yet bound (WaitForFirstConsumer) is bound where the pod lands, so it constrains nothing here.
  PodTopologySpread ("Pod Topology Spread Constraints"; `whenUnsatisfiable: DoNotSchedule` constraints): a node
  without every constraint's `topologyKey` is refused ("missing required label"); the domains are the key's values
  on eligible nodes (those with every key that pass the pod's nodeSelector and required node affinity,
  `nodeAffinityPolicy: Honor`; taints count only under `nodeTaintsPolicy: Honor`), each counting the bound, not
  terminating pods of the pod's namespace its `labelSelector` (with `matchLabelKeys` ANDed in) selects, 0 included;
  "skew = number of matching pods in the domain + 1 if the incoming pod matches − global minimum" must stay within
  `maxSkew`, the global minimum being 0 while fewer eligible domains than `minDomains` exist.
  NodePorts: a node where a bound pod holds one of the pod's host ports (same port and protocol, and the same
  `hostIP` or either on 0.0.0.0, the default) is refused. A pod's host ports are its containers' and sidecars'
  (restartable init containers') `hostPort`s, and under `hostNetwork` their container ports ("If HostNetwork is
  specified, this must match ContainerPort", core/v1 ContainerPort.hostPort, which the API server defaults to it).
  InterPodAffinity's required anti-affinity ("Assigning Pods to Nodes", Inter-pod affinity and anti-affinity): a
  node is refused when a bound pod in its domain (the nodes sharing its value of the term's `topologyKey`) matches a
  term of the incoming pod ("didn't match pod anti-affinity rules"), or the incoming pod matches a term of a bound
  pod there ("didn't satisfy existing pods anti-affinity rules"). A term counts the pods of its `namespaces` and of
  the namespaces its `namespaceSelector` selects ("An empty selector ({}) matches all namespaces"); with neither,
  those of the pod's own namespace (core/v1 PodAffinityTerm). A node without the key is no domain: nothing repels.
  Its required affinity: every term's key must be on the node, and the node's domain must hold, for each term, a
  bound pod that matches all the terms ("didn't match pod affinity rules"), unless no bound pod matches them all
  and the pod matches its own terms: the first of a group that selects itself goes anywhere (`satisfyPodAffinity`,
  kubernetes pkg/scheduler/framework/plugins/interpodaffinity/filtering.go).
- Score, each plugin normalized to 0–100 and weighted as the default profile does: NodeResourcesFit with the
  `LeastAllocated` strategy over cpu and memory (weight 1: the emptiest node wins — kube-scheduler spreads by
  default; GPUs are not scored), NodeResourcesBalancedAllocation (weight 1: cpu and memory used in
  proportion), TaintToleration (weight 3: fewer untolerated PreferNoSchedule taints), NodeAffinity (weight 2:
  the weights of the matching preferred terms). kube-scheduler breaks ties at random; here the node name does,
  so placement is reproducible.
- A pod's request is, per resource, the larger of its app containers' sum (plus restartable "sidecar" init
  containers) and any single init container's request (plus the sidecars started before it), plus
  `spec.overhead`; a container's request defaults to its limit.

A pod that fits nowhere gets `PodScheduled=False, reason Unschedulable` and kube-scheduler's message
(`0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {…}.`), written
only when it changes so a pending pod's resourceVersion stays put. Pods with scheduling gates get
`SchedulingGated`. Gangs of the coscheduling plugin (label `scheduling.x-k8s.io/pod-group` with a PodGroup)
wait at the Permit stage: they bind together once `minMember` of them fit, or not at all.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.kube_objects import (
    NAMESPACES,
    NODES,
    PODGROUPS,
    PODS,
    PVCS,
    PVS,
    ApiError,
    format_time,
)
from gpu_autoscaler.emulator.kube_selectors import labels_match, selector_from_object
from gpu_autoscaler.models.resources import Resources

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_apiserver import ApiServer

__all__ = ["COSCHEDULING_LABEL", "ScheduleResult", "Scheduler", "pod_requests"]

COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
POD_SLOTS = "pods"
SCORED = ("cpu", "memory")
"""NodeResourcesFit's and BalancedAllocation's default resources (equal weights)."""
WEIGHTS = {"fit": 1, "balanced": 1, "taints": 3, "affinity": 2}
_TERMINAL = ("Succeeded", "Failed")


@dataclass
class ScheduleResult:
    bound: dict[str, str] = field(default_factory=dict)
    """Pod (`namespace/name`) → node it was bound to in this pass."""
    unschedulable: dict[str, str] = field(default_factory=dict)
    """Pod → the message it was marked Unschedulable with."""


# What a pod asks for


def _container_requests(container: Mapping[str, Any]) -> Resources:
    resources = container.get("resources") or {}
    return Resources.from_quantities({**(resources.get("limits") or {}), **(resources.get("requests") or {})})


def _max(a: Resources, b: Resources) -> Resources:
    return Resources({k: max(a.get(k, 0), b.get(k, 0)) for k in set(a) | set(b)})


def pod_requests(pod: Mapping[str, Any]) -> Resources:
    """What NodeResourcesFit counts for the pod (without its pod slot): its containers' requests, or for what
    the pod level names (`spec.resources`), the pod's: "If you specify pod-level requests, the kube-scheduler uses
    them" (kubernetes.io, Assign Pod-level CPU and memory resources); the pod overhead on top."""
    spec = pod.get("spec") or {}
    sidecars = Resources()
    init_peak = Resources()
    for container in spec.get("initContainers") or ():
        if container.get("restartPolicy") == "Always":
            sidecars = sidecars + _container_requests(container)
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, sidecars + _container_requests(container))
    app = Resources()
    for container in spec.get("containers") or ():
        app = app + _container_requests(container)
    total = _max(app + sidecars, init_peak)
    if pod_level := spec.get("resources"):
        total = Resources({**total, **_container_requests({"resources": pod_level})})
    return total + Resources.from_quantities(spec.get("overhead") or {})


# Matching


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """core/v1 Toleration semantics: an empty key with Exists matches every key; an empty effect every effect."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("key")) and (toleration.get("value") or "") == (taint.get("value") or "")


def _tolerated(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    return any(_tolerates(t, taint) for t in tolerations)


def _expression(expression: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, operator = expression.get("key", ""), expression.get("operator", "")
    wanted = [str(v) for v in expression.get("values") or ()]
    present = key in values
    if operator == "In":
        return present and values[key] in wanted
    if operator == "NotIn":
        return not present or values[key] not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """A NodeSelectorTerm: an empty term matches nothing; its expressions (labels and fields) are ANDed."""
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False
    return all(_expression(e, labels) for e in expressions) and all(
        _expression(f, {"metadata.name": name}) for f in fields)


@dataclass
class _Node:
    name: str
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    unschedulable: bool
    allocatable: dict[str, int]
    used: dict[str, int]
    """Plain dicts: a pass reads them nodes × pods times."""
    pods: list[dict[str, Any]] = field(default_factory=list)
    """The pods bound to it and not finished, for the filters that look at other pods."""

    def take(self, need: Mapping[str, int], raw: dict[str, Any]) -> None:
        for resource, value in need.items():
            self.used[resource] = self.used.get(resource, 0) + value
        self.pods.append(raw)


@dataclass
class _Pod:
    raw: dict[str, Any]
    requests: Resources
    volume_terms: tuple[tuple[dict[str, Any], ...], ...] = ()
    """Per bound volume, its PV's required node selector terms (one of each must match the node)."""
    missing_claim: str | None = None
    need: dict[str, int] = field(init=False)
    """The requests and the pod's slot, as NodeResourcesFit checks them."""

    host_ports: list[tuple[str, str, int]] = field(init=False)

    def __post_init__(self) -> None:
        self.need = (self.requests + {POD_SLOTS: 1}).as_dict()
        self.host_ports = _host_ports(self.spec)

    @property
    def key(self) -> str:
        return f"{self.raw['metadata']['namespace']}/{self.raw['metadata']['name']}"

    @property
    def spec(self) -> dict[str, Any]:
        return self.raw.get("spec") or {}

    def node_affinity(self) -> dict[str, Any]:
        return (self.spec.get("affinity") or {}).get("nodeAffinity") or {}

    def constraints(self) -> str:
        """What the filters other than NodeResourcesFit look at: pods sharing it share the answer."""
        spec = self.spec
        return repr((spec.get("nodeSelector"), self.node_affinity().get(
            "requiredDuringSchedulingIgnoredDuringExecution"), spec.get("tolerations"), self.volume_terms))


def _refuse(pod: _Pod, node: _Node) -> str | None:
    """Why a filter other than NodeResourcesFit rejects the node (kube-scheduler's wording), or None."""
    tolerations = pod.spec.get("tolerations") or ()
    if node.unschedulable and not _tolerated(tolerations, UNSCHEDULABLE_TAINT):
        return "node(s) were unschedulable"
    for taint in node.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(tolerations, taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
    if not _affinity_holds(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    if any(not any(_term(t, node.labels, node.name) for t in terms) for terms in pod.volume_terms):
        return "node(s) had volume node affinity conflict"
    return None


def _affinity_holds(pod: _Pod, node: _Node) -> bool:
    """The pod's `nodeSelector` and required node affinity select the node."""
    selector = pod.spec.get("nodeSelector") or {}
    required = (pod.node_affinity().get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms")
    return all(node.labels.get(k) == v for k, v in selector.items()) and (
        required is None or any(_term(t, node.labels, node.name) for t in required))


def _spread_selector(constraint: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any] | None:
    """The constraint's `labelSelector` with the pod's values of its `matchLabelKeys` ANDed in (a key the pod lacks
    is ignored)."""
    selector = constraint.get("labelSelector")
    if selector is None:
        return None
    extra = [{"key": k, "operator": "In", "values": [labels[k]]} for k in constraint.get("matchLabelKeys") or ()
             if k in labels]
    return {**selector, "matchExpressions": [*(selector.get("matchExpressions") or ()), *extra]}


def _host_ports(spec: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(address, protocol, port) the pod holds on its node."""
    containers = [*(c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"),
                  *(spec.get("containers") or ())]
    return [(p.get("hostIP") or "0.0.0.0", p.get("protocol") or "TCP", int(number))
            for c in containers for p in c.get("ports") or ()
            if (number := p.get("hostPort") or (p.get("containerPort") if spec.get("hostNetwork") else 0))]


def _ports_clash(a: tuple[str, str, int], b: tuple[str, str, int]) -> bool:
    return a[1:] == b[1:] and (a[0] == b[0] or "0.0.0.0" in (a[0], b[0]))


def _required(pod: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return list((((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or ())


def _anti_affinity(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    return _required(pod, "podAntiAffinity")


def _affinity_refusal(pod: _Pod, node: _Node, cycle: _Cycle) -> str | None:
    terms = _required(pod.raw, "podAffinity")
    if not terms:
        return None
    if any(t.get("topologyKey", "") not in node.labels for t in terms):
        return "node(s) didn't match pod affinity rules"
    matching = [(other, bound) for other in cycle.nodes for bound in other.pods
                if all(_term_counts(t, pod.raw, bound, cycle.namespaces) for t in terms)]
    if all(any(other.labels.get(t["topologyKey"]) == node.labels[t["topologyKey"]] for other, _ in matching)
           for t in terms):
        return None
    if not matching and all(_term_counts(t, pod.raw, pod.raw, cycle.namespaces) for t in terms):
        return None
    return "node(s) didn't match pod affinity rules"


def _term_counts(term: Mapping[str, Any], owner: Mapping[str, Any], other: Mapping[str, Any],
                 namespaces: Mapping[str, Mapping[str, str]]) -> bool:
    """Whether the pod-affinity term of pod `owner` matches pod `other`."""
    space = other["metadata"].get("namespace") or "default"
    listed = term.get("namespaces") or ()
    selector = term.get("namespaceSelector")
    if not listed and selector is None:
        in_scope = space == (owner["metadata"].get("namespace") or "default")
    else:
        in_scope = space in listed or (selector is not None and labels_match(
            selector_from_object(selector), namespaces.get(space, {"kubernetes.io/metadata.name": space})))
    return in_scope and labels_match(selector_from_object(term.get("labelSelector")),
                                     other["metadata"].get("labels") or {})


def _refuse_beside(pod: _Pod, node: _Node, cycle: _Cycle) -> str | None:
    """Why a filter that looks at the pods already bound rejects the node (kube-scheduler's wording), or None."""
    if pod.host_ports and any(_ports_clash(mine, theirs) for other in node.pods
                              for theirs in _host_ports(other.get("spec") or {}) for mine in pod.host_ports):
        return "node(s) didn't have free ports for the requested pod ports"
    if why := _anti_affinity_refusal(pod, node, cycle) or _affinity_refusal(pod, node, cycle):
        return why
    constraints = [c for c in pod.spec.get("topologySpreadConstraints") or ()
                   if c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"]
    if constraints:
        return _spread_refusal(pod, node, cycle.nodes, constraints)
    return None


def _anti_affinity_refusal(pod: _Pod, node: _Node, cycle: _Cycle) -> str | None:
    terms = _anti_affinity(pod.raw)
    if not terms and not cycle.repelling:
        return None
    for other in cycle.nodes:
        for bound in other.pods:
            for term in terms:
                key = term.get("topologyKey", "")
                if key in node.labels and other.labels.get(key) == node.labels[key] and _term_counts(
                        term, pod.raw, bound, cycle.namespaces):
                    return "node(s) didn't match pod anti-affinity rules"
            if bound["metadata"].get("uid") in cycle.repelling:
                for term in _anti_affinity(bound):
                    key = term.get("topologyKey", "")
                    if key in node.labels and other.labels.get(key) == node.labels[key] and _term_counts(
                            term, bound, pod.raw, cycle.namespaces):
                        return "node(s) didn't satisfy existing pods anti-affinity rules"
    return None


def _spread_refusal(pod: _Pod, node: _Node, nodes: list[_Node], constraints: list[Mapping[str, Any]]) -> str | None:
    keys = [c.get("topologyKey", "") for c in constraints]
    if any(k not in node.labels for k in keys):
        return "node(s) didn't match pod topology spread constraints (missing required label)"
    metadata = pod.raw["metadata"]
    namespace, labels = metadata.get("namespace"), metadata.get("labels") or {}
    tolerations = pod.spec.get("tolerations") or ()
    for constraint, key in zip(constraints, keys, strict=True):
        selector = selector_from_object(_spread_selector(constraint, labels))
        counts: dict[str, int] = {}
        for other in nodes:
            if any(k not in other.labels for k in keys):
                continue
            if constraint.get("nodeAffinityPolicy", "Honor") == "Honor" and not _affinity_holds(pod, other):
                continue
            if constraint.get("nodeTaintsPolicy", "Ignore") == "Honor" and any(
                    t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(tolerations, t)
                    for t in other.taints):
                continue
            domain = other.labels[key]
            counts[domain] = counts.get(domain, 0) + sum(
                1 for p in other.pods if p["metadata"].get("namespace") == namespace
                and not p["metadata"].get("deletionTimestamp")
                and labels_match(selector, p["metadata"].get("labels") or {}))
        least = min(counts.values(), default=0)
        if len(counts) < int(constraint.get("minDomains") or 1):
            least = 0
        if counts.get(node.labels[key], 0) + labels_match(selector, labels) - least > int(constraint.get("maxSkew", 1)):
            return "node(s) didn't match pod topology spread constraints"
    return None


def _shortfall(pod: _Pod, node: _Node) -> str | None:
    allocatable, used = node.allocatable, node.used
    short = [r for r, v in pod.need.items() if v and v > allocatable.get(r, 0) - used.get(r, 0)]
    if not short:
        return None
    return ", ".join("Too many pods" if r == POD_SLOTS else f"Insufficient {r}" for r in sorted(short))


def _choose(pod: _Pod, nodes: list[_Node]) -> _Node:
    """The feasible node with the highest weighted score (ties: the first by name).

    NodeResourcesFit (LeastAllocated): mean over cpu and memory of free/allocatable after placing the pod.
    BalancedAllocation: 1 − the standard deviation of the cpu and memory fractions (two values: half their
    difference). TaintToleration and NodeAffinity are normalized over the feasible nodes (reverse, plain)."""
    tolerations = pod.spec.get("tolerations") or ()
    preferred = pod.node_affinity().get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    cpu_need, memory_need = pod.need.get("cpu", 0), pod.need.get("memory", 0)
    raw: list[tuple[_Node, float, int, int]] = []
    for node in nodes:
        cpu_total, memory_total = node.allocatable.get("cpu", 0), node.allocatable.get("memory", 0)
        cpu = min((node.used.get("cpu", 0) + cpu_need) / cpu_total, 1.0) if cpu_total else 1.0
        memory = min((node.used.get("memory", 0) + memory_need) / memory_total, 1.0) if memory_total else 1.0
        base = (WEIGHTS["fit"] * ((1 - cpu) + (1 - memory)) * 50
                + WEIGHTS["balanced"] * (1 - abs(cpu - memory) / 2) * 100)
        prefer_no = 0
        if node.taints:
            prefer_no = sum(1 for t in node.taints
                            if t.get("effect") == "PreferNoSchedule" and not _tolerated(tolerations, t))
        affinity = 0
        if preferred:
            affinity = sum(int(p.get("weight", 0)) for p in preferred
                           if _term(p.get("preference") or {}, node.labels, node.name))
        raw.append((node, base, prefer_no, affinity))
    most_taints = max(r[2] for r in raw)
    most_affinity = max(r[3] for r in raw)
    best: tuple[float, str] | None = None
    chosen = nodes[0]
    for node, base, prefer_no, affinity in raw:
        taints = 100.0 if most_taints == 0 else (1 - prefer_no / most_taints) * 100
        preference = 0.0 if most_affinity == 0 else affinity / most_affinity * 100
        rank = (-(base + WEIGHTS["taints"] * taints + WEIGHTS["affinity"] * preference), node.name)
        if best is None or rank < best:
            best, chosen = rank, node
    return chosen


class _Cycle:
    """One pass: the nodes with what is bound to them, and the filter answers per pod constraints."""

    def __init__(self, nodes: list[_Node], namespaces: dict[str, dict[str, str]]) -> None:
        self.nodes = nodes
        self.namespaces = namespaces
        """Namespace → its labels, for anti-affinity terms' namespace selectors."""
        self.repelling = {p["metadata"].get("uid") for n in nodes for p in n.pods if _anti_affinity(p)}
        """Bound pods with required anti-affinity (uids): the incoming pod must not be in their way."""
        self._filtered: dict[str, tuple[list[_Node], Counter[str]]] = {}

    def place(self, pod: _Pod) -> tuple[_Node | None, str]:
        if pod.missing_claim is not None:  # PreFilter: unschedulable and unresolvable, no node is looked at
            return None, f'persistentvolumeclaim "{pod.missing_claim}" not found'
        candidates, refusals = self._filter(pod)
        reasons = Counter(refusals)
        feasible = []
        for node in candidates:
            short = _refuse_beside(pod, node, self) or _shortfall(pod, node)
            if short is None:
                feasible.append(node)
            else:
                reasons[short] += 1
        if not feasible:
            return None, _message(reasons, len(self.nodes))
        node = _choose(pod, feasible)
        node.take(pod.need, pod.raw)
        if _anti_affinity(pod.raw):
            self.repelling.add(pod.raw["metadata"].get("uid"))
        return node, ""

    def _filter(self, pod: _Pod) -> tuple[list[_Node], Counter[str]]:
        key = pod.constraints()
        found = self._filtered.get(key)
        if found is None:
            candidates: list[_Node] = []
            refusals: Counter[str] = Counter()
            for node in self.nodes:
                reason = _refuse(pod, node)
                if reason is None:
                    candidates.append(node)
                else:
                    refusals[reason] += 1
            found = self._filtered[key] = (candidates, refusals)
        return found


def _message(reasons: Counter[str], total: int) -> str:
    if total == 0:
        return "no nodes available to schedule pods"
    counted: Counter[str] = Counter()
    for reason, count in reasons.items():
        for part in reason.split(", "):
            counted[part] += count
    parts = ", ".join(f"{count} {reason}" for reason, count in sorted(counted.items()))
    return (f"0/{total} nodes are available: {parts}. preemption: 0/{total} nodes are available: "
            f"{total} Preemption is not helpful for scheduling.")


class Scheduler:
    def __init__(self, api: ApiServer, clock: Clock, scheduler_names: Iterable[str] = ("default-scheduler",)) -> None:
        self._api = api
        self._clock = clock
        self._names = frozenset(scheduler_names)
        self._requests: dict[str, tuple[str, Resources]] = {}
        """uid → (resourceVersion, requests): every pass sums the bound pods, few of them change."""

    def schedule(self) -> ScheduleResult:
        """One scheduling pass over every pending pod, atomic with respect to other API writes."""
        store = self._api.store
        result = ScheduleResult()
        with store.lock:
            cycle = _Cycle(self._nodes(), {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {})
                                           for n in store.objects(NAMESPACES)})
            pending = sorted(
                (p for p in store.objects(PODS) if self._pending(p)),
                key=lambda p: (-int((p.get("spec") or {}).get("priority") or 0),
                               p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
            )
            gangs: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for raw in pending:
                if (raw.get("spec") or {}).get("schedulingGates"):
                    self._mark(raw, "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates",
                               result)
                    continue
                group = (raw["metadata"].get("labels") or {}).get(COSCHEDULING_LABEL)
                if group and store.find(PODGROUPS, raw["metadata"]["namespace"], group) is not None:
                    gangs.setdefault((raw["metadata"]["namespace"], group), []).append(raw)
                    continue
                node, message = cycle.place(self._pod(raw))
                if node is None:
                    self._mark(raw, "Unschedulable", message, result)
                else:
                    self._bind(raw, node, result)
            for (namespace, group), members in gangs.items():
                self._schedule_gang(namespace, group, members, cycle, result)
        return result

    # Gangs (the coscheduling plugin's Permit stage)

    def _schedule_gang(self, namespace: str, group: str, members: list[dict[str, Any]], cycle: _Cycle,
                       result: ScheduleResult) -> None:
        store = self._api.store
        spec = (store.get(PODGROUPS, namespace, group).get("spec") or {})
        min_member = int(spec.get("minMember") or 1)
        running = sum(
            1 for p in store.objects(PODS)
            if p["metadata"].get("namespace") == namespace
            and (p["metadata"].get("labels") or {}).get(COSCHEDULING_LABEL) == group
            and (p.get("spec") or {}).get("nodeName")
            and (p.get("status") or {}).get("phase") not in _TERMINAL
        )
        saved = [(n, dict(n.used), list(n.pods)) for n in cycle.nodes]
        placed: list[tuple[dict[str, Any], _Node]] = []
        last_message = ""
        for raw in members:
            node, message = cycle.place(self._pod(raw))
            if node is None:
                last_message = message
            else:
                placed.append((raw, node))
        if running + len(placed) >= min_member:
            for raw, node in placed:
                self._bind(raw, node, result)
            for raw in members:
                if all(raw is not p for p, _ in placed):
                    self._mark(raw, "Unschedulable", last_message, result)
            return
        for node, used, pods in saved:
            node.used, node.pods = used, pods
        message = (f"{last_message} pod group {group} needs {min_member} pods, and only "
                   f"{running + len(placed)} can be scheduled.").strip()
        for raw in members:
            self._mark(raw, "Unschedulable", message, result)

    # Reading the cluster

    def _pending(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        return (
            not spec.get("nodeName")
            and not pod["metadata"].get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
            and spec.get("schedulerName", "default-scheduler") in self._names
        )

    def _pod(self, raw: dict[str, Any]) -> _Pod:
        pod = _Pod(raw, self._requests_of(raw))
        store = self._api.store
        namespace = raw["metadata"]["namespace"]
        terms = []
        for volume in (raw.get("spec") or {}).get("volumes") or ():
            name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if not name:
                continue
            claim = store.find(PVCS, namespace, name)
            if claim is None:
                pod.missing_claim = name
                break
            pv_name = (claim.get("spec") or {}).get("volumeName")
            pv = store.find(PVS, "", pv_name) if pv_name else None
            required = ((pv or {}).get("spec") or {}).get("nodeAffinity", {}).get("required") or {}
            if required.get("nodeSelectorTerms"):
                terms.append(tuple(required["nodeSelectorTerms"]))
        pod.volume_terms = tuple(terms)
        return pod

    def _nodes(self) -> list[_Node]:
        store = self._api.store
        used: dict[str, dict[str, int]] = {}
        bound: dict[str, list[dict[str, Any]]] = {}
        for pod in store.objects(PODS):
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name and (pod.get("status") or {}).get("phase") not in _TERMINAL:
                bound.setdefault(node_name, []).append(pod)
                totals = used.setdefault(node_name, {})
                for resource, value in self._requests_of(pod).items():
                    totals[resource] = totals.get(resource, 0) + value
                totals[POD_SLOTS] = totals.get(POD_SLOTS, 0) + 1
        out = []
        for node in store.objects(NODES):
            name = node["metadata"]["name"]
            spec = node.get("spec") or {}
            out.append(_Node(
                name=name, labels=dict(node["metadata"].get("labels") or {}),
                taints=[dict(t) for t in spec.get("taints") or ()], unschedulable=bool(spec.get("unschedulable")),
                allocatable=_allocatable(node).as_dict(), used=used.get(name, {}), pods=bound.get(name, []),
            ))
        return sorted(out, key=lambda n: n.name)

    def _requests_of(self, pod: Mapping[str, Any]) -> Resources:
        metadata = pod["metadata"]
        cached = self._requests.get(metadata["uid"])
        if cached is not None and cached[0] == metadata.get("resourceVersion"):
            return cached[1]
        if len(self._requests) > 50_000:
            self._requests.clear()
        try:
            requests = pod_requests(pod)
        except ValueError:
            requests = Resources({"cpu": 10**12})  # an unparseable request fits nowhere, as validation would refuse
        self._requests[metadata["uid"]] = (metadata.get("resourceVersion", ""), requests)
        return requests

    # Writing

    def _bind(self, raw: dict[str, Any], node: _Node, result: ScheduleResult) -> None:
        namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
        stamp = format_time(self._clock.now())

        def change(pod: dict[str, Any]) -> dict[str, Any]:
            if (pod.get("spec") or {}).get("nodeName"):
                raise ApiError.conflict(PODS, name, "already bound")
            pod.setdefault("spec", {})["nodeName"] = node.name
            _set_condition(pod, {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                 "lastTransitionTime": stamp})
            return pod

        self._api.store.update(PODS, namespace, name, change)
        result.bound[f"{namespace}/{name}"] = node.name

    def _mark(self, raw: dict[str, Any], reason: str, message: str, result: ScheduleResult) -> None:
        namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
        current = next((c for c in (raw.get("status") or {}).get("conditions") or ()
                        if c.get("type") == "PodScheduled"), None)
        result.unschedulable[f"{namespace}/{name}"] = message
        if current and current.get("status") == "False" and current.get("reason") == reason and (
                current.get("message") == message):
            return
        stamp = format_time(self._clock.now())
        condition = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message,
                     "lastProbeTime": None, "lastTransitionTime": stamp}
        self._api.store.update(PODS, namespace, name, lambda pod: _set_condition(pod, condition))


def _allocatable(node: Mapping[str, Any]) -> Resources:
    status = node.get("status") or {}
    try:
        return Resources.from_quantities(status.get("allocatable") or status.get("capacity") or {})
    except ValueError:
        return Resources()


def _set_condition(pod: dict[str, Any], condition: dict[str, Any]) -> dict[str, Any]:
    status = pod.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or () if c.get("type") != condition["type"]]
    status["conditions"] = [*conditions, condition]
    return pod

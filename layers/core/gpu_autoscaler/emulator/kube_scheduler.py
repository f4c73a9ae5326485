"""A minimal kube-scheduler: bind pending pods to nodes that fit them, mark the rest Unschedulable.

Filters as kube-scheduler's default plugins do, with the domain's own rules (no second copy of fit logic):
resources (`effective_requests` plus one `pods` slot, `fit.fits` against allocatable less the pods already
bound), `spec.unschedulable` (unless the pod tolerates `node.kubernetes.io/unschedulable`), taints
(`tolerates_all`), `nodeSelector`, and required node affinity (`NodeSelectorTerm`, plus `matchFields` on
`metadata.name`). Among the nodes that fit, the fullest is chosen (bin-packing, as GPU clusters configure
MostAllocated), ties broken by name, so placement is deterministic.

A pod that fits nowhere gets `PodScheduled=False, reason Unschedulable` and kube-scheduler's message
(`0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {…}.`), written
only when it changes so a pending pod's resourceVersion stays put. Pods with scheduling gates get
`SchedulingGated`. Gangs of the coscheduling plugin (label `scheduling.x-k8s.io/pod-group` with a PodGroup)
are placed after the other pods of a pass, and bind together once `minMember` of them fit, or not at all.
Each pass finds the nodes a set of constraints admits once, then only checks room, so a pass over 1,000
pending pods and 125 nodes takes a fraction of a second.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpu_autoscaler.domain.packing.fit import fits
from gpu_autoscaler.emulator.kube_objects import NODES, PODGROUPS, PODS, ApiError, format_time
from gpu_autoscaler.models.pod_spec import effective_requests, required_node_affinity
from gpu_autoscaler.models.requirements import NodeSelectorTerm, Requirement
from gpu_autoscaler.models.resources import CPU, GPU, MEMORY, Resources
from gpu_autoscaler.models.resources import PODS as POD_SLOTS
from gpu_autoscaler.models.taints import Taint, Toleration, tolerates_all

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_apiserver import ApiServer

__all__ = ["COSCHEDULING_LABEL", "ScheduleResult", "Scheduler"]

COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
UNSCHEDULABLE_TAINT = Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule")
_TERMINAL = ("Succeeded", "Failed")


@dataclass
class ScheduleResult:
    bound: dict[str, str] = field(default_factory=dict)
    """Pod (`namespace/name`) → node it was bound to in this pass."""
    unschedulable: dict[str, str] = field(default_factory=dict)
    """Pod → the message it was marked Unschedulable with."""


@dataclass
class _Node:
    name: str
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    allocatable: Resources
    used: Resources
    free: Resources = field(init=False)
    room: dict[str, int] = field(init=False)
    """`free` as a plain dict: the fit test runs nodes × pods times a pass, and a dict is read fastest."""

    def __post_init__(self) -> None:
        self.set_used(self.used)

    def set_used(self, used: Resources) -> None:
        self.used = used
        self.free = self.allocatable - used
        self.room = self.free.as_dict()


@dataclass(frozen=True)
class _Pod:
    namespace: str
    name: str
    requests: Resources
    need: dict[str, int]
    node_selector: dict[str, str]
    terms: tuple[tuple[NodeSelectorTerm, tuple[Requirement, ...]], ...]
    tolerations: tuple[Toleration, ...]
    invalid: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def constraints(self) -> tuple[object, ...]:
        """What decides which nodes may take the pod regardless of room: pods sharing it share the answer."""
        return (tuple(sorted(self.node_selector.items())), self.terms, self.tolerations, self.invalid)


class _Pass:
    """One scheduling pass: the nodes with their room, and per pod constraints the nodes that admit them."""

    def __init__(self, nodes: list[_Node]) -> None:
        self.nodes = nodes
        self._admitted: dict[tuple[object, ...], tuple[list[_Node], Counter[str]]] = {}

    def place(self, pod: _Pod) -> tuple[_Node | None, str]:
        """The fullest node with room for the pod (its room is taken), or None and kube-scheduler's message."""
        candidates, refusals = self._admitting(pod)
        best: _Node | None = None
        best_score: tuple[int, int, int, str] | None = None
        for node in candidates:
            room = node.room
            if fits(pod.need, room):
                score = (room.get(GPU, 0), room.get(CPU, 0), room.get(MEMORY, 0), node.name)
                if best_score is None or score < best_score:
                    best, best_score = node, score
        if best is not None:
            best.set_used(best.used + pod.requests)
            return best, ""
        reasons = Counter(refusals)
        for node in candidates:
            reasons[_shortfall(pod, node.free)] += 1
        return None, _message(reasons, len(self.nodes))

    def _admitting(self, pod: _Pod) -> tuple[list[_Node], Counter[str]]:
        key = pod.constraints
        found = self._admitted.get(key)
        if found is None:
            candidates: list[_Node] = []
            refusals: Counter[str] = Counter()
            for node in self.nodes:
                reason = _refuse(pod, node)
                if reason is None:
                    candidates.append(node)
                else:
                    refusals[reason] += 1
            found = self._admitted[key] = (candidates, refusals)
        return found


class Scheduler:
    def __init__(self, api: ApiServer, clock: Clock, scheduler_names: Iterable[str] = ("default-scheduler",)) -> None:
        self._api = api
        self._clock = clock
        self._names = frozenset(scheduler_names)
        self._bound_requests: dict[str, tuple[str, Resources]] = {}
        """uid → (resourceVersion, requests) of bound pods: every pass sums them, few of them change."""

    def schedule(self) -> ScheduleResult:
        """One scheduling pass over every pending pod, atomic with respect to other API writes."""
        store = self._api.store
        result = ScheduleResult()
        with store.lock:
            scheduling = _Pass(self._nodes())
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
                node, message = scheduling.place(_parse(raw))
                if node is None:
                    self._mark(raw, "Unschedulable", message, result)
                else:
                    self._bind(raw, node, result)
            for (namespace, group), members in gangs.items():
                self._schedule_gang(namespace, group, members, scheduling, result)
        return result

    # Gangs

    def _schedule_gang(self, namespace: str, group: str, members: list[dict[str, Any]], scheduling: _Pass,
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
        saved = [(n, n.used) for n in scheduling.nodes]
        placed: list[tuple[dict[str, Any], _Node]] = []
        last_message = ""
        for raw in members:
            node, message = scheduling.place(_parse(raw))
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
        for node, used in saved:
            node.set_used(used)
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

    def _nodes(self) -> list[_Node]:
        store = self._api.store
        used: dict[str, Resources] = {}
        for pod in store.objects(PODS):
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name and (pod.get("status") or {}).get("phase") not in _TERMINAL:
                used[node_name] = used.get(node_name, Resources()) + self._requests_of(pod)
        out = []
        for node in store.objects(NODES):
            name = node["metadata"]["name"]
            spec = node.get("spec") or {}
            out.append(_Node(
                name=name,
                labels=dict(node["metadata"].get("labels") or {}),
                taints=tuple(_taint(t) for t in spec.get("taints") or ()),
                unschedulable=bool(spec.get("unschedulable")),
                allocatable=_allocatable(node),
                used=used.get(name, Resources()),
            ))
        return sorted(out, key=lambda n: n.name)

    def _requests_of(self, pod: Mapping[str, Any]) -> Resources:
        metadata = pod["metadata"]
        cached = self._bound_requests.get(metadata["uid"])
        if cached is not None and cached[0] == metadata.get("resourceVersion"):
            return cached[1]
        if len(self._bound_requests) > 50_000:
            self._bound_requests.clear()
        requests = _requests(pod)
        self._bound_requests[metadata["uid"]] = (metadata.get("resourceVersion", ""), requests)
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


def _requests(pod: Mapping[str, Any]) -> Resources:
    return Resources.from_quantities(effective_requests(pod.get("spec") or {})) + {POD_SLOTS: 1}


def _allocatable(node: Mapping[str, Any]) -> Resources:
    status = node.get("status") or {}
    try:
        return Resources.from_quantities(status.get("allocatable") or status.get("capacity") or {})
    except ValueError:
        return Resources()


def _taint(raw: Mapping[str, Any]) -> Taint:
    return Taint(key=raw.get("key", ""), value=raw.get("value") or "", effect=raw.get("effect", "NoSchedule"))


def _parse(raw: Mapping[str, Any]) -> _Pod:
    """The pod's placement constraints in the domain's models; a malformed pod is kept, marked invalid."""
    metadata = raw["metadata"]
    spec = raw.get("spec") or {}
    try:
        terms = tuple(
            (NodeSelectorTerm.model_validate(term),
             tuple(Requirement.model_validate(f) for f in term.get("matchFields") or ()))
            for term in required_node_affinity(spec)
        )
        tolerations = tuple(Toleration.model_validate(t) for t in spec.get("tolerations") or ())
        requests = _requests(raw)
    except (ValidationError, ValueError) as error:
        return _Pod(metadata["namespace"], metadata["name"], Resources(), {}, {}, (), (), invalid=str(error))
    return _Pod(metadata["namespace"], metadata["name"], requests, requests.as_dict(),
                dict(spec.get("nodeSelector") or {}), terms, tolerations)


def _refuse(pod: _Pod, node: _Node) -> str | None:
    """Why the node can never take the pod, whatever its room (kube-scheduler's wording), or None."""
    if pod.invalid is not None:
        return "node(s) could not evaluate the pod's spec"
    if node.unschedulable and not tolerates_all(pod.tolerations, (UNSCHEDULABLE_TAINT,)):
        return "node(s) were unschedulable"
    untolerated = [t for t in node.taints if t.effect != "PreferNoSchedule"
                   and not tolerates_all(pod.tolerations, (t,))]
    if untolerated:
        taint = untolerated[0]
        return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()) or not _affinity(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    return None


def _shortfall(pod: _Pod, free: Resources) -> str:
    short = sorted(pod.requests.shortfall(free))
    return ", ".join("Too many pods" if r == POD_SLOTS else f"Insufficient {r}" for r in short)


def _affinity(pod: _Pod, node: _Node) -> bool:
    """Terms are ORed; within one, expressions on labels and fields (metadata.name) are ANDed."""
    if not pod.terms:
        return True
    fields = {"metadata.name": node.name}
    return any(term.matches(node.labels) and all(r.matches(fields) for r in by_field) for term, by_field in pod.terms)


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


def _set_condition(pod: dict[str, Any], condition: dict[str, Any]) -> dict[str, Any]:
    status = pod.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or () if c.get("type") != condition["type"]]
    status["conditions"] = [*conditions, condition]
    return pod

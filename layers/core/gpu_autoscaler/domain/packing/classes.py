"""Pod classes: pods that ask for the same thing in the same way are packed as one count.

A burst of pending pods is mostly replicas: a Deployment's 200 identical inference pods, a job's 64
workers. Everything the packer decides depends only on requests and placement constraints, so pods that
share them are one class with a count, and the work per pass grows with the classes, not the pods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel

from gpu_autoscaler.domain.packing.fit import pod_requests
from gpu_autoscaler.domain.per_object import PerObject
from gpu_autoscaler.models.labels import normalized_selector
from gpu_autoscaler.models.requirements import normalized_terms

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpu_autoscaler.models.pods import PendingPod
    from gpu_autoscaler.models.requirements import NodeSelectorTerm
    from gpu_autoscaler.models.resources import Resources
    from gpu_autoscaler.models.taints import Toleration

__all__ = ["PodClass", "classify"]


@dataclass(eq=False)
class PodClass:
    """Pods with identical requests, node selector, affinity, tolerations, priority, gang, spread and preferred node
    affinity (which `SolvePass` turns into required affinity, per class, before it plans)."""

    index: int
    requests: Resources
    """Canonical requests, including the one `pods` slot."""
    node_selector: tuple[tuple[str, str], ...]
    affinity: tuple[NodeSelectorTerm, ...]
    """Both as the pods wrote them but for deprecated label keys, read as their stable ones
    (`labels.normalized_selector`, `requirements.normalized_terms`)."""
    tolerations: tuple[Toleration, ...]
    priority: int
    gang: str | None
    constraint_key: tuple[object, ...]
    """What decides where the class may go (not how much room it takes): its node selector, affinity and
    tolerations in plain tuples of the models' fields (`_plain`). The solver files class rows and selector masks
    under it, and `classify` groups by it: hashing and comparing the pydantic models themselves there made a
    consolidation replay ~4 % slower."""
    pods: list[PendingPod] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.pods)

    @property
    def example(self) -> PendingPod:
        return self.pods[0]


def _plain(value: object) -> object:
    """A model as the tuple of its fields' values (nested models and tuples likewise): for models of one type,
    equal exactly when they are."""
    if isinstance(value, BaseModel):
        return tuple(_plain(getattr(value, name)) for name in type(value).model_fields)
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


plain_of: PerObject[tuple[BaseModel, ...], object] = PerObject(_plain)
"""`_plain` of a pod's affinity terms or tolerations, kept per tuple: the consolidation search classifies the same
pods pass after pass, a class of one each, and making their plain tuples again cost a tenth of its solves."""


def classify(pods: Iterable[PendingPod]) -> list[PodClass]:
    """Group pods into classes, in order of first appearance (so plans are deterministic)."""
    by_raw: dict[tuple[object, ...], PodClass] = {}
    by_canonical: dict[tuple[object, ...], PodClass] = {}
    classes: list[PodClass] = []
    for pod in pods:
        # Plain tuples, not the models themselves: hashing and comparing a thousand pods' pydantic
        # tolerations costs more than the rest of the grouping. Tolerations by the identity of their tuple:
        # a document's equal lists of them are one tuple of models (`PendingPod` shares them), and equal
        # ones that are not still meet in `by_canonical`.
        affinity = pod.required_node_affinity
        group = pod.pod_group
        spread = tuple([(t.topology_key, t.max_skew, t.when_unsatisfiable, tuple(sorted(t.zone_counts.items())))
                        for t in pod.topology_spread]) if pod.topology_spread else ()
        raw = (
            tuple(pod.requests.items()),
            tuple(pod.node_selector.items()) if pod.node_selector else (),
            tuple([tuple([(r.key, r.operator, r.values) for r in term.match_expressions]) for term in affinity])
            if affinity else (),
            id(pod.tolerations),
            pod.priority,
            (pod.namespace, group.name) if group else None,
            spread,
            tuple([(t.weight, tuple([(r.key, r.operator, r.values) for r in t.preference.match_expressions]))
                   for t in pod.preferred_node_affinity]) if pod.preferred_node_affinity else (),
        )
        found = by_raw.get(raw)
        if found is None:
            requests = pod_requests(pod)
            selector = normalized_selector(pod.node_selector)
            affinity = normalized_terms(pod.required_node_affinity)
            constraint = (selector, plain_of(affinity), plain_of(pod.tolerations))
            canonical = (requests, constraint, pod.priority, pod.gang, spread, plain_of(pod.preferred_node_affinity))
            found = by_canonical.get(canonical)
            if found is None:
                found = PodClass(
                    index=len(classes),
                    requests=requests,
                    node_selector=selector,
                    affinity=affinity,
                    tolerations=pod.tolerations,
                    priority=pod.priority,
                    gang=pod.gang,
                    constraint_key=constraint,
                )
                classes.append(found)
                by_canonical[canonical] = found
            by_raw[raw] = found
        found.pods.append(pod)
    return classes

"""Typed reads of what the Kubernetes API server returned, through the `kubernetes` client's models.

The client's models declare every field Optional, because the same classes build requests, where any may be left
out. What the API server returns always has some of them: an object's `metadata` with its `name`, `uid` and
`resourceVersion`; a Pod's and a Node's `spec` and `status`; a list's `metadata.resourceVersion`; and a Node the
emulator's kubelet registered has its `spec.providerID` (`aws:///<zone>/<instance-id>`). These functions say so
once, for mypy, wherever the tests and the benchmarks read those fields, and name what is missing if it ever is
(rather than an AttributeError on None).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterable

    from kubernetes.client import (
        V1ListMeta,
        V1Node,
        V1NodeSpec,
        V1NodeStatus,
        V1ObjectMeta,
        V1Pod,
        V1PodDisruptionBudget,
        V1PodSpec,
        V1PodStatus,
        V1Taint,
    )
    from kubernetes.client.exceptions import ApiException

__all__ = ["allocatable", "bound_node", "capacity", "cordoned", "disruptions_allowed", "instance_id", "instance_nodes",
           "labels", "list_version", "metadata", "name", "node_spec", "node_status", "pod_spec",
           "pod_status", "refusal", "taints", "uid"]

T = TypeVar("T")


class _Object(Protocol):
    """Any object the API server stores (Pod, Node, Event, ...): what these reads need of it is its metadata."""

    @property
    def metadata(self) -> V1ObjectMeta | None: ...


class _Listing(Protocol):
    """Any list the API server returns (PodList, NodeList, ...)."""

    @property
    def metadata(self) -> V1ListMeta | None: ...


def _given(value: T | None, what: str) -> T:
    """`value`, which the API server always returns; if it ever does not, an error that names what is missing
    rather than an AttributeError on None further on."""
    if value is None:
        raise ValueError(f"{what}: not one the API server returned")
    return value


def metadata(obj: _Object) -> V1ObjectMeta:
    """`metadata`: every object the API server returns has it."""
    return _given(obj.metadata, f"a {type(obj).__name__} without metadata")


def name(obj: _Object) -> str:
    """`metadata.name` (the server fills it from `generateName` when a request has only that)."""
    return _given(metadata(obj).name, f"a {type(obj).__name__} without a name")


def uid(obj: _Object) -> str:
    """`metadata.uid`: the server gives every object one when it creates it."""
    return _given(metadata(obj).uid, f"{type(obj).__name__} {name(obj)} has no uid")


def labels(obj: _Object) -> dict[str, str]:
    """`metadata.labels`; an object without labels has none (the API server leaves the field out)."""
    return metadata(obj).labels or {}


def node_spec(node: V1Node) -> V1NodeSpec:
    """A Node's `spec`: the API server returns one with every Node."""
    return _given(node.spec, f"node {name(node)} has no spec")


def node_status(node: V1Node) -> V1NodeStatus:
    """A Node's `status`: the API server returns one with every Node."""
    return _given(node.status, f"node {name(node)} has no status")


def capacity(node: V1Node) -> dict[str, str]:
    """`status.capacity`: the kubelet reports it when it registers the Node."""
    return _given(node_status(node).capacity, f"node {name(node)} reports no capacity")


def allocatable(node: V1Node) -> dict[str, str]:
    """`status.allocatable`: the kubelet reports it when it registers the Node (an extended resource such as
    `nvidia.com/gpu` joins it once its device plugin has run)."""
    return _given(node_status(node).allocatable, f"node {name(node)} reports nothing allocatable")


def taints(node: V1Node) -> list[V1Taint]:
    """`spec.taints`; a node without taints has none (the API server leaves the field out)."""
    return node_spec(node).taints or []


def cordoned(node: V1Node) -> bool:
    """`spec.unschedulable`: the node takes no new pods (cordoned by a drain); absent means schedulable."""
    return bool(node_spec(node).unschedulable)


def instance_id(node: V1Node) -> str:
    """The EC2 instance the node runs on: the last part of its `spec.providerID`."""
    provider_id = node_spec(node).provider_id
    if not provider_id:
        raise ValueError(f"node {name(node)} has no providerID")
    return provider_id.rsplit("/", 1)[1]


def instance_nodes(nodes: Iterable[V1Node]) -> dict[str, str]:
    """Instance id → node name, for the nodes that have a providerID (every node the emulator's kubelet
    registered: it sets the field when it creates the Node)."""
    return {instance_id(n): name(n) for n in nodes if node_spec(n).provider_id}


def pod_spec(pod: V1Pod) -> V1PodSpec:
    """A Pod's `spec` (its `nodeName` once bound): the API server returns one with every Pod."""
    return _given(pod.spec, f"pod {name(pod)} has no spec")


def bound_node(pod: V1Pod) -> str:
    """`spec.nodeName` of a pod the caller knows is bound (to look its node up); an unbound pod is an error here."""
    node = pod_spec(pod).node_name
    if node is None:
        raise ValueError(f"pod {name(pod)} is not bound to a node")  # the caller's expectation, not the server's
    return node


def pod_status(pod: V1Pod) -> V1PodStatus:
    """A Pod's `status` (its phase and conditions): the API server sets one when it creates the Pod."""
    return _given(pod.status, f"pod {name(pod)} has no status")


def refusal(error: ApiException) -> dict[str, Any]:
    """The Status the API server refused a request with (`reason`, `message`, `details`): the body of its answer,
    which the client keeps as text on the exception."""
    if error.body is None:
        raise ValueError(f"a refusal ({error.status}) without a body: the API server always sends its Status")
    status: dict[str, Any] = json.loads(error.body)
    return status


def disruptions_allowed(budget: V1PodDisruptionBudget) -> int | None:
    """A PodDisruptionBudget's `status.disruptionsAllowed`: None until the disruption controller has written the
    budget's status (a just-created budget has none)."""
    return budget.status.disruptions_allowed if budget.status is not None else None


def list_version(listing: _Listing) -> str:
    """A list's `metadata.resourceVersion`: where a watch starts to see every later change."""
    return _given(listing.metadata.resource_version if listing.metadata is not None else None,
                  "a list without a resourceVersion")

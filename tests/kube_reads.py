"""Typed reads of what the Kubernetes API server returned, through the `kubernetes` client's models.

The client's models declare every field Optional, because the same classes build requests, where any may be left
out. What the API server returns always has some of them: a Node's `metadata` and `metadata.name`, its `spec`, a
list's `metadata.resourceVersion`; and a Node the emulator's kubelet registered has its `spec.providerID`
(`aws:///<zone>/<instance-id>`). These functions say so once, for mypy, wherever the chaos suite and the benchmarks
read those fields, and name what is missing if it ever is (rather than an AttributeError on None).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from kubernetes.client import V1Node, V1NodeSpec, V1ObjectMeta, V1PodList

__all__ = ["cordoned", "instance_id", "instance_nodes", "labels", "list_version", "node_name"]


def _metadata(node: V1Node) -> V1ObjectMeta:
    if node.metadata is None:
        raise ValueError("a Node without metadata: not one the API server returned")
    return node.metadata


def _spec(node: V1Node) -> V1NodeSpec:
    if node.spec is None:
        raise ValueError(f"node {node_name(node)} has no spec: not one the API server returned")
    return node.spec


def node_name(node: V1Node) -> str:
    """`metadata.name`."""
    name = _metadata(node).name
    if name is None:
        raise ValueError("a Node without a name: not one the API server returned")
    return name


def labels(node: V1Node) -> dict[str, str]:
    """`metadata.labels`; a node without labels has none (the API server leaves the field out)."""
    return _metadata(node).labels or {}


def cordoned(node: V1Node) -> bool:
    """`spec.unschedulable`: the node takes no new pods (cordoned by a drain); absent means schedulable."""
    return bool(_spec(node).unschedulable)


def instance_id(node: V1Node) -> str:
    """The EC2 instance the node runs on: the last part of its `spec.providerID`."""
    provider_id = _spec(node).provider_id
    if not provider_id:
        raise ValueError(f"node {node_name(node)} has no providerID")
    return provider_id.rsplit("/", 1)[1]


def instance_nodes(nodes: Iterable[V1Node]) -> dict[str, str]:
    """Instance id → node name, for the nodes that have a providerID (every node the emulator's kubelet
    registered: it sets the field when it creates the Node)."""
    return {instance_id(n): node_name(n) for n in nodes if _spec(n).provider_id}


def list_version(listing: V1PodList) -> str:
    """A list's `metadata.resourceVersion`: where a watch starts to see every later change."""
    version = listing.metadata.resource_version if listing.metadata is not None else None
    if version is None:
        raise ValueError("a list without a resourceVersion: not one the API server returned")
    return version

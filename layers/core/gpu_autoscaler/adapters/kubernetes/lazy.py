"""A `ClusterAPI` that connects on first use.

Building the Kubernetes client of an EKS cluster costs calls (DescribeCluster for the CA, an STS presign) and
can fail when the cluster is unreachable. Most interruption notices are about instances this cluster does
not own and need no Kubernetes at all, so the functions build the client only when a call needs it: those
notices are acknowledged even while the API server is away, and a failed connection is tried again on the
next call rather than poisoning the execution environment.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod, EvictionOutcome, VolumeAttachment
    from gpu_autoscaler.models.taints import Taint
    from gpu_autoscaler.ports import ClusterAPI

__all__ = ["LazyCluster"]


class LazyCluster:
    def __init__(self, connect: Callable[[], ClusterAPI]) -> None:
        self._connect = connect
        self._cluster: ClusterAPI | None = None
        self._lock = threading.Lock()

    @property
    def connected(self) -> bool:
        return self._cluster is not None

    def _api(self) -> ClusterAPI:
        with self._lock:
            if self._cluster is None:
                self._cluster = self._connect()
            return self._cluster

    def list_nodes(self) -> list[ClusterNode]:
        return self._api().list_nodes()

    def list_pods(self, node_name: str | None = None, *, volume_zones: bool = True) -> list[ClusterPod]:
        return self._api().list_pods(node_name, volume_zones=volume_zones)

    def cordon(self, node_name: str, taint: Taint) -> None:
        self._api().cordon(node_name, taint)

    def taint(self, node_name: str, taint: Taint) -> None:
        self._api().taint(node_name, taint)

    def untaint(self, node_name: str, taint: Taint, *, unless_cordoned: bool = False) -> bool:
        return self._api().untaint(node_name, taint, unless_cordoned=unless_cordoned)

    def evict(self, pod: ClusterPod) -> EvictionOutcome:
        return self._api().evict(pod)

    def delete_pod(self, pod: ClusterPod, grace_period_seconds: int | None = None) -> None:
        self._api().delete_pod(pod, grace_period_seconds)

    def volume_attachments(self, node_name: str) -> list[VolumeAttachment]:
        return self._api().volume_attachments(node_name)

    def delete_node(self, node_name: str) -> None:
        self._api().delete_node(node_name)

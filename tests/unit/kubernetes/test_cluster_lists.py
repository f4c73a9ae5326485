"""How the Kubernetes adapter lists: each page parsed before the next is asked for (only one page's raw JSON held
at a time, however large the cluster), an expired continue token (410 Gone) starting the list again from nothing,
and the cluster-wide pod list leaving finished pods on the server."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster, node_from_json, pod_from_json
from gpu_autoscaler.adapters.kubernetes.rest import KubernetesHttpError, KubernetesRest
from gpu_autoscaler.adapters.memory.cluster import MemoryCluster


class _Raw(dict[str, Any]):
    """A decoded pod whose lifetime a weak reference can watch (a plain dict cannot be weakly referenced)."""


def _pod(i: int) -> _Raw:
    return _Raw(metadata={"uid": f"uid-{i}", "name": f"p-{i}", "namespace": "default",
                          "creationTimestamp": "2026-11-29T10:00:00Z"},
                spec={"nodeName": f"n-{i % 7}", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
                status={"phase": "Running"})


class _PagedRest(KubernetesRest):
    """Serves `pages` pages of `per_page` pods, the continue token being the next page's index; `gone_at`: the
    request (by count) answered 410 Gone, as the API server answers a continue token past compaction."""

    def __init__(self, pages: int, per_page: int, gone_at: int | None = None) -> None:
        self.server_date = None
        self.pages, self.per_page, self.gone_at = pages, per_page, gone_at
        self.refs: list[weakref.ref[_Raw]] = []
        self.alive_at_request: list[int] = []
        self.queries: list[dict[str, Any]] = []

    def get(self, target: str, query: Any = None) -> dict[str, Any]:
        self.queries.append(dict(query or {}))
        if len(self.queries) == self.gone_at:
            raise KubernetesHttpError("GET", target, 410, "Gone", None)
        gc.collect()
        self.alive_at_request.append(sum(r() is not None for r in self.refs))
        index = int((query or {}).get("continue") or 0)
        items = [_pod(index * self.per_page + i) for i in range(self.per_page)]
        self.refs += [weakref.ref(p) for p in items]
        more = index + 1 < self.pages
        return {"metadata": {"continue": str(index + 1)} if more else {}, "items": items}


def test_raw_pages_are_released_as_the_list_goes_on() -> None:
    """Parsing each page before the next is fetched keeps one page of raw JSON at a time, not the whole cluster
    (the API serves lists in chunks so that clients need not hold them whole: kubernetes.io api-concepts,
    "Retrieving large results sets in chunks")."""
    rest = _PagedRest(pages=5, per_page=50)
    pods = KubernetesCluster(rest, page_size=50).list_pods()
    assert len(pods) == 250
    assert max(rest.alive_at_request) == 0, f"raw pods of earlier pages still held: {rest.alive_at_request}"


def test_an_expired_continue_token_lists_again_from_nothing() -> None:
    """The third page's token expired (410): the list starts again without its first pages' pods twice."""
    rest = _PagedRest(pages=3, per_page=4, gone_at=3)
    pods = KubernetesCluster(rest, page_size=4).list_pods()
    assert sorted(p.uid for p in pods) == sorted(f"uid-{i}" for i in range(12))
    assert [q.get("continue") for q in rest.queries] == [None, "1", "2", None, "1", "2"]


def test_a_list_whose_tokens_keep_expiring_fails_with_the_410() -> None:
    class _Gone(_PagedRest):
        def get(self, target: str, query: Any = None) -> dict[str, Any]:
            if (query or {}).get("continue"):
                raise KubernetesHttpError("GET", target, 410, "Gone", None)
            return super().get(target, query)

    with pytest.raises(KubernetesHttpError) as raised:
        KubernetesCluster(_Gone(pages=2, per_page=1)).list_pods()
    assert raised.value.status == 410


def test_the_cluster_wide_pod_list_leaves_finished_pods_on_the_server() -> None:
    """Succeeded and Failed pods hold nothing on a node (`ClusterPod.finished`) and nothing that reads the
    cluster-wide list counts them; `status.phase` is a field selector pods support (kubernetes.io "Field
    Selectors"), so the API server leaves them out. A node's own list (a drain's) still has them."""
    rest = _PagedRest(pages=1, per_page=1)
    cluster = KubernetesCluster(rest)
    cluster.list_pods()
    cluster.list_pods("n-1")
    assert rest.queries[0]["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed"
    assert rest.queries[1]["fieldSelector"] == "spec.nodeName=n-1"


def test_the_memory_cluster_lists_pods_as_the_api_server_is_asked_to() -> None:
    """The tests' `MemoryCluster` keeps the port's contract: finished pods out of the cluster-wide list, in a
    node's."""
    pods = [pod_from_json({**_pod(i), "status": {"phase": phase}})
            for i, phase in enumerate(("Succeeded", "Failed", "Running", "Pending"))]
    node = node_from_json({"metadata": {"name": "n-1"}, "spec": {}, "status": {}})
    cluster = MemoryCluster([node], [p.model_copy(update={"node_name": "n-1"}) for p in pods])
    assert [p.phase for p in cluster.list_pods()] == ["Running", "Pending"]
    assert len(cluster.list_pods("n-1")) == 4


def _zone_affinity(key: str, *zones: str) -> dict[str, Any]:
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In",
                                                                       "values": list(zones)}]}]}}


class _VolumesRest(KubernetesRest):
    """Pods on `n-1` with their claims, the claims, and their volumes: the EBS CSI driver's zone key on one,
    the stable key on another, none on a third (an NFS volume, usable anywhere)."""

    def __init__(self) -> None:
        self.server_date = None
        self.targets: list[str] = []

    def get(self, target: str, query: Any = None) -> dict[str, Any]:
        self.targets.append(target)
        resource = target.rsplit("/", 1)[-1]
        claims = [("ml", "home-nb-0", "pv-a"), ("ml", "cache", "pv-b"), ("ml", "shared", "pv-nfs"),
                  ("other", "home-nb-0", "pv-b")]
        served: dict[str, list[dict[str, Any]]] = {
            "pods": [self._pod("nb-0", "home-nb-0", "shared"), self._pod("nb-1", "home-nb-0", "cache"),
                     self._pod("plain")],
            "persistentvolumeclaims": [{"metadata": {"namespace": ns, "name": n}, "spec": {"volumeName": pv}}
                                       for ns, n, pv in claims],
            "persistentvolumes": [
                {"metadata": {"name": "pv-a"},
                 "spec": {"nodeAffinity": _zone_affinity("topology.ebs.csi.aws.com/zone", "us-east-1a")}},
                {"metadata": {"name": "pv-b"},
                 "spec": {"nodeAffinity": _zone_affinity("topology.kubernetes.io/zone", "us-east-1b")}},
                {"metadata": {"name": "pv-nfs"}, "spec": {}}],
        }
        return {"metadata": {}, "items": served[resource]}

    @staticmethod
    def _pod(name: str, *claims: str) -> dict[str, Any]:
        return {"metadata": {"uid": name, "name": name, "namespace": "ml"},
                "spec": {"nodeName": "n-1", "containers": [{"name": "c"}],
                         "volumes": [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]},
                "status": {"phase": "Running"}}


def test_bound_pods_carry_the_zones_their_volumes_attach_in_from_one_list_of_claims_and_one_of_volumes() -> None:
    """A pod recreated elsewhere keeps its claims, and kube-scheduler's VolumeBinding filter holds it to the zones
    its bound PersistentVolumes' node affinity allows (an EBS volume's zone): what a replacement or a move must
    keep. Read with one list of claims and one of volumes, however many pods have claims."""
    rest = _VolumesRest()
    pods = {p.name: p for p in KubernetesCluster(rest).list_pods("n-1")}
    assert pods["nb-0"].volume_zones == ("us-east-1a",)  # its NFS volume allows any zone
    assert pods["nb-1"].volume_zones == ()  # volumes in two zones: no node can attach both
    assert pods["plain"].volume_zones is None
    assert sorted(t.rsplit("/", 1)[-1] for t in rest.targets) == ["persistentvolumeclaims", "persistentvolumes",
                                                                  "pods"]


def test_pods_without_claims_cost_no_volume_list() -> None:
    rest = _PagedRest(pages=1, per_page=3)
    assert all(p.volume_zones is None for p in KubernetesCluster(rest).list_pods())
    assert len(rest.queries) == 1


def test_a_list_that_does_not_need_volume_zones_reads_no_claims_or_volumes() -> None:
    """The drain lists its node's pods on every pass (every few seconds while evicting) and never reads their
    volumes' zones: its list costs the pods alone, however many of them have claims."""
    rest = _VolumesRest()
    pods = KubernetesCluster(rest).list_pods("n-1", volume_zones=False)
    assert {p.name for p in pods} >= {"nb-0", "nb-1", "plain"} and all(p.volume_zones is None for p in pods)
    assert [t.rsplit("/", 1)[-1] for t in rest.targets] == ["pods"]

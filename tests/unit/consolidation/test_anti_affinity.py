"""Consolidation moves bound pods as kube-scheduler will place them again: required pod anti-affinity on the node
(`kubernetes.io/hostname`) is honoured both ways, as Karpenter's `SimulateScheduling` does through its scheduler's
`Topology` (kubernetes-sigs/karpenter pkg/controllers/disruption/helpers.go)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gpu_autoscaler.adapters.kubernetes.cluster import pod_from_json
from tests.unit.agent.builders import make_pod as raw_pod
from tests.unit.consolidation.builders import Cluster, pool_config
from tests.unit.packing.builders import TOLERATE_GPU

HOSTNAME = "kubernetes.io/hostname"


def _apart(selector: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": HOSTNAME, "labelSelector": selector, **extra}]}}


def _bound(cluster: Cluster, node: str, name: str, labels: dict[str, str],
           affinity: dict[str, Any] | None = None) -> None:
    """A running ReplicaSet pod read from the API as the consolidate service reads it (`pod_from_json`)."""
    raw = raw_pod(name=name, gpus=1, cpu="1", memory="4Gi", tolerations=[TOLERATE_GPU], labels=labels,
                  node_name=node, phase="Running", unschedulable=False)
    if affinity is not None:
        raw["spec"]["affinity"] = affinity
    raw["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "r"}]
    cluster.pods.append(pod_from_json(raw))


def _lonely_and_roomy() -> tuple[Cluster, str, str]:
    """A pod alone on a g5.12xlarge, and a young g5.48xlarge (too young to go itself) with room to spare."""
    cluster = Cluster(pool_config())
    lonely = cluster.node("g5.12xlarge")
    roomy = cluster.node("g5.48xlarge", age=timedelta(minutes=5))
    cluster.pods_on(roomy, 3, labels={"app": "other"})
    return cluster, lonely, roomy


def _moves(cluster: Cluster) -> list[tuple[str, tuple[str, ...], dict[str, tuple[str, ...]]]]:
    return [(d.action, d.nodes, dict(d.destinations)) for d in cluster.consolidate().decisions]


def test_consolidation_does_not_move_a_pod_onto_the_node_of_the_pod_it_repels() -> None:
    """Replicas repelling each other per node: the lonely one is not planned beside its sibling (before, it was,
    and kube-scheduler left it Pending: an eviction loop with the packer)."""
    cluster, lonely, roomy = _lonely_and_roomy()
    for node in (lonely, roomy):
        _bound(cluster, node, f"web-{node[:12]}", {"app": "web"}, _apart({"matchLabels": {"app": "web"}}))
    moves = _moves(cluster)
    assert not any(roomy in destinations for _, _, destinations in moves), moves


def test_consolidation_does_not_move_a_pod_onto_a_node_whose_pod_repels_it() -> None:
    """The moved pod has no anti-affinity; a pod on the roomy node repels pods like it (kube-scheduler's
    InterPodAffinity filter checks the existing pods' required anti-affinity too)."""
    cluster, lonely, roomy = _lonely_and_roomy()
    _bound(cluster, lonely, "batch-0", {"app": "batch"})
    _bound(cluster, roomy, "web-0", {"app": "web"}, _apart({"matchLabels": {"app": "batch"}}))
    moves = _moves(cluster)
    assert not any(roomy in destinations for _, _, destinations in moves), moves


def test_a_pod_moves_beside_pods_its_anti_affinity_does_not_select() -> None:
    """Anti-affinity against another namespace's pods, or other labels, keeps nothing from the roomy node."""
    cluster, lonely, roomy = _lonely_and_roomy()
    _bound(cluster, lonely, "web-0", {"app": "web"},
           _apart({"matchLabels": {"app": "other"}}, namespaces=["elsewhere"]))
    moves = _moves(cluster)
    assert any(roomy in destinations for _, _, destinations in moves), moves


def test_a_term_with_a_namespace_selector_keeps_the_move_off_nodes_its_labels_match() -> None:
    """Which namespaces a non-empty `namespaceSelector` selects depends on their labels, which consolidation does not
    read: a pod its label selector matches, in any namespace, counts (the move is not planned there)."""
    cluster, lonely, roomy = _lonely_and_roomy()
    _bound(cluster, lonely, "web-0", {"app": "web"},
           _apart({"matchLabels": {"app": "other"}}, namespaceSelector={"matchLabels": {"team": "x"}}))
    moves = _moves(cluster)
    assert not any(roomy in destinations for _, _, destinations in moves), moves


def test_two_moved_pods_that_repel_each_other_are_not_planned_onto_one_new_node() -> None:
    """Two replicas, each alone on a g5.12xlarge: one cheaper node could hold both, but they repel each other."""
    cluster = Cluster(pool_config())
    nodes = [cluster.node("g5.12xlarge") for _ in range(2)]
    uids = []
    for node in nodes:
        _bound(cluster, node, f"web-{node[:12]}", {"app": "web"}, _apart({"matchLabels": {"app": "web"}}))
        uids.append(cluster.pods[-1].uid)
    for decision in cluster.consolidate().decisions:
        for claim in decision.replacements:
            assert not set(uids) <= set(claim.pods), (decision.nodes, [c.pods for c in decision.replacements])

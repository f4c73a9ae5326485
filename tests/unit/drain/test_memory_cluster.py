from __future__ import annotations

import pytest

from gpu_autoscaler.adapters.memory.cluster import DisruptionBudget, MemoryCluster
from gpu_autoscaler.errors import NodeNotFound
from gpu_autoscaler.models.taints import Taint
from tests.unit.drain.builders import make_node, make_pod

NODE = "ip-10-0-1-5.ec2.internal"
TAINT = Taint(key="gpu-autoscaler/disrupted", value="drain", effect="NoSchedule")


def cluster_with(*pods_names: str, **kwargs: object) -> MemoryCluster:
    return MemoryCluster([make_node()], [make_pod(n) for n in pods_names], **kwargs)  # type: ignore[arg-type]


def test_cordon_sets_unschedulable_and_adds_taint_once() -> None:
    cluster = cluster_with()
    cluster.cordon(NODE, TAINT)
    cluster.cordon(NODE, TAINT)
    node = cluster.get_node(NODE)
    assert node is not None and node.unschedulable
    assert node.taints.count(TAINT) == 1
    assert cluster.calls.cordoned == [NODE, NODE]


def test_cordon_of_missing_node_raises_node_not_found() -> None:
    with pytest.raises(NodeNotFound):
        MemoryCluster().cordon("nope", TAINT)


def test_evict_removes_pod_and_reports_gone_afterwards() -> None:
    cluster = cluster_with("web-0")
    pod = cluster.list_pods(NODE)[0]
    assert cluster.evict(pod).evicted
    again = cluster.evict(pod)
    assert again.gone and not again.evicted
    assert cluster.list_pods(NODE) == []
    assert cluster.calls.evicted == ["team-a/web-0"]


def test_budget_blocks_until_replicas_are_healthy_again() -> None:
    cluster = cluster_with("web-0", "web-1", recreate_evicted=True)
    cluster.add_budget(DisruptionBudget(name="web", namespace="team-a", match_labels={"app": "web"}, min_available=1))
    first, second = cluster.list_pods(NODE)
    assert cluster.evict(first).evicted
    outcome = cluster.evict(second)
    assert outcome.blocked and "disruption budget team-a/web" in outcome.message
    # The controller's replacement of the first pod starts elsewhere: the budget has room again.
    cluster.add_node(make_node("other", instance_id="i-0bbb"))
    replacement = cluster.pending_pods()[0]
    cluster.bind(replacement.uid, "other")
    assert cluster.evict(second).evicted


def test_max_unavailable_budget_counts_expected_replicas() -> None:
    cluster = cluster_with("web-0", "web-1", "web-2")
    cluster.add_budget(DisruptionBudget(name="web", namespace="team-a", match_labels={"app": "web"},
                                        max_unavailable=1))
    pods = cluster.list_pods(NODE)
    assert cluster.evict(pods[0]).evicted
    assert cluster.evict(pods[1]).blocked


def test_blocker_hook_refuses_and_can_be_cleared() -> None:
    cluster = cluster_with("web-0")
    cluster.add_blocker(lambda pod: "held" if pod.name == "web-0" else None)
    pod = cluster.list_pods(NODE)[0]
    assert cluster.evict(pod).blocked
    assert cluster.calls.blocked == ["team-a/web-0"]
    cluster.clear_blockers()
    assert cluster.evict(pod).evicted


def test_delete_pod_bypasses_budgets() -> None:
    cluster = cluster_with("web-0")
    cluster.add_budget(DisruptionBudget(name="web", namespace="team-a", match_labels={"app": "web"}, min_available=1))
    pod = cluster.list_pods(NODE)[0]
    assert cluster.evict(pod).blocked
    cluster.delete_pod(pod)
    cluster.delete_pod(pod)
    assert cluster.list_pods() == []
    assert cluster.calls.deleted_pods == ["team-a/web-0"]


def test_recreate_skips_daemonset_and_mirror_pods() -> None:
    cluster = MemoryCluster([make_node()], [make_pod("ds-0", owner_kind="DaemonSet"),
                                            make_pod("static-0", owner_kind="Node", mirror=True),
                                            make_pod("job-0", owner_kind="Job")], recreate_evicted=True)
    cluster.delete_node(NODE)
    assert [p.name for p in cluster.pending_pods()] == ["job-0-r1"]
    assert cluster.calls.deleted_nodes == [NODE]
    cluster.delete_node(NODE)
    assert cluster.calls.deleted_nodes == [NODE]


def test_fail_next_raises_once() -> None:
    cluster = cluster_with("web-0")
    cluster.fail_next("evict", ConnectionError("api server gone"))
    pod = cluster.list_pods(NODE)[0]
    with pytest.raises(ConnectionError):
        cluster.evict(pod)
    assert cluster.evict(pod).evicted


def test_update_node_and_bind_act_like_a_kubelet() -> None:
    cluster = MemoryCluster([make_node(ready=False)], [make_pod("train-0", node=None)])
    assert cluster.update_node(NODE, ready=True).ready
    bound = cluster.bind("uid-train-0", NODE)
    assert bound.phase == "Running" and cluster.list_pods(NODE) == [bound]
    with pytest.raises(NodeNotFound):
        cluster.add_pod(make_pod("lost", node="ghost"))

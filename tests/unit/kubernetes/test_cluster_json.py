"""What the Kubernetes adapter reads of a Pod and a Node for drains: termination, priority class, start time,
claims, grace period, node annotations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpu_autoscaler.adapters.kubernetes.cluster import node_from_json, pod_from_json


def test_a_terminating_pod_reads_with_its_deletion_time_grace_class_start_and_claims() -> None:
    pod = pod_from_json({
        "metadata": {"uid": "u1", "namespace": "ml", "name": "db-0", "deletionTimestamp": "2026-11-22T10:00:30Z",
                     "annotations": {"karpenter.sh/do-not-disrupt": "30m"}},
        "spec": {"nodeName": "n1", "priorityClassName": "system-node-critical", "terminationGracePeriodSeconds": 120,
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}},
                             {"name": "tmp", "emptyDir": {}}],
                 "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running", "startTime": "2026-11-22T09:00:00Z"},
    })
    assert pod.terminating and pod.deletion_timestamp == datetime(2026, 11, 22, 10, 0, 30, tzinfo=UTC)
    assert pod.critical and pod.termination_grace_period_seconds == 120
    assert pod.volume_claims == ("data-db-0",)
    assert not pod.do_not_disrupt_active(datetime(2026, 11, 22, 10, 0, tzinfo=UTC))  # started an hour ago
    plain = pod_from_json({"metadata": {"uid": "u2", "name": "web-0"}, "spec": {}, "status": {}})
    assert not plain.terminating and plain.termination_grace_period_seconds == 30 and not plain.critical


def test_a_node_reads_with_its_annotations() -> None:
    node = node_from_json({"metadata": {"name": "n1", "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
                           "spec": {}, "status": {}})
    assert node.do_not_disrupt


def _resizing(condition_reason: str | None) -> dict[str, Any]:
    pending = {"type": "PodResizePending", "status": "True", "reason": condition_reason}
    conditions = [pending] if condition_reason else []
    return {
        "metadata": {"uid": "u3", "namespace": "ml", "name": "train-0"},
        "spec": {"nodeName": "n1",
                 "initContainers": [{"name": "proxy", "restartPolicy": "Always",
                                     "resources": {"requests": {"cpu": "1"}}}],
                 "containers": [{"name": "main", "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}]},
        "status": {"phase": "Running", "conditions": conditions,
                   "initContainerStatuses": [{"name": "proxy", "allocatedResources": {"cpu": "500m"},
                                              "resources": {"requests": {"cpu": "500m"}}}],
                   "containerStatuses": [{"name": "main", "allocatedResources": {"cpu": "4", "memory": "8Gi"},
                                          "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]},
    }


def test_a_bound_pod_in_the_middle_of_a_resize_is_sized_as_the_scheduler_sizes_it() -> None:
    """In-place resize: the kubelet holds max(spec requests, the status' requests, allocatedResources) of each
    container until the resize is done, and kube-scheduler and Karpenter (`resources.Ceiling`, `PodRequests` with
    `UseStatusResources`) count that; an infeasible resize counts only what the kubelet holds (k8s.io
    component-helpers resource/helpers.go `determineContainerReqs`). Here the main container is being resized down
    from 4 CPUs to 2 and its sidecar up from 0.5 to 1."""
    assert pod_from_json(_resizing("Deferred")).requests["cpu"] == 5000  # max(2, 4) + max(1, 0.5)
    assert pod_from_json(_resizing(None)).requests["cpu"] == 5000
    assert pod_from_json(_resizing("Infeasible")).requests["cpu"] == 4500  # what the kubelet holds: 4 + 0.5


def test_a_pod_the_scheduler_found_no_node_for_reads_as_unschedulable() -> None:
    """PodScheduled False with reason Unschedulable, as the agent selects what it reports; any other reason
    (SchedulingGated while Kueue has not admitted the pod) is not, nor is a pod without the condition yet."""
    def pod(*conditions: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"uid": "u", "name": "train-0"}, "spec": {},
                "status": {"phase": "Pending", "conditions": list(conditions)}}

    def scheduled(reason: str) -> dict[str, str]:
        return {"type": "PodScheduled", "status": "False", "reason": reason}

    assert pod_from_json(pod(scheduled("Unschedulable"))).unschedulable
    assert not pod_from_json(pod(scheduled("SchedulingGated"))).unschedulable
    assert not pod_from_json(pod()).unschedulable


def test_a_bound_pod_reads_with_its_preferred_node_affinity() -> None:
    """Replacements and consolidation plan a bound pod through the packer, which honours its preferences as
    Karpenter's scheduler does for the pods it simulates moving (see `packing.preferences`)."""
    prefer = {"weight": 60, "preference": {"matchExpressions": [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}}
    pod = pod_from_json({"metadata": {"uid": "u", "name": "llm-0"},
                         "spec": {"nodeName": "n1", "affinity": {"nodeAffinity": {
                             "preferredDuringSchedulingIgnoredDuringExecution": [prefer]}}},
                         "status": {"phase": "Running"}})
    [term] = pod.preferred_node_affinity
    assert term.weight == 60 and term.preference.match_expressions[0].values == ("on-demand",)


def test_a_bound_pod_reads_with_its_required_anti_affinity_on_the_node() -> None:
    """Consolidation keeps a moved pod off nodes kube-scheduler's InterPodAffinity refuses it; terms on other keys,
    and terms without a label selector (they select no pod), are not read."""
    apart = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}},
             "namespaces": ["a", "b"]}
    pod = pod_from_json({"metadata": {"uid": "u", "name": "web-0", "namespace": "a", "labels": {"app": "web"}},
                         "spec": {"nodeName": "n1", "affinity": {"podAntiAffinity": {
                             "requiredDuringSchedulingIgnoredDuringExecution": [
                                 apart, {"topologyKey": "kubernetes.io/hostname"},
                                 {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {}}]}}},
                         "status": {"phase": "Running"}})
    [term] = pod.pod_anti_affinity
    assert term.label_selector == {"matchLabels": {"app": "web"}} and term.namespaces == ("a", "b")
    assert term.counts("a", "b", {"app": "web"}) and not term.counts("a", "c", {"app": "web"})

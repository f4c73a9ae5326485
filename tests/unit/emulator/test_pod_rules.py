"""What the local API server refuses and defaults in a pod, as a real one does (cited in `kube_pod_rules`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.emulator.kube_apiserver import ApiServer
from gpu_autoscaler.emulator.kube_objects import NAMESPACES, PODS, ApiError
from gpu_autoscaler.emulator.kube_patch import JSON_PATCH, MERGE_PATCH
from gpu_autoscaler.emulator.kube_scheduler import pod_requests
from gpu_autoscaler.emulator.kube_store import Store


@pytest.fixture
def api() -> ApiServer:
    server = ApiServer(Store(FixedClock(datetime(2026, 11, 22, tzinfo=UTC))))
    server.create(NAMESPACES, "", {"metadata": {"name": "team-a"}})
    return server


def pod(name: str, resources: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [
        {"name": "main", "image": "trainer:1", "resources": resources}], **spec}}


def test_a_gpu_request_without_a_limit_is_refused(api: ApiServer) -> None:
    """"You cannot specify GPU requests without specifying limits" (kubernetes.io, Schedule GPUs)."""
    with pytest.raises(ApiError) as refused:
        api.create(PODS, "team-a", pod("p", {"requests": {"nvidia.com/gpu": "1"}}))
    assert refused.value.code == 422
    assert refused.value.message == ('Pod "p" is invalid: spec.containers[0].resources.limits: Required value: '
                                     "Limit must be set for non overcommitable resources")


@pytest.mark.parametrize(("resources", "why"), [
    ({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
     "spec.containers[0].resources.requests: Invalid value: \"1\": must be equal to nvidia.com/gpu limit of 2"),
    ({"limits": {"nvidia.com/gpu": "500m"}},
     "spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: \"500m\": must be an integer"),
])
def test_an_extended_resource_is_a_whole_number_and_its_request_its_limit(
        api: ApiServer, resources: dict[str, Any], why: str) -> None:
    with pytest.raises(ApiError) as refused:
        api.create(PODS, "team-a", pod("p", resources))
    assert refused.value.code == 422 and why in refused.value.message


def test_requests_default_to_limits(api: ApiServer) -> None:
    """"If you specify a limit for a resource, but do not specify any request ... Kubernetes copies the limit you
    specified and uses it as the requested value" (kubernetes.io, Resource Management for Pods and Containers)."""
    created = api.create(PODS, "team-a", pod("p", {"requests": {"cpu": "1"},
                                                    "limits": {"cpu": "2", "nvidia.com/gpu": "1"}}))
    assert created["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1", "nvidia.com/gpu": "1"}


@pytest.mark.parametrize("change", [
    {"spec": {"nodeSelector": {"a": "b"}}},
    {"spec": {"containers": [{"name": "main", "image": "trainer:1", "resources": {"limits": {"cpu": "4"}}}]}},
    {"spec": {"priority": 5}},
])
def test_a_pod_update_may_change_only_the_fields_kubernetes_allows(api: ApiServer, change: dict[str, Any]) -> None:
    api.create(PODS, "team-a", pod("p", {"limits": {"cpu": "1"}}, tolerations=[{"key": "a", "operator": "Exists"}]))
    with pytest.raises(ApiError) as refused:
        api.patch(PODS, "team-a", "p", change, MERGE_PATCH)
    assert refused.value.code == 422
    assert refused.value.message.startswith(
        'Pod "p" is invalid: spec: Forbidden: pod updates may not change fields other than '
        "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
        "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if "
        "it was previously negative)")


def test_a_pod_update_may_not_take_a_toleration_away(api: ApiServer) -> None:
    api.create(PODS, "team-a", pod("p", {"limits": {"cpu": "1"}}, tolerations=[{"key": "a", "operator": "Exists"}]))
    with pytest.raises(ApiError) as refused:
        api.patch(PODS, "team-a", "p", {"spec": {"tolerations": [{"key": "b", "operator": "Exists"}]}}, MERGE_PATCH)
    assert refused.value.message == ('Pod "p" is invalid: spec.tolerations: Forbidden: existing toleration can not '
                                     "be modified except its tolerationSeconds")


def test_a_pod_update_may_add_tolerations_change_images_and_remove_scheduling_gates(api: ApiServer) -> None:
    api.create(PODS, "team-a", pod("p", {"limits": {"cpu": "1"}}, schedulingGates=[{"name": "kueue"}]))
    api.patch(PODS, "team-a", "p", [{"op": "add", "path": "/spec/tolerations", "value": [
        {"key": "gpu-autoscaler/gang", "operator": "Equal", "value": "g", "effect": "NoSchedule"}]}], JSON_PATCH)
    api.patch(PODS, "team-a", "p", {"spec": {"activeDeadlineSeconds": 60, "schedulingGates": None,
                                             "containers": [{"name": "main", "image": "trainer:2",
                                                             "resources": {"limits": {"cpu": "1"}}}]}}, MERGE_PATCH)
    updated = api.get(PODS, "team-a", "p")
    assert updated["spec"]["containers"][0]["image"] == "trainer:2"
    assert "schedulingGates" not in updated["spec"] and updated["spec"]["activeDeadlineSeconds"] == 60


def test_a_gated_pod_may_gain_node_selector_labels_but_not_lose_them(api: ApiServer) -> None:
    api.create(PODS, "team-a", pod("p", {"limits": {"cpu": "1"}}, schedulingGates=[{"name": "kueue"}],
                                   nodeSelector={"a": "1"}))
    api.patch(PODS, "team-a", "p", {"spec": {"nodeSelector": {"b": "2"}}}, MERGE_PATCH)
    with pytest.raises(ApiError):
        api.patch(PODS, "team-a", "p", {"spec": {"nodeSelector": {"a": None}}}, MERGE_PATCH)
    with pytest.raises(ApiError):
        api.patch(PODS, "team-a", "p", {"spec": {"schedulingGates": [{"name": "kueue"}, {"name": "more"}]}},
                  MERGE_PATCH)


def test_the_scheduler_counts_pod_level_requests() -> None:
    """"kube-scheduler uses the pod-level requests" when a pod sets them (kubernetes.io, Assign Pod-level CPU and
    memory resources); resources the pod level does not name come from its containers."""
    spec = {"containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"},
                                                       "limits": {"nvidia.com/gpu": "1"}}},
                           {"name": "b", "resources": {"requests": {"cpu": "1"}}}],
            "resources": {"requests": {"cpu": "3"}, "limits": {"memory": "8Gi"}}}
    requests = pod_requests({"spec": spec})
    assert (requests["cpu"], requests["memory"], requests["nvidia.com/gpu"]) == (3000, 8 * 2**30, 1)

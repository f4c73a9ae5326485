"""Events on pods through the local Kubernetes API: created once, counted again, rate-limited (issue 18 part 1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubernetes import client

from gpu_autoscaler.adapters.kubernetes.events import KubernetesEventRecorder, event_name
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.pod_events import PodEvent


def _pod(core: client.CoreV1Api) -> client.V1Pod:
    body: object = {"metadata": {"name": "train-0"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    return core.create_namespaced_pod("default", body)


def test_the_same_event_is_one_object_whose_count_rises_no_faster_than_the_rate_limit(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    pod = _pod(core)
    clock = FixedClock(datetime(2026, 11, 22, 10, 0, tzinfo=UTC))
    recorder = KubernetesEventRecorder(lambda: api, clock=clock, min_interval=timedelta(minutes=1))
    planned = PodEvent(pod.metadata.uid, "default", "train-0", "GpuCapacityPlanned", "planned onto claim nc-1")
    assert recorder.record([planned]) == 1
    clock.advance(timedelta(seconds=20))
    assert recorder.record([planned]) == 0  # within the rate limit: not rewritten
    clock.advance(timedelta(minutes=2))
    assert recorder.record([planned]) == 1
    stored = core.read_namespaced_event(event_name(planned), "default")
    assert (stored.count, stored.reason, stored.type) == (2, "GpuCapacityPlanned", "Normal")
    assert stored.involved_object.uid == pod.metadata.uid and stored.involved_object.kind == "Pod"
    assert stored.source.component == "gpu-autoscaler"
    assert stored.last_timestamp > stored.first_timestamp
    failed = PodEvent(pod.metadata.uid, "default", "train-0", "GpuCapacityUnavailable", "no pool fits", "Warning")
    assert recorder.record([failed]) == 1
    events = core.list_namespaced_event("default").items
    assert sorted(e.reason for e in events if e.involved_object.name == "train-0") == [
        "GpuCapacityPlanned", "GpuCapacityUnavailable"]


def test_a_burst_is_capped_and_an_unreachable_api_is_not_an_error(api: client.ApiClient,
                                                                  core: client.CoreV1Api) -> None:
    pod = _pod(core)
    recorder = KubernetesEventRecorder(lambda: api, max_per_call=3)
    burst = [PodEvent(pod.metadata.uid, "default", "train-0", "GpuCapacityPlanned", f"claim nc-{i}") for i in range(10)]
    assert recorder.record(burst) == 3
    nowhere = KubernetesEventRecorder(lambda: client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    assert nowhere.record(burst) == 0

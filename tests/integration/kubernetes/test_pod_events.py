"""Events on pods through the local Kubernetes API: created once, counted again, rate-limited (issue 18 part 1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from kubernetes import client

from gpu_autoscaler.adapters.kubernetes.events import KubernetesEventRecorder, event_name
from gpu_autoscaler.adapters.kubernetes.rest import KubernetesRest
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.pod_events import PodEvent
from tests import kube_reads

if TYPE_CHECKING:
    import pytest


def _pod(core: client.CoreV1Api) -> client.V1Pod:
    body: object = {"metadata": {"name": "train-0"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    return core.create_namespaced_pod("default", client.V1Pod.model_validate(body))


def test_the_same_event_is_one_object_whose_count_rises_no_faster_than_the_rate_limit(
    functions_api: client.ApiClient, core: client.CoreV1Api
) -> None:
    pod = _pod(core)
    clock = FixedClock(datetime(2026, 11, 22, 10, 0, tzinfo=UTC))
    recorder = KubernetesEventRecorder(lambda: functions_api, clock=clock, min_interval=timedelta(minutes=1))
    planned = PodEvent(kube_reads.uid(pod), "default", "train-0", "GpuCapacityPlanned", "planned onto claim nc-1")
    assert recorder.record([planned]).written == 1
    clock.advance(timedelta(seconds=20))
    assert recorder.record([planned]).written == 0  # within the rate limit: not rewritten
    clock.advance(timedelta(minutes=2))
    assert recorder.record([planned]).written == 1
    stored = core.read_namespaced_event(event_name(planned), "default")
    assert (stored.count, stored.reason, stored.type) == (2, "GpuCapacityPlanned", "Normal")
    assert stored.involved_object.uid == kube_reads.uid(pod) and stored.involved_object.kind == "Pod"
    assert stored.source is not None and stored.source.component == "gpu-autoscaler"
    assert stored.last_timestamp is not None and stored.first_timestamp is not None
    assert stored.last_timestamp > stored.first_timestamp
    failed = PodEvent(kube_reads.uid(pod), "default", "train-0", "GpuCapacityUnavailable", "no pool fits", "Warning")
    assert recorder.record([failed]).written == 1
    events = core.list_namespaced_event("default").items
    assert sorted((e.reason for e in events if e.involved_object.name == "train-0"), key=str) == [
        "GpuCapacityPlanned", "GpuCapacityUnavailable"]


def test_a_burst_is_capped_and_an_unreachable_api_is_not_an_error(functions_api: client.ApiClient,
                                                                  core: client.CoreV1Api) -> None:
    pod = _pod(core)
    recorder = KubernetesEventRecorder(lambda: functions_api, max_per_call=3)
    burst = [PodEvent(kube_reads.uid(pod), "default", "train-0", "GpuCapacityPlanned", f"claim nc-{i}")
             for i in range(10)]
    assert recorder.record(burst).written == 3
    nowhere = KubernetesEventRecorder(lambda: client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    assert nowhere.record(burst).written == 0


def test_pods_reported_again_cost_the_api_server_nothing_within_the_rate_limit(
    functions_api: client.ApiClient, core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent reports every pending pod again while its capacity launches: each report of a 1,000-pod burst
    was a refused create and a read per pod. What this environment wrote under the rate limit is skipped without
    a request, and the budget counts what is tried, so the pods past it are tried on the next report."""
    pod = _pod(core)
    clock = FixedClock(datetime(2026, 11, 22, 10, 0, tzinfo=UTC))
    recorder = KubernetesEventRecorder(lambda: functions_api, clock=clock, max_per_call=20)
    uid = kube_reads.uid(pod)
    burst = [PodEvent(uid, "default", "train-0", "GpuCapacityPlanned", f"claim nc-{i}") for i in range(30)]
    requests: list[str] = []
    original = KubernetesRest.request

    def counted(rest: KubernetesRest, method: str, *args: object, **kwargs: object) -> object:
        requests.append(method)
        return original(rest, method, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(KubernetesRest, "request", counted)
    assert recorder.record(burst).written == 20
    assert len(requests) == 20
    clock.advance(timedelta(seconds=10))
    requests.clear()
    assert recorder.record(burst).written == 10  # the ten left over, and nothing asked about the twenty done
    assert len(requests) == 10
    requests.clear()
    assert recorder.record(burst).written == 0
    assert requests == []


def test_an_event_on_a_node_is_kept_where_kubectl_describe_node_looks(functions_api: client.ApiClient,
                                                                       core: client.CoreV1Api) -> None:
    """A Node has no namespace: its Events go to `default`, as client-go's recorder puts an event on a
    cluster-scoped object (`tools/record`, `metav1.NamespaceDefault`), and name the node as its uid too, as the
    kubelet's do; `kubectl describe node` looks for both the node's uid and its name."""
    told = PodEvent("ip-10-0-1-5.ec2.internal", "default", "ip-10-0-1-5.ec2.internal", "FailedDraining",
                    "failed to drain node: eviction of pod team-a/web-0 refused: budget", "Warning", kind="Node")
    assert KubernetesEventRecorder(lambda: functions_api).record([told]).written == 1
    stored = core.read_namespaced_event(event_name(told), "default")
    assert (stored.involved_object.kind, stored.involved_object.name, stored.involved_object.uid) == (
        "Node", "ip-10-0-1-5.ec2.internal", "ip-10-0-1-5.ec2.internal")
    assert stored.involved_object.namespace is None and stored.involved_object.api_version == "v1"
    assert (stored.reason, stored.type) == ("FailedDraining", "Warning")

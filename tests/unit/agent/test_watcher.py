from __future__ import annotations

import gc
import json
import threading
import tracemalloc
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler_agent.gangs import GangHold
from gpu_autoscaler_agent.health import Metrics
from gpu_autoscaler_agent.podgroups import KubernetesPodGroups
from gpu_autoscaler_agent.selection import PodSelector
from gpu_autoscaler_agent.sender import Backoff
from gpu_autoscaler_agent.watcher import PodWatcher
from tests.unit.agent.builders import make_pod
from tests.unit.agent.fake_kubernetes import FakeCoreApi, ListResponse, bookmark, event, expired, gone

if TYPE_CHECKING:
    from gpu_autoscaler_agent.batcher import Report


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def upsert(self, report: Report) -> None:
        self.calls.append(("upsert", report.uid))

    def remove(self, uid: str) -> None:
        self.calls.append(("remove", uid))

    def replace_all(self, reports: Any) -> None:
        self.calls.append(("replace_all", sorted(r.uid for r in reports)))


class RecordingReports:
    """Keeps the reports a relist hands over (what the agent keeps of a burst)."""

    def replace_all(self, reports: Any) -> None:
        self.reports = list(reports)


class NoGroups:
    def min_member(self, ref: Any) -> int | None:
        return None

    def member_count(self, ref: Any) -> int | None:
        return None


def run(lists: list[Any], watches: list[Any]) -> tuple[RecordingSink, FakeCoreApi, Metrics, PodWatcher]:
    stop = threading.Event()
    core = FakeCoreApi(lists, watches, stop)
    sink = RecordingSink()
    metrics = Metrics()
    watcher = PodWatcher(
        None, sink, PodSelector(["nvidia.com/gpu"]), NoGroups(), metrics,  # type: ignore[arg-type]
        field_selector="spec.nodeName=", backoff=Backoff(initial=0.001, maximum=0.001),
        core_api=core,  # type: ignore[arg-type]  # the fake in the client's place
    )
    thread = threading.Thread(target=watcher.run, args=(stop,))
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    return sink, core, metrics, watcher


GPU = make_pod(uid="gpu", resource_version="5")
CPU = make_pod(uid="cpu", resource_version="6", gpus=None)


def test_the_first_list_hands_over_the_gpu_pods_as_the_complete_set() -> None:
    sink, core, metrics, watcher = run([ListResponse([GPU, CPU], "10")], [])
    assert sink.calls[0] == ("replace_all", ["gpu"])
    assert watcher.synced.is_set()
    assert core.watch_versions()[0] == "10"
    assert core.calls[0]["field_selector"] == "spec.nodeName="
    assert metrics.value("pods_seen_total") == 2


def test_a_list_follows_its_continue_token_over_pages() -> None:
    other = make_pod(uid="gpu2", resource_version="7")
    sink, core, _, _ = run([ListResponse([GPU], "10", token="next"), ListResponse([other], "10")], [])
    assert sink.calls[0] == ("replace_all", ["gpu", "gpu2"])
    assert core.calls[1]["_continue"] == "next"


def test_an_expired_continue_token_lists_again_from_the_start_and_hands_over_the_new_list_alone() -> None:
    """The API server answers a continue token older than its compaction window with 410 Gone (API concepts,
    "Retrieving large results sets in chunks"): the first page's pods are not handed over, the list starts again."""
    other = make_pod(uid="gpu2", resource_version="21")
    sink, core, metrics, _ = run([ListResponse([GPU], "10", token="old"), gone(),
                                  ListResponse([other], "20", token="new"), ListResponse([GPU], "20")], [])
    assert sink.calls[0] == ("replace_all", ["gpu", "gpu2"])
    assert [c["_continue"] for c in core.calls if not c.get("watch")][:4] == [None, "old", None, "new"]
    assert core.watch_versions()[0] == "20"
    assert metrics.value("relists_total") == 1
    assert metrics.value("pods_seen_total") == 2


def test_a_relist_builds_each_pages_reports_before_fetching_the_next_page() -> None:
    """A burst of pending pods: the relist's peak of allocations stays within its reports and one page of raw pods
    (all pages held at once made the agent's peak ~268 MiB at 7,500 pods, over its 256 Mi limit: OOM-killed)."""
    pods, page = 1000, 100
    padding: dict[str, Any] = {"f:spec": {"f:containers": {f'k:{{"name":"c{i}"}}': {".": {}, "f:env": {}, "f:image": {}}
                                           for i in range(20)}}}
    lists = []
    for start in range(0, pods, page):
        items = [make_pod(uid=str(uuid.UUID(int=i)), name=f"train-{i}") for i in range(start, start + page)]
        for item in items:  # what the API server stores besides the spec (its managed fields): a ~5 KB pod
            item["metadata"]["managedFields"] = [{"manager": "kube-controller-manager", "operation": "Update",
                                                  "fieldsType": "FieldsV1", "fieldsV1": padding}]
        lists.append(ListResponse(items, "10", token=str(start + page) if start + page < pods else None))
    sink = RecordingReports()
    watcher = PodWatcher(
        None, sink, PodSelector(["nvidia.com/gpu"]), NoGroups(), Metrics(),  # type: ignore[arg-type]
        page_size=page, core_api=FakeCoreApi(lists, [], threading.Event()),  # type: ignore[arg-type]
    )
    gc.collect()
    tracemalloc.start()
    try:
        assert watcher.sync() == "10"
        gc.collect()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(sink.reports) == pods
    assert peak <= 2 * kept, f"peak {peak / 1e6:.1f} MB during the relist for {kept / 1e6:.1f} MB kept (reports)"


def test_watch_events_add_and_remove_pods() -> None:
    scheduled = make_pod(uid="gpu", resource_version="12", node_name="ip-1", unschedulable=False)
    later = make_pod(uid="late", resource_version="13")
    events = [event("ADDED", later), event("MODIFIED", scheduled), event("ADDED", CPU), event("DELETED", later)]
    sink, _, _, _ = run([ListResponse([GPU], "10")], [events])
    assert sink.calls == [("replace_all", ["gpu"]), ("upsert", "late"), ("remove", "gpu"), ("remove", "cpu"),
                          ("remove", "late")]


def test_a_watch_that_ends_is_reopened_from_the_last_version_seen() -> None:
    _, core, metrics, _ = run([ListResponse([], "10")], [[event("ADDED", make_pod(resource_version="11"))],
                                                         [bookmark("15")]])
    assert core.watch_versions()[:3] == ["10", "11", "15"]
    assert core.list_count() == 1
    assert metrics.value("watch_restarts_total", reason="timeout") >= 2


def test_an_expired_watch_event_leads_to_a_new_list() -> None:
    sink, core, metrics, _ = run([ListResponse([GPU], "10"), ListResponse([], "20")],
                                 [[event("ADDED", make_pod(uid="x", resource_version="11")), expired()]])
    assert core.list_count() == 2
    assert core.watch_versions()[:2] == ["10", "20"]
    assert ("replace_all", []) in sink.calls  # the second list says nothing is pending any more
    assert metrics.value("watch_restarts_total", reason="expired") == 1
    assert metrics.value("relists_total") == 2


def test_a_410_response_to_the_watch_request_leads_to_a_new_list() -> None:
    _, core, _, _ = run([ListResponse([], "10"), ListResponse([], "30")], [gone()])
    assert core.list_count() == 2 and core.watch_versions()[:2] == ["10", "30"]


@pytest.mark.parametrize(
    "failure",
    [urllib3.exceptions.ProtocolError("connection reset"), ConnectionRefusedError(111, "refused"),
     ApiException(status=500, reason="Internal Server Error"), ApiException(status=429, reason="Too Many")],
)
def test_a_server_away_is_retried_from_the_same_version_without_a_new_list(failure: BaseException) -> None:
    _, core, metrics, _ = run([ListResponse([], "10")], [failure, [bookmark("12")]])
    assert core.list_count() == 1
    assert core.watch_versions()[:3] == ["10", "10", "12"]
    assert metrics.total("watch_restarts_total") >= 2


def test_a_failed_first_list_is_retried() -> None:
    unreachable = urllib3.exceptions.MaxRetryError(None, "/api/v1/pods")  # type: ignore[arg-type]  # no pool: only caught
    sink, core, _, watcher = run([unreachable, ListResponse([GPU], "10")], [])
    assert core.list_count() >= 2 and watcher.synced.is_set()
    assert sink.calls[0] == ("replace_all", ["gpu"])


def test_a_pod_that_cannot_be_described_is_counted_and_skipped() -> None:
    broken = make_pod(uid="bad", cpu="lots")
    sink, _, metrics, _ = run([ListResponse([broken, GPU], "10")], [])
    assert sink.calls[0] == ("replace_all", ["gpu"])
    assert metrics.value("pods_invalid_total") == 1


class FakeCustomApi:
    def __init__(self, groups: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.groups = groups
        self.calls = 0

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                     name: str) -> dict[str, Any]:
        self.calls += 1
        if (group, name) not in self.groups:
            raise ApiException(status=404, reason="Not Found")
        return self.groups[(group, name)]


def test_pod_groups_are_read_once_per_ttl_and_absence_is_none() -> None:
    from datetime import timedelta

    from gpu_autoscaler_agent.selection import GroupRef

    clock = FixedClock(datetime(2026, 11, 22, tzinfo=UTC))
    custom = FakeCustomApi({("scheduling.x-k8s.io", "nginx"): {"spec": {"minMember": 3}}})
    groups = KubernetesPodGroups(None, clock, timedelta(seconds=30), custom_api=custom,  # type: ignore[arg-type]
                                 core_api=object())  # type: ignore[arg-type]
    ref = GroupRef("coscheduling", "team-a", "nginx")
    assert [groups.min_member(ref) for _ in range(5)] == [3] * 5
    assert custom.calls == 1
    clock.advance(timedelta(seconds=31))
    assert groups.min_member(ref) == 3 and custom.calls == 2
    assert groups.min_member(GroupRef("volcano", "team-a", "nginx")) is None
    assert groups.min_member(GroupRef("kueue", "team-a", "nginx")) is None  # kueue has no PodGroup resource


def bad_request(message: str) -> ApiException:
    """A 400 as the API server writes it: a Status whose message says what was wrong."""
    error = ApiException(status=400, reason="Bad Request")
    error.body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                             "reason": "BadRequest", "code": 400})
    return error


def test_a_refused_field_selector_is_dropped_and_the_agent_filters_alone() -> None:
    refused = bad_request('Unable to find "/v1, Resource=pods" that match label selector "", field selector '
                          '"spec.nodeName=": field label not supported: spec.nodeName')
    sink, core, _, _ = run([refused, ListResponse([GPU, CPU], "10")], [])
    assert core.calls[0]["field_selector"] == "spec.nodeName="
    assert core.calls[1]["field_selector"] is None
    assert sink.calls[0] == ("replace_all", ["gpu"])


def test_a_bad_request_about_something_else_keeps_the_field_selector() -> None:
    sink, core, _, _ = run([bad_request("the server rejected our request for an unknown reason"),
                            ListResponse([GPU, CPU], "10")], [])
    assert [c["field_selector"] for c in core.calls[:2]] == ["spec.nodeName=", "spec.nodeName="]
    assert sink.calls[0] == ("replace_all", ["gpu"])


class Raw:
    def __init__(self, obj: Any) -> None:
        self.data = json.dumps(obj).encode()


class WebhookCore(FakeCoreApi):
    """Pod updates answered in turn from `patches` (an exception: an admission webhook's or the server's refusal;
    None: accepted, the patched pod returned); no gang nodes."""

    def __init__(self, lists: list[Any], watches: list[Any], stop: threading.Event,
                 patches: list[BaseException | None]) -> None:
        super().__init__(lists, watches, stop)
        self.patches = list(patches)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any:
        outcome = self.patches.pop(0) if self.patches else None
        if outcome is not None:
            raise outcome
        pod = next(p for p in MEMBERS if p["metadata"]["name"] == name)
        return Raw({**pod, "spec": {**pod["spec"], "tolerations": body[1]["value"]}})

    def list_node(self, **kwargs: Any) -> Any:
        return Raw({"items": []})


def denied(status: int) -> ApiException:
    """An update refused: by a validating admission webhook (Gatekeeper, Kyverno answer 400 or 403 with the
    policy's message), or by a server too busy (429) or failing (500)."""
    error = ApiException(status=status, reason="Denied")
    error.body = json.dumps({"kind": "Status", "status": "Failure", "code": status,
                             "message": 'admission webhook "validation.gatekeeper.sh" denied the request'})
    return error


MEMBERS = [make_pod(uid="gang-0", name="gang-0", labels={"kueue.x-k8s.io/pod-group-name": "g"},
                    annotations={"kueue.x-k8s.io/pod-group-total-count": "2"})]
PLAIN = make_pod(uid="plain", name="infer-0")


def run_with_gangs(lists: list[Any], watches: list[Any], patches: list[BaseException | None]
                   ) -> tuple[RecordingSink, WebhookCore, Metrics]:
    stop = threading.Event()
    core = WebhookCore(lists, watches, stop, patches)
    sink, metrics = RecordingSink(), Metrics()
    watcher = PodWatcher(None, sink, PodSelector(["nvidia.com/gpu"]), NoGroups(), metrics,  # type: ignore[arg-type]
                         field_selector="spec.nodeName=", backoff=Backoff(initial=0.001, maximum=0.001),
                         core_api=core, gangs=GangHold(None, metrics, core_api=core))  # type: ignore[arg-type]
    thread = threading.Thread(target=watcher.run, args=(stop,))
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    return sink, core, metrics


@pytest.mark.parametrize("status", [400, 403, 429, 500])
def test_a_pod_whose_update_is_refused_is_skipped_and_the_others_are_reported(status: int) -> None:
    sink, core, metrics = run_with_gangs([ListResponse([*MEMBERS, PLAIN], "10")], [], [denied(status)])
    assert sink.calls[0] == ("replace_all", ["plain"])
    assert all(c["field_selector"] == "spec.nodeName=" for c in core.calls)
    assert metrics.value("pods_failed_total", reason=f"http_{status}") == 1


def test_a_pod_that_failed_in_the_watch_is_tried_again_when_the_window_ends() -> None:
    sink, _, metrics = run_with_gangs([ListResponse([PLAIN], "10")],
                                      [[event("ADDED", MEMBERS[0])], [bookmark("12")]], [denied(400), None])
    assert sink.calls == [("replace_all", ["plain"]), ("upsert", "gang-0")]
    assert metrics.value("pods_failed_total", reason="http_400") == 1


class Jobs:
    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job

    def read_namespaced_job(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return Raw({"metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "q"}}, **self.job})


@pytest.mark.parametrize(("job", "size"), [
    ({"spec": {"parallelism": 4, "completions": 10}, "status": {"succeeded": 8}}, 2),
    ({"spec": {"parallelism": 4, "completions": 10}, "status": {}}, 4),
    ({"spec": {"parallelism": 4}, "status": {"succeeded": 3}}, 4),  # no completions: parallelism runs
])
def test_a_kueue_job_is_a_gang_of_the_pods_it_still_runs(job: dict[str, Any], size: int) -> None:
    """"For fixed completion count Jobs, the actual number of pods running in parallel will not exceed the number of
    remaining completions" (kubernetes.io, Jobs › Controlling parallelism)."""
    from gpu_autoscaler_agent.selection import GroupRef

    groups = KubernetesPodGroups(None, FixedClock(datetime(2026, 11, 22, tzinfo=UTC)),  # type: ignore[arg-type]
                                 custom_api=object(), core_api=object(), batch_api=Jobs(job))  # type: ignore[arg-type]
    assert groups.workload_size(GroupRef("job", "team-a", "train")) == size

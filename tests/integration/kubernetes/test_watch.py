"""Watches through the client's own `Watch`: versions, selectors, bookmarks, and recovery from 410 Gone."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests import kube_reads
from tests.integration.kubernetes.conftest import make_instance, make_pod, wait_for

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes


def _collect(core: client.CoreV1Api, version: str, seconds: int = 3, **kwargs: Any) -> list[tuple[str, str]]:
    events = watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=version,
                                  timeout_seconds=seconds, **kwargs)
    return [(e["type"], e["raw_object"]["metadata"].get("name", "")) for e in events]


def test_a_watch_from_a_list_version_sees_every_later_change_in_order(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("before")))
    version = kube_reads.list_version(core.list_namespaced_pod("default"))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("p")))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}})
    core.delete_namespaced_pod("p", "default")
    kinds = [kind for kind, name in _collect(core, version) if name == "p"]
    assert kinds[0] == "ADDED" and kinds[-1] == "DELETED"
    assert set(kinds[1:-1]) == {"MODIFIED"}  # our label, and the scheduler's Unschedulable condition
    # "before" was created before the list's version: its creation is not replayed. The scheduler may still
    # update it afterwards (a new Unschedulable message), and the watch rightly reports that as MODIFIED.
    assert ("ADDED", "before") not in _collect(core, version)


def test_a_watch_without_a_version_starts_with_the_current_objects(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("a", gpus=None)))
    events = watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1)
    first = next(iter(events))
    assert (first["type"], first["object"].metadata.name) == ("ADDED", "a")


def test_a_selector_watch_reports_objects_leaving_it_as_deleted(core: client.CoreV1Api, kube: LocalKubernetes,
                                                                 ) -> None:
    version = kube_reads.list_version(core.list_namespaced_pod("default"))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("p")))
    wait_for(lambda: kube_reads.pod_status(core.read_namespaced_pod("p", "default")).conditions,
             what="scheduling attempt")
    kube.add_instance(make_instance())
    wait_for(lambda: kube_reads.pod_spec(core.read_namespaced_pod("p", "default")).node_name, what="binding")
    events = _collect(core, version, field_selector="spec.nodeName=")
    assert events[0] == ("ADDED", "p")
    assert events[-1] == ("DELETED", "p")  # bound: no longer an unbound pod
    assert all(kind == "MODIFIED" for kind, _ in events[1:-1])


def test_bookmarks_carry_the_latest_version(core: client.CoreV1Api) -> None:
    version = kube_reads.list_version(core.list_namespaced_pod("default"))
    core.create_namespaced_pod("kube-system", client.V1Pod.model_validate(
        make_pod("elsewhere", gpus=None)))  # not in this watch's namespace
    stream = watch.Watch()
    kinds = [e["type"] for e in stream.stream(core.list_namespaced_pod, "default", resource_version=version,
                                              allow_watch_bookmarks=True, timeout_seconds=1)]
    assert "BOOKMARK" in kinds and "ADDED" not in kinds
    assert stream.resource_version is not None and int(stream.resource_version) > int(version)


def test_an_open_watch_ends_with_410_when_versions_expire_and_a_relist_recovers(
    core: client.CoreV1Api, kube: LocalKubernetes,
) -> None:
    version = kube_reads.list_version(core.list_namespaced_pod("default"))
    seen: list[str] = []
    failure: list[ApiException] = []
    opened = threading.Event()

    def run() -> None:
        try:
            for event in watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=version,
                                              timeout_seconds=30):
                seen.append(event["object"].metadata.name)
                opened.set()
        except ApiException as error:
            failure.append(error)

    watcher = threading.Thread(target=run)
    watcher.start()
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("first")))
    assert opened.wait(5)
    kube.expire_watches()
    watcher.join(5)
    assert not watcher.is_alive()
    assert failure and failure[0].status == 410
    assert "first" in seen
    with pytest.raises(ApiException) as stale:  # the old version stays too old
        _collect(core, version)
    assert stale.value.status == 410
    fresh = kube_reads.list_version(core.list_namespaced_pod("default"))
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("second")))
    assert ("ADDED", "second") in _collect(core, fresh)


def test_history_beyond_its_limit_is_compacted(kube: LocalKubernetes, core: client.CoreV1Api) -> None:
    from gpu_autoscaler.emulator.kube_objects import NAMESPACES

    small = type(kube.store)(kube.clock, history=5)
    version = small.version
    for i in range(12):
        small.create(NAMESPACES, {"metadata": {"name": f"ns-{i}"}})
    with pytest.raises(Exception) as compacted:
        small.events_after(int(version))
    assert getattr(compacted.value, "code", None) == 410
    assert [e.object["metadata"]["name"] for e in small.events_after(small.version - 2)] == ["ns-10", "ns-11"]

"""The API server going away and coming back (`LocalKubernetes.begin_outage` / `end_outage`): what clients see
— 503 ServiceUnavailable with a Status, or refused connections — open watches dropped, nothing scheduled while
it is down, and a watch from before the outage answered 410 Gone once it is back (its history compacted)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests import kube_reads
from tests.integration.kubernetes.conftest import make_instance, make_pod, wait_for

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes


def test_an_unavailable_api_answers_503_drops_watches_and_a_watch_from_before_is_gone_after(
    core: client.CoreV1Api, kube: LocalKubernetes,
) -> None:
    version = kube_reads.list_version(core.list_namespaced_pod("default"))
    ended = threading.Event()

    def run() -> None:
        try:
            for _ in watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=version,
                                          timeout_seconds=30):
                pass
        except (ApiException, urllib3.exceptions.HTTPError):
            pass
        ended.set()

    threading.Thread(target=run, daemon=True).start()
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("before")))
    kube.begin_outage("unavailable")
    try:
        assert ended.wait(5), "the open watch was not dropped"
        with pytest.raises(ApiException) as refused:
            core.list_namespaced_pod("default")
        assert refused.value.status == 503
        assert refused.value.body is not None and '"reason":"ServiceUnavailable"' in refused.value.body
        assert refused.value.headers is not None and refused.value.headers.get("Retry-After") == "1"
        kube.add_instance(make_instance())  # its kubelet cannot register while the API is down
    finally:
        kube.end_outage()
    with pytest.raises(ApiException) as gone:
        list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=version, timeout_seconds=2))
    assert gone.value.status == 410
    assert [kube_reads.name(p) for p in core.list_namespaced_pod("default").items] == ["before"]
    wait_for(lambda: kube_reads.pod_spec(core.read_namespaced_pod("before", "default")).node_name,
             what="binding after the outage")


def test_controllers_do_nothing_while_the_api_is_down(core: client.CoreV1Api, kube: LocalKubernetes) -> None:
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("waiting")))
    kube.begin_outage("unavailable")
    try:
        kube.add_instance(make_instance())
        threading.Event().wait(1.0)
        assert not kube.objects("nodes"), "a kubelet registered its Node while the API was down"
    finally:
        kube.end_outage(compacted=False)
    wait_for(lambda: kube_reads.pod_spec(core.read_namespaced_pod("waiting", "default")).node_name,
             what="binding after the outage")


def test_a_refusing_api_refuses_connections_and_comes_back_on_its_port(
    core: client.CoreV1Api, kube: LocalKubernetes,
) -> None:
    core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("kept", gpus=None)))
    port = kube.port
    kube.begin_outage("refused")
    try:
        with pytest.raises(urllib3.exceptions.MaxRetryError):
            core.list_namespaced_pod("default", _request_timeout=2)
    finally:
        kube.end_outage()
    assert kube.port == port
    assert [kube_reads.name(p) for p in core.list_namespaced_pod("default").items] == ["kept"]

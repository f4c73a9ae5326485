"""The Event recorder when the API server refuses the functions' access (401 no access entry, 403 no RBAC):
Events are best effort, so the report goes on, but the refusal is said once as an error and counted, and the
rest of the batch is not tried (each would be refused alike: 200 requests a report)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.kubernetes.events import KubernetesEventRecorder
from gpu_autoscaler.adapters.kubernetes.rest import (
    FUNCTION_TIMEOUT,
    KubernetesHttpError,
    KubernetesRest,
    worst_request_seconds,
)
from gpu_autoscaler.domain.pod_events import PodEvent

if TYPE_CHECKING:
    from collections.abc import Mapping


class _Answering(KubernetesRest):
    """An API server that answers every request with `status` (its Status body), counting what it was asked."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__("https://kubernetes.invalid")
        self.status, self.reason = status, reason
        self.asked: list[tuple[str, str]] = []

    def request(self, method: str, target: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
                content_type: str = "application/json") -> dict[str, Any]:
        self.asked.append((method, target))
        raise KubernetesHttpError(method, target, self.status, self.reason,
                                  {"kind": "Status", "code": self.status, "reason": self.reason,
                                   "message": f'events is forbidden: User "x" cannot create resource "events" '
                                              f'in API group "" in the namespace "{target.split("/")[4]}"'})


def _burst(count: int) -> list[PodEvent]:
    return [PodEvent(f"uid-{i}", "team-a", f"train-{i}", "GpuCapacityPlanned", "planned onto claim nc-1")
            for i in range(count)]


@pytest.mark.parametrize(("status", "reason"), [(401, "Unauthorized"), (403, "Forbidden")])
def test_refused_access_stops_the_batch_at_its_first_event_says_so_once_and_counts_what_was_not_posted(
    status: int, reason: str, caplog: pytest.LogCaptureFixture,
) -> None:
    api = _Answering(status, reason)
    recorder = KubernetesEventRecorder(lambda: api, max_per_call=200)
    with caplog.at_level(logging.WARNING, logger="gpu_autoscaler.adapters.kubernetes.events"):
        recorded = recorder.record(_burst(50))
    assert api.asked == [("POST", "/api/v1/namespaces/team-a/events")]
    assert (recorded.written, recorded.refused) == (0, 50)
    [said] = caplog.records
    assert said.levelname == "ERROR" and f"HTTP {status}" in said.getMessage()
    assert "gpu-autoscaler-functions" in said.getMessage() and "functions-rbac.yaml" in said.getMessage()


def test_another_error_status_skips_only_its_event() -> None:
    """A 422 (an Event the server finds invalid) says nothing of the next one."""
    api = _Answering(422, "Unprocessable Entity")
    recorded = KubernetesEventRecorder(lambda: api).record(_burst(3))
    assert len(api.asked) == 3 and (recorded.written, recorded.refused) == (0, 0)


class _Terminating(KubernetesRest):
    """Creates in namespace team-a are refused as the NamespaceLifecycle admission plugin refuses them while the
    namespace terminates (kubernetes plugin/pkg/admission/namespace/lifecycle/admission.go: 403 Forbidden, a cause
    of type `NamespaceTerminating`, k8s.io/api/core/v1 NamespaceTerminatingCause; `StatusCause.Type` is `reason` on
    the wire); others succeed."""

    def __init__(self) -> None:
        super().__init__("https://kubernetes.invalid")
        self.asked: list[tuple[str, str]] = []

    def request(self, method: str, target: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
                content_type: str = "application/json") -> dict[str, Any]:
        self.asked.append((method, target))
        if "/namespaces/team-a/" in target:
            raise KubernetesHttpError(method, target, 403, "Forbidden", {
                "kind": "Status", "code": 403, "reason": "Forbidden",
                "message": f'events "{target.rsplit("/", 1)[-1]}" is forbidden: unable to create new content in '
                           "namespace team-a because it is being terminated",
                "details": {"kind": "events", "causes": [{
                    "reason": "NamespaceTerminating", "field": "metadata.namespace",
                    "message": "namespace team-a is being terminated"}]}})
        return {"kind": "Event"}


def test_an_event_refused_as_its_namespace_terminates_skips_only_its_event_and_is_no_refused_access(
        caplog: pytest.LogCaptureFixture) -> None:
    """A namespace deleted while its pods are reported (per-experiment namespaces, CI) refuses the
    Event's create with 403; that is no missing RBAC. Before: the batch ended at it, team-b's Events were never
    tried, and all four counted as refused (the PodEventsRefused alarm: 'functions-rbac.yaml not applied')."""
    api = _Terminating()
    events = [*_burst(1), *[PodEvent(f"uid-b{i}", "team-b", f"serve-{i}", "GpuCapacityPlanned", "planned")
                            for i in range(3)]]
    with caplog.at_level(logging.WARNING, logger="gpu_autoscaler.adapters.kubernetes.events"):
        recorded = KubernetesEventRecorder(lambda: api).record(events)
    assert [target for _, target in api.asked] == ["/api/v1/namespaces/team-a/events",
                                                   *["/api/v1/namespaces/team-b/events"] * 3]
    assert (recorded.written, recorded.refused) == (3, 0)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "being terminated" in caplog.records[0].getMessage()


class _Accepting(KubernetesRest):
    """Every Event created at once; each request takes `seconds` of the invocation."""

    def __init__(self, left: list[float], seconds: float) -> None:
        super().__init__("https://kubernetes.invalid")
        self.left, self.seconds = left, seconds
        self.started_with: list[float] = []

    def request(self, method: str, target: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
                content_type: str = "application/json") -> dict[str, Any]:
        self.started_with.append(self.left[0])
        self.left[0] -= self.seconds
        return {"kind": "Event"}


def test_events_are_tried_only_while_a_stalled_request_still_fits_in_the_invocation() -> None:
    """A re-reported 200-pod document costs 600 sequential requests, which at ~50 ms each
    (an API server queueing a large submission) would take the packer's record past its 60 s timeout, holding the
    cluster's FIFO group. Each Event is started only while one stalled request (the recorder stops at the first)
    still fits in what is left; the rest wait for the next report. Before: all 200 were tried, the last started
    with 30 s left."""
    left = [40.0]
    api = _Accepting(left, seconds=0.15)
    recorded = KubernetesEventRecorder(lambda: api).record(_burst(200), time_left=lambda: left[0])
    worst = worst_request_seconds(FUNCTION_TIMEOUT)
    assert min(api.started_with) >= worst
    assert recorded.written == len(api.started_with) == math.ceil((40.0 - worst) / 0.15)
    assert KubernetesEventRecorder(lambda: api).record(_burst(3)).written == 3  # no invocation: no bound

"""The packer tells each reported pod where its capacity is, or why there is none (issue 18 part 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.adapters.memory.events import MemoryEventRecorder
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.pod_events import LAUNCHED, PLANNED, REGISTERED, UNSCHEDULABLE, Recorded
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.pods import PendingPod, PendingPodsDocument
from gpu_autoscaler.services.packer import PackerService
from tests.unit.packing.builders import NOW, make_catalog, make_config, make_pod, make_pool
from tests.unit.packing.fakes import FakeStateStore, RecordingLaunchQueue

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.domain.pod_events import PodEvent


def _document(pods: list[PendingPod]) -> PendingPodsDocument:
    return PendingPodsDocument.model_validate({"schemaVersion": 1, "cluster": "test", "sentAt": NOW.isoformat(),
                                               "pods": [p.model_dump(by_alias=True) for p in pods]})


def test_each_pod_hears_of_its_claim_as_it_is_planned_launched_and_registered() -> None:
    clock = FixedClock(NOW)
    store, events = FakeStateStore(clock), MemoryEventRecorder()
    service = PackerService(make_config(make_pool()), store, make_catalog(), RecordingLaunchQueue(), clock=clock,
                            events=events)
    pod, too_big = make_pod(), make_pod(gpus=64, cpu="20", memory="64Gi")
    outcome = service.handle(_document([pod, too_big]), source="m-1")
    planned, failed = events.posted
    claim = store.claims[outcome.created[0]]
    assert (planned.uid, planned.reason, planned.type) == (pod.uid, PLANNED, "Normal")
    assert f"planned onto claim {claim.id} in pool {claim.pool}: {claim.instance_types[0]}" in planned.message
    assert f"{claim.price_per_hour:.4f} USD/h" in planned.message and claim.capacity_type in planned.message
    [reason] = [u.reason for u in service.plan(_document([too_big]))[0].unschedulable]
    assert (failed.uid, failed.reason, failed.type, failed.message) == (too_big.uid, UNSCHEDULABLE, "Warning", reason)

    launched = store.transition(claim, ClaimState.LAUNCHED, instance_id="i-0abc", instance_type=claim.instance_types[0],
                                zone="us-east-1a")
    events.posted.clear()
    service.handle(_document([pod]), source="m-2")
    [event] = events.posted
    assert event.reason == LAUNCHED and "launched i-0abc" in event.message and "us-east-1a" in event.message
    store.transition(launched, ClaimState.REGISTERED, node_name="ip-10-0-1-5")
    events.posted.clear()
    service.handle(_document([pod]), source="m-3")
    assert [(e.reason, "node ip-10-0-1-5" in e.message) for e in events.posted] == [(REGISTERED, True)]


class _Refused:
    """A recorder whose every Event the API server refuses (the functions' RBAC missing)."""

    def record(self, events: Sequence[PodEvent], *, time_left: Callable[[], float] | None = None) -> Recorded:
        return Recorded(written=0, refused=len(events))


def test_a_report_whose_events_are_refused_is_packed_and_says_how_many_were_not_posted() -> None:
    """Events are best effort: the claims are made all the same, and the outcome carries the count the handler
    publishes (`PodEventsRefused`)."""
    clock = FixedClock(NOW)
    store = FakeStateStore(clock)
    service = PackerService(make_config(make_pool()), store, make_catalog(), RecordingLaunchQueue(), clock=clock,
                            events=_Refused())
    outcome = service.handle(_document([make_pod(), make_pod()]), source="m-1")
    assert outcome.created and outcome.events_refused == 2
    assert outcome.summary()["eventsRefused"] == 2


class _Timed:
    """A recorder that reads the invocation's time left as it starts."""

    def __init__(self) -> None:
        self.left: list[float | None] = []

    def record(self, events: Sequence[PodEvent], *, time_left: Callable[[], float] | None = None) -> Recorded:
        self.left.append(time_left() if time_left is not None else None)
        return Recorded(written=len(events))


def test_the_pods_events_are_bounded_by_the_invocations_time_left() -> None:
    """Events are the report's last work; the recorder is given the invocation's time so that they never
    push the record past the function's timeout (`KubernetesEventRecorder.record`)."""
    clock = FixedClock(NOW)
    events = _Timed()
    service = PackerService(make_config(make_pool()), FakeStateStore(clock), make_catalog(), RecordingLaunchQueue(),
                            clock=clock, events=events)
    service.handle(_document([make_pod()]), source="m-1", time_left=lambda: 21.5)
    service.handle(_document([make_pod()]), source="m-2")
    assert events.left == [21.5, None]

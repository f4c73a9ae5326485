"""Evicted pods are told why their node goes (issue 18 part 1): one Event per evicted pod, the request's reason."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from gpu_autoscaler.adapters.memory.cluster import MemoryCluster
from gpu_autoscaler.adapters.memory.events import MemoryEventRecorder
from gpu_autoscaler.adapters.memory.queues import MemoryDrainQueue
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.pod_events import DELETED, DISRUPTING, FAILED_DRAINING, Recorded
from gpu_autoscaler.services.drain import DrainService
from tests.unit.drain.builders import NOW, make_claim, make_node, make_pod, make_request
from tests.unit.drain.fakes import RecordingFleet

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.domain.pod_events import PodEvent


def test_each_evicted_pod_hears_the_drain_reason() -> None:
    clock = FixedClock(NOW)
    store = MemoryStateStore("ml-prod", clock)
    store.create_claim(make_claim())
    cluster = MemoryCluster([make_node()], [make_pod("web-0"), make_pod("web-1"),
                                            make_pod("ds-0", owner_kind="DaemonSet")])
    service = DrainService("ml-prod", store, cluster, RecordingFleet(store), MemoryDrainQueue(clock), clock=clock,
                           sleep=lambda seconds: clock.advance(timedelta(seconds=seconds)))
    service.events = events = MemoryEventRecorder()
    request = make_request()
    service.drain(request, timedelta(seconds=60))
    # Every evicted pod hears why, the DaemonSet's too: Karpenter's order evicts it last, once the others are gone.
    assert [e.name for e in events.posted][-1] == "ds-0"
    assert sorted(e.name for e in events.posted) == ["ds-0", "web-0", "web-1"]
    assert {e.reason for e in events.posted} == {DISRUPTING}
    assert all(request.reason in e.message and request.node in e.message for e in events.posted)


def test_a_pod_deleted_at_the_termination_time_hears_that_its_budget_and_do_not_disrupt_were_bypassed() -> None:
    """Karpenter publishes `Disrupted` on each pod it force-deletes at its node's termination time ("This bypasses
    the PDB of the pod and the do-not-disrupt annotation": kubernetes-sigs/karpenter
    pkg/controllers/node/termination/terminator/events/events.go); a log line in the drain function's log group
    is nothing a workload owner sees."""
    clock = FixedClock(NOW)
    store = MemoryStateStore("ml-prod", clock)
    store.create_claim(make_claim())
    protected = make_pod("train-0", annotations={"karpenter.sh/do-not-disrupt": "true"})
    cluster = MemoryCluster([make_node()], [protected])
    queue = MemoryDrainQueue(clock)
    service = DrainService("ml-prod", store, cluster, RecordingFleet(store), queue, clock=clock,
                           sleep=lambda seconds: clock.advance(timedelta(seconds=seconds)))
    service.events = events = MemoryEventRecorder()
    request = make_request(involuntary=True, deadline=NOW + timedelta(seconds=90), reason="spot interruption")
    outcomes = [service.drain(request, timedelta(seconds=60))]
    while (visible := queue.next_visible()) is not None and len(outcomes) < 50:
        clock.set(max(visible, clock.now()))
        outcomes.extend(service.drain(message, timedelta(seconds=60)) for message in queue.receive())
    assert [k for o in outcomes for k in o.deleted] == ["team-a/train-0"]  # at the deadline − its 30 s grace
    (told,) = [e for e in events.posted if e.name == "train-0"]
    assert told.reason == DELETED and told.type == "Warning"
    assert "spot interruption" in told.message and "30 s" in told.message and "do-not-disrupt" in told.message


class _Refused:
    """A recorder whose every Event the API server refuses (the functions' RBAC lacks Events)."""

    def record(self, events: Sequence[PodEvent], *, time_left: Callable[[], float] | None = None) -> Recorded:
        return Recorded(written=0, refused=len(events))


def test_a_drain_whose_events_are_refused_drains_all_the_same_and_counts_them() -> None:
    clock = FixedClock(NOW)
    store = MemoryStateStore("ml-prod", clock)
    store.create_claim(make_claim())
    cluster = MemoryCluster([make_node()], [make_pod("web-0"), make_pod("web-1")])
    service = DrainService("ml-prod", store, cluster, RecordingFleet(store), MemoryDrainQueue(clock), clock=clock,
                           sleep=lambda seconds: clock.advance(timedelta(seconds=seconds)))
    service.events = _Refused()
    outcome = service.drain(make_request(), timedelta(seconds=60))
    assert sorted(outcome.evicted) == ["team-a/web-0", "team-a/web-1"]
    assert outcome.events_refused == 2 and outcome.summary()["eventsRefused"] == 2


def test_a_drain_a_budget_holds_up_tells_the_node_why_as_karpenter_does() -> None:
    """Karpenter publishes `FailedDraining` (Warning) on the Node when an eviction is refused for a budget
    (kubernetes-sigs/karpenter pkg/controllers/node/termination/terminator/eviction.go, `NodeFailedToDrain` in
    .../terminator/events/events.go). Before, a drain a budget held up said so only in the drain function's log:
    `kubectl describe node` and `kubectl get events` showed nothing while the node stayed cordoned."""
    clock = FixedClock(NOW)
    store = MemoryStateStore("ml-prod", clock)
    store.create_claim(make_claim())
    cluster = MemoryCluster([make_node()], [make_pod("web-0"), make_pod("web-1")])
    cluster.add_blocker(lambda pod: "PDB web allows 0 disruptions" if pod.name == "web-0" else None)
    service = DrainService("ml-prod", store, cluster, RecordingFleet(store), MemoryDrainQueue(clock), clock=clock,
                           sleep=lambda seconds: clock.advance(timedelta(seconds=seconds)))
    service.events = events = MemoryEventRecorder()
    request = make_request()
    outcome = service.drain(request, timedelta(seconds=60))
    assert outcome.blocked and outcome.evicted == ["team-a/web-1"]
    on_node = [e for e in events.posted if e.kind == "Node"]
    assert {(e.name, e.namespace, e.uid, e.reason, e.type) for e in on_node} == {
        (request.node, "default", request.node, FAILED_DRAINING, "Warning")}
    assert {e.message for e in on_node} == {"failed to drain node: eviction of pod team-a/web-0 refused: PDB web "
                                            "allows 0 disruptions"}
    assert {e.name for e in events.posted if e.kind == "Pod"} == {"web-1"}  # the evicted pod hears why, as before

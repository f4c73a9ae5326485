from __future__ import annotations

from datetime import timedelta

from gpu_autoscaler.domain.drain import (
    DRAIN_TAINT,
    MAX_DELAY,
    DrainAction,
    DrainStep,
    Replacements,
    continuation,
    plan_drain,
)
from gpu_autoscaler.models.cluster import EvictionOutcome
from tests.unit.drain.builders import NOW, make_node, make_pod, make_request

DND = {"karpenter.sh/do-not-disrupt": "true"}


def test_evicts_workload_pods_first_and_skips_mirror_and_finished_ones() -> None:
    pods = [make_pod("web-0"), make_pod("ds-0", owner_kind="DaemonSet"), make_pod("static-0", mirror=True),
            make_pod("job-0", phase="Succeeded")]
    step = plan_drain(make_request(), make_node(), pods, NOW)
    assert step.action is DrainAction.EVICT and step.cordon
    assert [p.name for p in step.evict] == ["web-0"]  # the DaemonSet pod's tier comes after
    assert sorted(p.name for p in step.skipped) == ["job-0", "static-0"]


def test_a_node_already_cordoned_by_us_is_not_cordoned_again() -> None:
    step = plan_drain(make_request(), make_node(taints=(DRAIN_TAINT,), unschedulable=True), [make_pod()], NOW)
    assert step.action is DrainAction.EVICT and not step.cordon


def test_do_not_disrupt_stops_a_voluntary_drain_before_it_starts() -> None:
    pods = [make_pod("web-0"), make_pod("train-0", annotations=DND)]
    step = plan_drain(make_request(), make_node(), pods, NOW)
    assert step.action is DrainAction.ABANDON and not step.cordon and not step.evict
    assert "team-a/train-0" in step.reason


def test_a_drift_drain_with_a_termination_grace_period_starts_past_do_not_disrupt_pods() -> None:
    """Karpenter's Eventual class: a drifted node with a terminationGracePeriod begins draining even with pods that
    block eviction; they are held, then deleted in time for their grace before the period ends. The Node's own
    annotation still refuses it, and a drift drain without a grace period is refused as any voluntary one."""
    pods = [make_pod("web-0"), make_pod("train-0", annotations=DND, termination_grace_period_seconds=30)]
    request = make_request(eventual=True, termination_grace_period="1h")
    step = plan_drain(request, make_node(), pods, NOW)
    assert step.action is DrainAction.EVICT and step.cordon
    assert [p.name for p in step.evict] == ["web-0"] and [p.name for p in step.held] == ["train-0"]
    due = plan_drain(request.model_copy(update={"cordoned_at": NOW}), make_node(taints=(DRAIN_TAINT,),
                     unschedulable=True), pods[1:], NOW + timedelta(minutes=59, seconds=30))
    assert [p.name for p in due.delete] == ["train-0"]
    annotated = make_node(annotations={"karpenter.sh/do-not-disrupt": "true"})
    assert plan_drain(request, annotated, pods, NOW).action is DrainAction.ABANDON
    assert plan_drain(make_request(eventual=True), make_node(), pods, NOW).action is DrainAction.ABANDON


def test_do_not_disrupt_is_held_by_an_involuntary_drain_then_deleted_in_time_for_its_grace() -> None:
    pods = [make_pod("train-0", annotations=DND, termination_grace_period_seconds=30)]
    for request in (make_request(force=True), make_request(involuntary=True)):
        step = plan_drain(request, make_node(), pods, NOW)
        assert step.action is DrainAction.EVICT and not step.evict and [p.name for p in step.held] == ["train-0"]
        assert step.until == request.deadline - timedelta(seconds=30)
        due = plan_drain(request, make_node(), pods, request.deadline - timedelta(seconds=30))
        assert [p.name for p in due.delete] == ["train-0"] and due.delete_grace == 30


def test_a_started_voluntary_drain_holds_do_not_disrupt_pods_and_never_deletes_them() -> None:
    pods = [make_pod("web-0"), make_pod("train-0", annotations=DND)]
    node = make_node(taints=(DRAIN_TAINT,), unschedulable=True)
    step = plan_drain(make_request(), node, pods, NOW)
    assert [p.name for p in step.evict] == ["web-0"] and [p.name for p in step.held] == ["train-0"]
    late = plan_drain(make_request(), node, pods, NOW + timedelta(days=1))
    assert late.action is DrainAction.EVICT and not late.delete and [p.name for p in late.held] == ["train-0"]


def test_finishes_when_empty_of_pods_to_wait_for_or_the_node_is_gone() -> None:
    step = plan_drain(make_request(), make_node(), [make_pod("static-0", mirror=True)], NOW)
    assert step.action is DrainAction.FINISH and step.reason == "node is empty" and not step.delete
    assert plan_drain(make_request(), None, [], NOW).reason == "node is gone"


def test_past_an_involuntary_deadline_what_remains_is_deleted() -> None:
    request = make_request(involuntary=True, deadline=NOW)
    step = plan_drain(request, make_node(), [make_pod("web-0"), make_pod("static-0", mirror=True)], NOW)
    assert step.action is DrainAction.FINISH and step.reason == "termination time reached"
    assert [p.name for p in step.delete] == ["web-0"] and step.delete_grace == 1


def test_waits_for_the_replacement_until_wait_until_then_evicts() -> None:
    request = make_request(replacement_claim_id="c-2", wait_until=NOW + timedelta(minutes=5))
    waiting = plan_drain(request, make_node(), [make_pod()], NOW, replacements=Replacements.WAITING)
    assert waiting.action is DrainAction.WAIT and not waiting.cordon
    ready = plan_drain(request, make_node(), [make_pod()], NOW, replacements=Replacements.READY)
    assert ready.action is DrainAction.EVICT
    late = plan_drain(request, make_node(), [make_pod()], NOW + timedelta(minutes=5), replacements=Replacements.WAITING)
    assert late.action is DrainAction.EVICT


def test_a_wait_is_polled_no_later_than_wait_until() -> None:
    request = make_request(wait_until=NOW + timedelta(seconds=7))
    after = continuation(request, DrainStep(DrainAction.WAIT, "w", until=request.wait_until), [], NOW)
    assert after.delay == timedelta(seconds=7)
    assert after.request.attempt == 1 and after.request.started_at == NOW


def test_refused_evictions_back_off_exponentially_up_to_a_minute() -> None:
    request = make_request(deadline=NOW + timedelta(hours=2))
    pod = make_pod()
    step = DrainStep(DrainAction.EVICT, "evicting", evict=(pod,))
    refused = [EvictionOutcome(pod=pod.key, evicted=False, blocked=True)]
    delays = []
    for _ in range(10):
        after = continuation(request, step, refused, NOW)
        delays.append(int(after.delay.total_seconds()))
        request = after.request
    assert delays == [5, 10, 20, 40, 60, 60, 60, 60, 60, 60]
    assert request.attempt == 10 and request.backoff == 10
    progressed = continuation(request, step, [EvictionOutcome(pod=pod.key, evicted=True)], NOW)
    assert progressed.request.backoff == 0 and progressed.delay < timedelta(seconds=10)


def test_no_delay_runs_past_an_involuntary_deadline() -> None:
    request = make_request(involuntary=True, deadline=NOW + timedelta(seconds=30), backoff=3)
    step = DrainStep(DrainAction.EVICT, "holding", held=(make_pod(),))
    after = continuation(request, step, [], NOW)
    assert after.delay == timedelta(seconds=30)
    waiting = continuation(make_request(deadline=NOW + timedelta(days=4), wait_until=NOW + timedelta(days=3)),
                           DrainStep(DrainAction.WAIT, "w"), [], NOW)
    assert waiting.delay <= MAX_DELAY


def test_a_voluntary_drain_without_its_replacement_leaves_the_node_alone() -> None:
    request = make_request(replacement_claim_id="c-2")
    failed = plan_drain(request, make_node(), [make_pod()], NOW, replacements=Replacements.FAILED)
    assert failed.action is DrainAction.ABANDON and "failed" in failed.reason
    late = plan_drain(request, make_node(), [make_pod()], request.deadline, replacements=Replacements.WAITING)
    assert late.action is DrainAction.ABANDON and "deadline" in late.reason


def test_an_involuntary_drain_goes_on_without_its_replacement() -> None:
    request = make_request(replacement_claim_id="c-2", involuntary=True)
    step = plan_drain(request, make_node(), [make_pod()], NOW, replacements=Replacements.FAILED)
    assert step.action is DrainAction.EVICT
    late = plan_drain(request, make_node(), [make_pod()], request.deadline, replacements=Replacements.WAITING)
    assert late.action is DrainAction.FINISH and late.delete

"""The drain service on MemoryCluster and MemoryStateStore: cordon, evict, continue across invocations, finish."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.memory.cluster import DisruptionBudget, MemoryCluster
from gpu_autoscaler.adapters.memory.queues import MemoryDrainQueue
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.disruption_marks import DISRUPTION_ATTRIBUTE, disrupting, disruption_mark, drain_sent
from gpu_autoscaler.domain.drain import DRAIN_TAINT, MAX_DELAY
from gpu_autoscaler.errors import KubernetesApiError
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.services.drain import DrainOutcome, DrainService, WrongCluster
from tests.unit.drain.builders import NOW, make_claim, make_node, make_pod, make_request
from tests.unit.drain.fakes import RecordingFleet

if TYPE_CHECKING:
    from gpu_autoscaler.models.cluster import ClusterPod
    from gpu_autoscaler.models.messages import DrainRequest

NODE = "ip-10-0-1-5.ec2.internal"
DND = {"karpenter.sh/do-not-disrupt": "true"}


class Harness:
    def __init__(self, *pod_names: str, **pod_fields: Any) -> None:
        self.clock = FixedClock(NOW)
        self.store = MemoryStateStore("ml-prod", self.clock)
        self.store.create_claim(make_claim())
        self.cluster = MemoryCluster([make_node()], [make_pod(n, **pod_fields) for n in pod_names])
        self.fleet = RecordingFleet(self.store)
        self.queue = MemoryDrainQueue(self.clock)
        self.service = DrainService("ml-prod", self.store, self.cluster, self.fleet, self.queue, clock=self.clock,
                                    sleep=lambda seconds: self.clock.advance(timedelta(seconds=seconds)))

    def drain(self, request: DrainRequest, budget: timedelta = timedelta(seconds=60)) -> DrainOutcome:
        """As the handler calls it: a minute of waiting allowed within the invocation."""
        return self.service.drain(request, budget)

    def claim_state(self, claim_id: str = "c-1") -> ClaimState:
        claim = self.store.get_claim(claim_id)
        assert claim is not None
        return claim.state

    def run_until_done(self, request: DrainRequest, budget: timedelta = timedelta(seconds=60),
                       limit: int = 100) -> list[DrainOutcome]:
        """Deliver the request, then each continuation when SQS would make it visible, until none is left."""
        outcomes = [self.drain(request, budget)]
        while (visible := self.queue.next_visible()) is not None and len(outcomes) < limit:
            self.clock.set(max(visible, self.clock.now()))
            for message in self.queue.receive():
                outcomes.append(self.drain(message, budget))
        return outcomes


def test_a_simple_drain_finishes_in_one_invocation() -> None:
    h = Harness("web-0", "web-1")
    h.cluster.add_pod(make_pod("ds-0", owner_kind="DaemonSet"))
    outcome = h.drain(make_request(), budget=timedelta(seconds=60))
    assert outcome.status == "finished" and outcome.reason == "node is empty"
    assert sorted(outcome.evicted) == ["team-a/ds-0", "team-a/web-0", "team-a/web-1"]
    assert h.cluster.calls.cordoned == [NODE]
    assert h.cluster.calls.evicted == ["team-a/web-0", "team-a/web-1", "team-a/ds-0"]  # the DaemonSet pod last
    assert h.cluster.calls.deleted_nodes == [NODE] and h.cluster.list_pods() == []
    assert h.fleet.terminated and h.claim_state() is ClaimState.TERMINATED
    states = [t.state for t in h.store.get_claim("c-1").history]  # type: ignore[union-attr]
    assert states == [ClaimState.DRAINING, ClaimState.TERMINATED]
    assert h.queue.messages == []


def test_the_drains_pod_lists_ask_for_no_volume_zones() -> None:
    """The drain lists its node's pods on every pass and re-plans none of them: it never asks for the zones of their
    volumes, which the Kubernetes adapter reads with two cluster-wide lists."""
    h = Harness("web-0", "web-1")
    asked: list[bool] = []
    listed = h.cluster.list_pods

    def recording(node_name: str | None = None, *, volume_zones: bool = True) -> list[ClusterPod]:
        asked.append(volume_zones)
        return listed(node_name, volume_zones=volume_zones)

    h.cluster.list_pods = recording  # type: ignore[method-assign]
    assert h.drain(make_request()).status == "finished"
    assert asked and not any(asked)


def test_a_pdb_blocked_drain_resumes_across_invocations_and_finishes() -> None:
    """A budget that allows no disruption for 30 minutes: the drain re-enqueues itself (≤ 15 min each) and
    finishes once it lifts, long before its deadline; nothing is deleted, every pod evicted."""
    h = Harness("web-0", "web-1", "web-2")
    lifted = NOW + timedelta(minutes=30)
    h.cluster.add_blocker(lambda pod: "PDB web allows 0 disruptions" if h.clock.now() < lifted else None)
    outcomes = h.run_until_done(make_request(deadline=NOW + timedelta(hours=2)))
    last = outcomes[-1]
    assert last.status == "finished" and not last.deleted
    assert h.clock.now() >= lifted and h.clock.now() < lifted + MAX_DELAY
    assert all(o.status == "continued" for o in outcomes[:-1]) and len(outcomes) > 3
    assert all(o.delay is not None and o.delay <= MAX_DELAY for o in outcomes[:-1])
    attempts = [o.next_attempt or 0 for o in outcomes[:-1]]
    assert attempts == sorted(set(attempts)) and attempts[0] >= 1
    assert sorted(h.cluster.calls.evicted) == ["team-a/web-0", "team-a/web-1", "team-a/web-2"]
    assert last.duration is not None and last.duration >= timedelta(minutes=30)
    assert h.claim_state() is ClaimState.TERMINATED


def test_within_one_invocation_a_short_block_is_waited_out() -> None:
    h = Harness("web-0")
    lifted = NOW + timedelta(seconds=12)
    h.cluster.add_blocker(lambda pod: "PDB" if h.clock.now() < lifted else None)
    outcome = h.drain(make_request(), budget=timedelta(seconds=120))
    assert outcome.status == "finished" and outcome.passes > 2 and outcome.blocked >= 2
    assert h.queue.messages == []


def test_a_real_budget_blocks_until_replicas_are_back() -> None:
    h = Harness("web-0", "web-1")
    h.cluster.add_budget(DisruptionBudget(name="web", namespace="team-a", match_labels={"app": "web"},
                                          min_available=2))
    first = h.drain(make_request())
    assert first.status == "continued" and first.blocked >= 2 and not first.evicted
    h.cluster.remove_budget("team-a", "web")
    h.clock.advance(first.delay or timedelta(0))
    (message,) = h.queue.receive()
    assert h.drain(message).status == "finished"


def test_an_involuntary_drain_deletes_what_remains_in_time_for_each_pods_grace() -> None:
    """Blocked by a PDB and do-not-disrupt: each pod is deleted at the deadline minus its own grace period."""
    h = Harness("web-0", "train-0", annotations=DND)
    h.cluster.add_blocker(lambda pod: "PDB never lets go")
    outcomes = h.run_until_done(make_request(involuntary=True, deadline=NOW + timedelta(seconds=90)))
    assert outcomes[-1].status == "finished"
    assert sorted(k for o in outcomes for k in o.deleted) == ["team-a/train-0", "team-a/web-0"]
    assert h.cluster.calls.delete_graces == [30, 30]
    assert NOW + timedelta(seconds=60) <= h.clock.now() < NOW + timedelta(seconds=90)
    assert h.claim_state() is ClaimState.TERMINATED and h.cluster.calls.deleted_nodes == [NODE]


def test_do_not_disrupt_blocks_a_voluntary_drain_but_not_an_involuntary_one() -> None:
    h = Harness("web-0")
    h.cluster.add_pod(make_pod("train-0", annotations=DND))
    h.cluster.taint(NODE, DRAIN_TAINT)  # consolidation's, from its decision
    voluntary = h.drain(make_request(reason="consolidation"))
    assert voluntary.status == "abandoned" and "team-a/train-0" in voluntary.reason
    assert DRAIN_TAINT not in h.cluster.get_node(NODE).taints  # type: ignore[union-attr]
    assert h.cluster.calls.cordoned == [] and h.cluster.calls.evicted == []
    assert h.claim_state() is ClaimState.REGISTERED and h.queue.messages == []

    outcomes = h.run_until_done(make_request(reason="spot interruption warning", involuntary=True))
    assert outcomes[0].status == "continued" and outcomes[-1].status == "finished"
    assert h.cluster.calls.evicted == ["team-a/web-0"] and h.cluster.calls.deleted_pods == ["team-a/train-0"]


def test_a_forced_voluntary_drain_deletes_do_not_disrupt_pods_at_its_deadline() -> None:
    h = Harness("train-0", annotations=DND)
    outcomes = h.run_until_done(make_request(force=True))
    assert outcomes[-1].status == "finished" and h.cluster.calls.deleted_pods == ["team-a/train-0"]


def test_replacement_first_waits_for_the_replacement_node_to_be_ready() -> None:
    h = Harness("web-0")
    h.store.create_claim(make_claim(id="c-2", instance_id="i-0bbb", node_name=None, state=ClaimState.LAUNCHED))
    request = make_request(replacement_claim_id="c-2", wait_until=NOW + timedelta(minutes=10))
    first = h.drain(request, budget=timedelta(seconds=30))
    assert first.status == "continued" and first.reason == "replacement not initialized yet"
    assert h.cluster.calls.cordoned == [] and h.cluster.calls.evicted == []
    # The replacement joins: registered, its node Ready.
    h.cluster.add_node(make_node("ip-10-0-2-9.ec2.internal", instance_id="i-0bbb"))
    claim = h.store.get_claim("c-2")
    assert claim is not None
    h.store.transition(claim, ClaimState.REGISTERED, "joined", node_name="ip-10-0-2-9.ec2.internal")
    h.clock.advance(first.delay or timedelta(0))
    (message,) = h.queue.receive()
    assert h.drain(message).status == "finished"
    assert h.cluster.calls.evicted == ["team-a/web-0"] and h.clock.now() < NOW + timedelta(minutes=10)


def test_replacement_first_stops_waiting_at_wait_until() -> None:
    h = Harness("web-0")
    h.store.create_claim(make_claim(id="c-2", instance_id="i-0bbb", node_name=None, state=ClaimState.LAUNCHED))
    outcomes = h.run_until_done(make_request(replacement_claim_id="c-2", wait_until=NOW + timedelta(minutes=2)))
    assert outcomes[-1].status == "finished" and outcomes[0].reason == "replacement not initialized yet"
    assert NOW + timedelta(minutes=2) <= h.clock.now() < NOW + timedelta(minutes=3)
    assert h.cluster.calls.evicted == ["team-a/web-0"]


def test_a_replacement_that_failed_to_launch_stops_a_voluntary_drain_not_an_involuntary_one() -> None:
    h = Harness("web-0")
    h.store.create_claim(make_claim(id="c-2", instance_id=None, node_name=None, state=ClaimState.PENDING))
    pending = h.store.get_claim("c-2")
    assert pending is not None
    h.store.transition(pending, ClaimState.TERMINATED, "no capacity")
    voluntary = h.drain(make_request(replacement_claim_id="c-2"))
    assert voluntary.status == "abandoned" and h.cluster.calls.cordoned == []
    assert h.drain(make_request(replacement_claim_id="c-2", involuntary=True)).status == "finished"


def test_an_abandoned_consolidation_drain_gives_its_node_back_to_consolidation() -> None:
    """Karpenter: a replacement that fails to initialize un-taints the candidates and the next pass starts over
    (docs, concepts/disruption, "Disruption Controller" step 4). The decision's mark goes with the taint: kept,
    it would shield the node from every later decision until the drain's deadline (an empty node billed idle)."""
    h = Harness("web-0")
    mark = drain_sent(disruption_mark("consolidation (Replace)", NOW + timedelta(minutes=15), ["c-2"]))
    marked = h.store.get_claim("c-1")
    assert marked is not None
    h.store.update_claim(marked, attributes={DISRUPTION_ATTRIBUTE: mark, "emptySince": NOW.isoformat()})
    h.store.create_claim(make_claim(id="c-2", instance_id=None, node_name=None, state=ClaimState.PENDING))
    pending = h.store.get_claim("c-2")
    assert pending is not None
    h.store.transition(pending, ClaimState.TERMINATED, "no capacity")
    h.cluster.taint(NODE, DRAIN_TAINT)

    outcome = h.drain(make_request(reason="consolidation", replacement_claim_id="c-2"))

    claim = h.store.get_claim("c-1")
    assert outcome.status == "abandoned" and claim is not None and claim.state is ClaimState.REGISTERED
    assert DISRUPTION_ATTRIBUTE not in claim.attributes and not disrupting(claim, h.clock.now())
    assert claim.attributes.get("emptySince") == NOW.isoformat(), "only the mark goes"


def test_a_replacement_that_served_and_ended_is_not_waited_for() -> None:
    h = Harness("web-0")
    h.store.create_claim(make_claim(id="c-2", instance_id="i-0bbb", node_name=None, state=ClaimState.LAUNCHED))
    launched = h.store.get_claim("c-2")
    assert launched is not None
    served = h.store.transition(launched, ClaimState.REGISTERED, "joined", node_name="ip-10-0-2-9.ec2.internal")
    h.store.transition(served, ClaimState.TERMINATED, "consolidated")
    assert h.drain(make_request(replacement_claim_id="c-2")).status == "finished"


def test_a_voluntary_drain_whose_replacement_never_comes_is_abandoned_at_the_deadline() -> None:
    h = Harness("web-0")
    h.store.create_claim(make_claim(id="c-2", instance_id="i-0bbb", node_name=None, state=ClaimState.LAUNCHED))
    outcomes = h.run_until_done(make_request(replacement_claim_id="c-2"))
    assert outcomes[-1].status == "abandoned" and h.clock.now() == NOW + timedelta(minutes=10)
    assert h.cluster.calls.cordoned == [] and h.claim_state() is ClaimState.REGISTERED


def test_a_node_not_ours_is_left_alone() -> None:
    h = Harness("web-0")
    outcome = h.drain(make_request(claim_id="c-unknown", instance_id="i-0zzz"))
    assert outcome.status == "ignored"
    assert h.cluster.calls.cordoned == [] and h.fleet.terminated == []


def test_a_reused_node_name_is_not_mistaken_for_the_claims_node() -> None:
    """The Node now belongs to another instance: the claim's own node is gone, so only the claim ends."""
    h = Harness("web-0")
    h.cluster.update_node(NODE, provider_id="aws:///us-east-1a/i-0new")
    outcome = h.drain(make_request())
    assert outcome.status == "finished" and outcome.reason == "node is gone"
    assert h.cluster.calls.evicted == [] and h.cluster.calls.deleted_nodes == []
    assert h.claim_state() is ClaimState.TERMINATED


def test_a_drain_of_a_claim_already_ended_only_removes_the_node() -> None:
    h = Harness("web-0")
    claim = h.store.get_claim("c-1")
    assert claim is not None
    h.store.transition(claim, ClaimState.TERMINATED, "instance terminated")
    outcome = h.drain(make_request())
    assert outcome.status == "finished" and not outcome.terminated and h.fleet.terminated == []
    assert h.cluster.calls.deleted_nodes == [NODE]


def test_a_duplicate_request_after_the_finish_does_nothing_more() -> None:
    h = Harness("web-0")
    h.drain(make_request())
    again = h.drain(make_request())
    assert again.status == "finished" and not again.terminated
    assert len(h.fleet.terminated) == 1 and h.cluster.calls.evicted == ["team-a/web-0"]


def test_cordon_taints_with_our_taint() -> None:
    h = Harness("web-0")
    h.cluster.add_blocker(lambda pod: "PDB")
    h.drain(make_request())
    node = h.cluster.get_node(NODE)
    assert node is not None and node.unschedulable and DRAIN_TAINT in node.taints
    assert h.claim_state() is ClaimState.DRAINING


def test_a_request_for_another_cluster_is_refused() -> None:
    with pytest.raises(WrongCluster):
        Harness().drain(make_request(cluster="other"))


def test_a_failing_kubernetes_api_is_retried_soon_not_after_the_visibility_timeout() -> None:
    h = Harness("web-0")
    h.cluster.fail_next("list_nodes", KubernetesApiError("Kubernetes API unreachable", None))
    first = h.drain(make_request(), budget=timedelta(0))
    assert first.status == "continued" and "Kubernetes API failed" in first.reason
    assert first.delay == timedelta(seconds=5)
    h.clock.advance(timedelta(seconds=5))
    (message,) = h.queue.receive()
    assert message.backoff == 1 and h.drain(message).status == "finished"


def test_at_the_deadline_the_instance_goes_even_if_the_kubernetes_api_is_down() -> None:
    h = Harness("web-0")
    h.cluster.fail_next("list_nodes", KubernetesApiError("Kubernetes API unreachable", None))
    outcome = h.drain(make_request(involuntary=True, deadline=NOW))
    assert outcome.status == "finished" and outcome.terminated
    assert h.claim_state() is ClaimState.TERMINATED and h.queue.messages == []


def _refused(status: int) -> KubernetesApiError:
    from gpu_autoscaler.adapters.kubernetes.rest import KubernetesHttpError

    reason = {401: "Unauthorized", 403: "Forbidden"}[status]
    return KubernetesHttpError("POST", "/api/v1/namespaces/team-a/pods/web-0/eviction", status, reason,
                               {"kind": "Status", "code": status, "reason": reason,
                                "message": 'pods "web-0" is forbidden: User "x" cannot create resource '
                                           '"pods/eviction"'})


@pytest.mark.parametrize("status", [401, 403])
def test_a_drain_refused_access_fails_naming_the_fix_rather_than_retrying_in_silence(
    status: int, caplog: pytest.LogCaptureFixture,
) -> None:
    """A refused request (no access entry, no RBAC for evictions) is refused again on every retry: a voluntary
    drain would re-enqueue itself for ever with a WARNING each time. It fails instead (SQS redelivers it, then
    dead-letters it: the DLQ alarm), saying what grants the access."""
    from gpu_autoscaler.errors import KubernetesAccessRefused

    h = Harness("web-0")
    h.cluster.fail_next("evict", _refused(status))
    with caplog.at_level("ERROR", logger="gpu_autoscaler.services.drain"), \
            pytest.raises(KubernetesAccessRefused) as raised:
        h.drain(make_request(), budget=timedelta(minutes=5))
    assert raised.value.status == status and "gpu-autoscaler-functions" in str(raised.value)
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert h.queue.messages == [] and h.claim_state() is not ClaimState.TERMINATED


def test_at_the_deadline_the_instance_goes_even_if_access_is_refused() -> None:
    h = Harness("web-0")
    h.cluster.fail_next("list_nodes", _refused(403))
    outcome = h.drain(make_request(involuntary=True, deadline=NOW))
    assert outcome.status == "finished" and outcome.terminated


def test_an_api_failure_before_the_cordon_does_not_start_the_termination_grace_period() -> None:
    """`terminationGracePeriod` runs from the cordon (Karpenter's): a drain that met a dead API before it could
    cordon must not carry a cordon time, or its pods would be deleted, past their budgets, that much early."""
    h = Harness("web-0")
    h.cluster.fail_next("list_nodes", KubernetesApiError("Kubernetes API unreachable", None))
    first = h.drain(make_request(termination_grace_period=timedelta(minutes=5)), budget=timedelta(0))
    assert first.status == "continued"
    h.clock.advance(first.delay or timedelta(0))
    (message,) = h.queue.receive()
    assert message.cordoned_at is None


@pytest.mark.parametrize("named", [None, "i-0aaa"])
def test_a_drain_that_does_not_know_the_nodes_name_finds_it_by_its_instance(named: str | None) -> None:
    """The interruption function asks for a drain before the claim's Node is listed; the Node joins meanwhile,
    named by its private DNS name (EKS's default; nodeadm's `InstanceIdNodeName` is opt-in). The drain finds it
    by the claim's instance (its providerID) and drains it: cordon and evictions, not a termination at once. An
    older request naming the node by its instance id is read the same way."""
    h = Harness("web-0")
    h.store.create_claim(make_claim(id="c-2", state=ClaimState.DRAINING, node_name=None))
    outcome = h.drain(make_request(node_name=named, claim_id="c-2", involuntary=True))
    assert h.cluster.calls.cordoned == [NODE]
    assert outcome.evicted == ["team-a/web-0"] and outcome.node == NODE


def test_the_node_is_deleted_only_once_ec2_says_its_instance_is_terminated() -> None:
    """Karpenter keeps the Node until the cloud provider no longer finds the instance (node termination
    controller, `awaitInstanceTermination`, requeued every 5 s; a `shutting-down` instance still exists): deleted
    earlier, PodGC deletes its pods while their containers may still run their graceful shutdown, and a
    StatefulSet's successor could start before its predecessor stopped."""
    h = Harness("web-0")
    h.fleet.shutting_down.add("i-0aaa")
    first = h.drain(make_request())
    assert h.fleet.terminated and h.claim_state() is ClaimState.TERMINATED
    assert first.status == "continued" and "i-0aaa" in first.reason and first.terminated
    assert h.cluster.get_node(NODE) is not None and h.cluster.calls.deleted_nodes == []
    h.fleet.shutting_down.clear()
    visible = h.queue.next_visible()
    assert visible is not None
    h.clock.set(visible)
    (message,) = h.queue.receive()
    assert h.drain(message).status == "finished" and h.cluster.calls.deleted_nodes == [NODE]
    assert len(h.fleet.terminated) == 1


def test_a_drain_stamps_its_progress_on_the_claim_at_most_once_a_minute() -> None:
    """A drain lives in its SQS messages only; the claim says when one last worked on it, and what it was asked, so
    the consolidate tick can tell a drain that stopped (dead-lettered) and send it again (`services.reconcile`).
    The Draining transition carries the first stamp; later passes stamp once their minute is up: one write per
    pass at most, and none for the passes a blocked drain makes within a minute."""
    from gpu_autoscaler.domain.drain_progress import HEARTBEAT, drain_progress
    from gpu_autoscaler.models.messages import DrainRequest

    h = Harness("web-0", "web-1")
    h.cluster.add_blocker(lambda pod: "PDB web allows 0 disruptions")
    request = make_request(deadline=NOW + timedelta(hours=2))
    first = h.drain(request)
    claim = h.store.get_claim("c-1")
    assert claim is not None and claim.state is ClaimState.DRAINING and first.passes > 2
    progress = drain_progress(claim)
    assert progress is not None and progress.seen_at == NOW and claim.version == 1  # the transition only
    assert isinstance(progress.request, DrainRequest) and progress.request.reason == request.reason
    assert progress.request.deadline == request.deadline and progress.request.claim_id == "c-1"
    passes = first.passes
    while h.clock.now() < NOW + timedelta(minutes=3):  # the continuations, as SQS hands them out
        h.clock.set(max(h.queue.next_visible() or h.clock.now(), h.clock.now()))
        (message,) = h.queue.receive()
        passes += h.drain(message).passes
    claim = h.store.get_claim("c-1")
    assert claim is not None and passes >= 6 and 1 + 2 <= claim.version <= 1 + 3  # a stamp a minute, no more
    progress = drain_progress(claim)
    assert progress is not None and h.clock.now() - HEARTBEAT - MAX_DELAY < progress.seen_at
    assert h.clock.now() - progress.seen_at < HEARTBEAT + timedelta(minutes=1)  # the blocked drain's backoff: 60 s
    assert progress.request.cordoned_at == NOW  # as the drain now knows it

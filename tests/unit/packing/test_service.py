"""The packer service on fakes: claims stored, pods assigned, launches requested, and every step repeatable."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.initialization import INITIALIZED_ATTRIBUTE
from gpu_autoscaler.models.claims import CLAIMED_STATES, ClaimState, NodeClaim
from gpu_autoscaler.models.pods import PendingPod, PendingPodsDocument
from gpu_autoscaler.models.quotas import UsageReading
from gpu_autoscaler.services.packer import PackerService, WrongCluster
from tests.unit.packing.builders import NOW, make_catalog, make_claim, make_config, make_gang, make_pod, make_pool
from tests.unit.packing.fakes import Boom, FakeStateStore, FixedQuotas, RecordingLaunchQueue

if TYPE_CHECKING:
    from collections.abc import Sequence


class Harness:
    def __init__(self, **config: Any) -> None:
        self.clock = FixedClock(NOW)
        self.config = make_config(make_pool(), make_pool("shared", gpuSharing={"mode": "time-slicing", "replicas": 4},
                                                         taints=[{"key": "shared", "effect": "NoSchedule"}]),
                                  **config)
        self.store = FakeStateStore(self.clock)
        self.launches = RecordingLaunchQueue()
        self.service = PackerService(self.config, self.store, make_catalog(), self.launches, clock=self.clock)

    def document(self, pods: list[PendingPod], cluster: str = "test") -> PendingPodsDocument:
        return PendingPodsDocument.model_validate(
            {"schemaVersion": 1, "cluster": cluster, "sentAt": NOW.isoformat(), "pods": [p.model_dump(by_alias=True)
                                                                                     for p in pods]})


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_claims_are_stored_pods_assigned_and_launches_requested(h: Harness) -> None:
    pods = [make_pod(cpu="2", memory="8Gi"), make_pod(cpu="2", memory="8Gi")]
    outcome = h.service.handle(h.document(pods), source="m-1")
    assert len(outcome.created) == 2 and len(h.store.claims) == 2
    assert {uid: h.store.pods[uid][0] for uid in h.store.pods} == {
        c.pods[0]: c.id for c in h.store.claims.values()}
    assert [r.claim_ids for r in h.launches.sent] == [list(outcome.created)]  # they ask EC2 for the same thing
    assert all(r.gang is None and r.cluster == "test" for r in h.launches.sent)
    assert outcome.price_per_hour == pytest.approx(sum(c.price_per_hour for c in h.store.claims.values()))


def test_claims_that_ask_for_the_same_thing_share_launch_requests_of_ten(h: Harness) -> None:
    """One CreateFleet for ten like instances instead of ten calls; unlike claims never share a request."""
    pods = [make_pod(cpu="2", memory="8Gi") for _ in range(25)] + [make_pod(gpus=8, cpu="20", memory="64Gi")]
    outcome = h.service.handle(h.document(pods), source="m-1")
    assert len(outcome.created) == 26
    sizes = sorted(len(r.claim_ids) for r in h.launches.sent)
    assert sizes == [1, 5, 10, 10]
    assert sorted(cid for r in h.launches.sent for cid in r.claim_ids) == sorted(outcome.created)
    for request in h.launches.sent:
        asks = {(c.pool, c.capacity_type, c.instance_types, c.zones) for c in
                (h.store.claims[cid] for cid in request.claim_ids)}
        assert len(asks) == 1


def test_a_gang_is_one_launch_request(h: Harness) -> None:
    outcome = h.service.handle(h.document(make_gang("train", 3, gpus=8, cpu="20", memory="64Gi")), source="m-1")
    assert len(h.launches.sent) == 1
    assert h.launches.sent[0].gang == "test/train" and h.launches.sent[0].claim_ids == list(outcome.created)


def test_the_same_document_twice_provisions_once(h: Harness) -> None:
    pods = [make_pod(), make_pod(gpus=8, cpu="20", memory="64Gi")]
    first = h.service.handle(h.document(pods), source="m-1")
    second = h.service.handle(h.document(pods), source="m-2")
    assert len(h.store.claims) == len(first.created) == 2
    assert second.created == () and second.covered == 2 and len(h.launches.sent) == 2


def test_a_redelivered_message_finds_its_claims_and_asks_again_for_the_pending_ones(h: Harness) -> None:
    pods = [make_pod(), make_pod(cpu="2", memory="8Gi")]
    first = h.service.handle(h.document(pods), source="m-1")
    again = h.service.handle(h.document(pods), source="m-1")
    assert len(h.store.claims) == 2 and again.created == ()
    assert sorted(cid for ids in again.launch_requests for cid in ids) == sorted(first.created)


def test_a_crash_after_storing_claims_is_finished_by_the_redelivery(h: Harness) -> None:
    pods = [make_pod(cpu="2", memory="8Gi")]
    h.store.fail_next["assign_pods"] = Boom("crash")
    with pytest.raises(Boom):
        h.service.handle(h.document(pods), source="m-1")
    assert len(h.store.claims) == 1 and not h.store.pods and not h.launches.sent
    outcome = h.service.handle(h.document(pods), source="m-1")
    (claim,) = h.store.claims.values()
    assert outcome.created == () and outcome.covered == 1  # the claim was made by the first attempt
    assert h.store.pods[pods[0].uid][0] == claim.id
    assert [r.claim_ids for r in h.launches.sent] == [[claim.id]]


def test_a_claim_whose_pods_were_taken_meanwhile_is_closed_before_launch(h: Harness) -> None:
    pod = make_pod(cpu="2", memory="8Gi")
    other = make_claim(id="nc-other", pool="gpu", state=ClaimState.REGISTERED)
    h.store.claims[other.id] = other
    original = h.store.assign_pods

    def taken(claim_id: str, pod_uids: Sequence[str], ttl: timedelta) -> list[str]:
        original(other.id, pod_uids, ttl)  # another writer got there first
        return original(claim_id, pod_uids, ttl)

    h.store.assign_pods = taken  # type: ignore[method-assign]
    outcome = h.service.handle(h.document([pod]), source="m-1")
    assert outcome.created == () and not h.launches.sent
    closed = [c for c in h.store.claims.values() if c.id != other.id]
    assert [c.state for c in closed] == [ClaimState.TERMINATED]


def test_pods_fill_a_claim_in_flight_and_its_room_is_recorded(h: Harness) -> None:
    claim = make_claim(pool="gpu", instance_types=("g5.12xlarge",), pods=("p-old",), attributes={
        "requests": '{"cpu":8000,"memory":8589934592,"nvidia.com/gpu":1,"pods":1}'})
    h.store.claims[claim.id] = claim
    pods = [make_pod(cpu="8", memory="8Gi") for _ in range(3)]
    outcome = h.service.handle(h.document(pods), source="m-1")
    assert outcome.placed_in_flight == 3 and outcome.created == () and not h.launches.sent
    updated = h.store.claims[claim.id]
    assert updated.pods == ("p-old", *(p.uid for p in pods))
    assert updated.attributes["requests"] == '{"cpu":32000,"memory":34359738368,"nvidia.com/gpu":4,"pods":4}'
    # Full now: the next pod needs a node of its own.
    assert len(h.service.handle(h.document([make_pod(cpu="8", memory="8Gi")]), source="m-2").created) == 1


def test_a_claim_another_writer_got_to_first_is_read_again_and_its_pods_added(h: Harness) -> None:
    claim = make_claim(pool="gpu", instance_types=("g5.12xlarge",))
    h.store.claims[claim.id] = claim
    h.store.refuse_next.add(claim.id)  # the fleet recording its attempt between our read and our write
    pod = make_pod()
    outcome = h.service.handle(h.document([pod]), source="m-1")
    assert outcome.placed_in_flight == 1 and h.store.claims[claim.id].pods == (pod.uid,)


def test_a_claim_that_moved_on_keeps_its_pods_assigned(h: Harness) -> None:
    claim = make_claim(pool="gpu", instance_types=("g5.12xlarge",))
    h.store.claims[claim.id] = claim
    h.store.refuse_next.add(claim.id)
    original = h.store.get_claims

    def launched_meanwhile(claim_ids: Any) -> dict[str, Any]:
        found = original(claim_ids)
        if h.store.calls.count("get_claims") > 1:  # the read after the refused write: it was launched
            found = {cid: c.model_copy(update={"state": ClaimState.LAUNCHED}) for cid, c in found.items()}
            h.store.claims.update(found)
        return found

    h.store.get_claims = launched_meanwhile  # type: ignore[method-assign]
    pod = make_pod()
    outcome = h.service.handle(h.document([pod]), source="m-1")
    assert outcome.placed_in_flight == 1 and h.store.pods[pod.uid][0] == claim.id
    assert h.store.claims[claim.id].pods == ()  # the room bookkeeping of a claim in flight is skipped


def test_pods_joining_many_claims_in_flight_read_and_write_them_together(h: Harness) -> None:
    claims = [make_claim(id=f"nc-{n}", pool="gpu", instance_types=("g5.12xlarge",)) for n in range(20)]
    h.store.claims.update({c.id: c for c in claims})
    outcome = h.service.handle(h.document([make_pod() for _ in range(80)]), source="m-1")
    assert outcome.placed_in_flight == 80 and outcome.created == ()
    assert all(len(h.store.claims[c.id].pods) == 4 for c in claims)
    assert h.store.calls.count("get_claims") == 1 and h.store.calls.count("update_claims") == 1
    assert "get_claim" not in h.store.calls and "update_claim" not in h.store.calls


def test_documents_of_another_cluster_are_refused(h: Harness) -> None:
    with pytest.raises(WrongCluster, match="cluster 'elsewhere'"):
        h.service.handle(h.document([make_pod()], cluster="elsewhere"))


def test_demand_is_recorded_per_pool_in_five_minute_buckets() -> None:
    h = Harness()
    h.clock.set(NOW + timedelta(minutes=7, seconds=12))
    pods = [make_pod(gpus=2, cpu="8", memory="32Gi")] + [
        make_pod(tolerate=False, tolerations=[{"key": "shared", "operator": "Exists"}]) for _ in range(2)]
    h.service.handle(h.document(pods), source="m-1")
    bucket = NOW + timedelta(minutes=5)
    assert h.store.demand == {("gpu", bucket): 2.0, ("shared", bucket): 0.5}


def test_with_prediction_on_each_pod_shape_class_is_recorded_too() -> None:
    # Pre-warm shapes its headroom by these series (`domain.pod_shapes`): the pods' GPUs and CPU/memory per GPU.
    h = Harness(predictive={"enabled": True})
    pods = [make_pod(gpus=2, cpu="8", memory="32Gi"), make_pod(cpu="12", memory="48Gi"),
            make_pod(tolerate=False, tolerations=[{"key": "shared", "operator": "Exists"}])]
    h.service.handle(h.document(pods), source="m-1")
    assert h.store.demand == {("gpu", NOW): 3.0, ("gpu/2d-t1", NOW): 2.0, ("gpu/1d-t2", NOW): 1.0,
                              ("shared", NOW): 0.25, ("shared/1d-t1", NOW): 0.25}


def test_with_a_window_of_gpus_each_pod_shape_class_is_recorded_without_prediction() -> None:
    # A window that asks for a GPU count is shaped by these series too, prediction on or off.
    h = Harness(scalingWindows=[{"name": "peak", "schedule": "cron(0 9 ? * MON-FRI *)", "duration": "9h",
                                 "nodePool": "gpu", "warm": {"gpus": 8}}])
    assert not h.config.predictive.enabled
    h.service.handle(h.document([make_pod(cpu="12", memory="48Gi")]), source="m-1")
    assert h.store.demand == {("gpu", NOW): 1.0, ("gpu/1d-t2", NOW): 1.0}


def test_unschedulable_pods_are_reported(h: Harness) -> None:
    outcome = h.service.handle(h.document([make_pod(gpus=16)]), source="m-1")
    assert outcome.created == () and len(outcome.unschedulable) == 1
    assert outcome.summary()["unschedulable"][0]["reason"].startswith("no offering in pool gpu has 16 GPUs")


def test_a_pod_asking_for_more_than_any_node_holds_is_reported_and_the_rest_of_the_document_packed(
        h: Harness) -> None:
    """The API server bounds a request only from below, so any pod may ask for `memory: 10E`, beyond an int64: it
    is reported with its quantity, and the pods pending beside it (the same document, the cluster's FIFO group)
    are packed."""
    absurd = make_pod(memory="10E")
    outcome = h.service.handle(h.document([make_pod(), absurd, make_pod(cpu="10P")]), source="m-1")
    assert len(outcome.created) == 1
    reasons = {u["pod"]: u["reason"] for u in outcome.summary()["unschedulable"]}
    assert len(reasons) == 2 and reasons[absurd.uid] == "it asks for more than any node holds: memory 10E"


def test_quotas_come_from_the_quota_source() -> None:
    h = Harness()
    service = PackerService(h.config, h.store, make_catalog(), h.launches, clock=h.clock,
                            quotas=FixedQuotas({"g/spot": 4, "g/on-demand": 0, "p/spot": 0, "p/on-demand": 0}))
    outcome = service.handle(h.document([make_pod(cpu="2", memory="8Gi") for _ in range(2)]), source="m-1")
    assert len(outcome.created) == 1 and "vCPU quota" in outcome.unschedulable[0].reason


def test_unavailable_offerings_from_the_store_are_avoided(h: Harness) -> None:
    for zone in ("us-east-1a", "us-east-1b"):
        h.store.mark_unavailable(("g6.xlarge", zone, "spot"), timedelta(minutes=3), "InsufficientInstanceCapacity")
    h.service.handle(h.document([make_pod(cpu="2", memory="8Gi")]), source="m-1")
    (claim,) = h.store.claims.values()
    assert claim.instance_types[0] == "g5.xlarge"


def test_a_crash_before_assigning_pods_of_a_roomy_claim_does_not_double_book_it(h: Harness) -> None:
    # One 1-GPU pod on a 4-GPU claim in flight leaves room for three: the redelivery must not put the
    # same pod into that room a second time.
    pod = make_pod(cpu="2", memory="8Gi", nodeSelector={"node.kubernetes.io/instance-type": "g5.12xlarge"})
    h.store.fail_next["assign_pods"] = Boom("crash")
    with pytest.raises(Boom):
        h.service.handle(h.document([pod]), source="m-1")
    (claim,) = h.store.claims.values()
    outcome = h.service.handle(h.document([pod]), source="m-1")
    assert outcome.covered == 1 and outcome.placed_in_flight == 0
    assert h.store.claims[claim.id].pods == (pod.uid,) and h.store.pods[pod.uid][0] == claim.id
    assert [r.claim_ids for r in h.launches.sent] == [[claim.id]]


def _initialized(h: Harness, claim: NodeClaim) -> NodeClaim:
    """What the reconcile step records on the first tick that sees the claim's node initialized."""
    return h.store.update_claim(claim, attributes={**claim.attributes,
                                                   INITIALIZED_ATTRIBUTE: h.clock.now().isoformat()})


def test_pods_still_pending_on_a_registered_node_are_planned_again_after_the_grace(h: Harness) -> None:
    """The scheduler gave a node's room to other pods: its claim's own pods, still reported, get new capacity,
    but not before the grace (the scheduler needs a moment to bind them to a node that just joined)."""
    pod = make_pod()
    first = h.service.handle(h.document([pod]), source="m1")
    claim = h.store.claims[first.created[0]]
    claim = h.store.transition(claim, ClaimState.LAUNCHED, instance_id="i-1")
    _initialized(h, h.store.transition(claim, ClaimState.REGISTERED, node_name="node-1"))

    h.clock.advance(timedelta(seconds=30))
    assert h.service.handle(h.document([pod]), source="m2").created == ()

    h.clock.advance(h.config.timeouts.scheduling_grace)
    again = h.service.handle(h.document([pod]), source="m3")
    assert len(again.created) == 1 and again.created[0] != claim.id
    assert h.store.assignments([pod.uid]) == {pod.uid: again.created[0]}


def test_pods_whose_room_went_to_pods_of_a_claim_still_in_flight_wait_for_that_claim(h: Harness) -> None:
    """kube-scheduler binds pending pods oldest first to whichever node is up, not to the node planned for them:
    the node of claim B (made for pod b) came up first and took pod a, whose claim A is still launching. b is
    not displaced while A — in flight when B's node came — can still come: its room is b's once
    it does (planning them again launched a node for each such swap: 567 instances for 1,000 pods where 500
    would do, on the emulator). Once A has come too and the grace is over, pods still pending are planned again."""
    a_pods, b_pods = ([make_pod(gpus=4, cpu="8", memory="32Gi")] for _ in range(2))  # a node each
    claim_a = h.store.claims[h.service.handle(h.document(a_pods), source="m-a").created[0]]
    claim_b = h.store.claims[h.service.handle(h.document(b_pods), source="m-b").created[0]]
    assert claim_a.id != claim_b.id
    claim_a = h.store.transition(claim_a, ClaimState.LAUNCHED, instance_id="i-a")
    claim_b = h.store.transition(claim_b, ClaimState.LAUNCHED, instance_id="i-b")
    h.clock.advance(timedelta(seconds=10))
    _initialized(h, h.store.transition(claim_b, ClaimState.REGISTERED, node_name="node-b"))  # a bound there

    h.clock.advance(h.config.timeouts.scheduling_grace + timedelta(minutes=3))
    waiting = h.service.handle(h.document(b_pods), source="m-1")
    assert waiting.created == () and waiting.covered == 1
    assert h.store.assignments([p.uid for p in b_pods]) == {p.uid: claim_b.id for p in b_pods}

    _initialized(h, h.store.transition(claim_a, ClaimState.REGISTERED, node_name="node-a"))  # b bound there: done
    h.clock.advance(h.config.timeouts.scheduling_grace + timedelta(seconds=1))
    still = h.service.handle(h.document(b_pods), source="m-2")  # no: their room really went elsewhere
    assert len(still.created) == 1 and still.created[0] not in (claim_a.id, claim_b.id)


def test_the_grace_counts_from_the_nodes_initialization_not_its_registration(h: Harness) -> None:
    """A Node appears minutes before a GPU node can take a GPU pod (NotReady, the cloud controller manager's
    uninitialized taint, then the GPU Operator's chain): its claim's pods, still pending then, lost their room to
    nobody. They are planned again only once the node has been initialized for the grace."""
    pod = make_pod(gpus=1)
    first = h.service.handle(h.document([pod]), source="m1")
    claim = h.store.claims[first.created[0]]
    claim = h.store.transition(claim, ClaimState.LAUNCHED, instance_id="i-1")
    claim = h.store.transition(claim, ClaimState.REGISTERED, node_name="node-1")
    assert INITIALIZED_ATTRIBUTE not in claim.attributes and "bootSeconds" not in claim.attributes

    h.clock.advance(h.config.timeouts.scheduling_grace + timedelta(minutes=3))  # registered 5 minutes ago
    assert h.service.handle(h.document([pod]), source="m2").created == ()
    claim = _initialized(h, h.store.claims[claim.id])

    h.clock.advance(h.config.timeouts.scheduling_grace - timedelta(seconds=1))
    assert h.service.handle(h.document([pod]), source="m3").created == ()
    h.clock.advance(timedelta(seconds=1))
    again = h.service.handle(h.document([pod]), source="m4")
    assert len(again.created) == 1 and again.created[0] != claim.id


def test_a_claim_registered_before_initialization_was_recorded_counts_from_its_boot_time(h: Harness) -> None:
    """Claims registered by an earlier version carry only `bootSeconds` (launch → Ready with GPUs allocatable)."""
    pod = make_pod(gpus=1)
    claim = h.store.claims[h.service.handle(h.document([pod]), source="m1").created[0]]
    claim = h.store.transition(claim, ClaimState.LAUNCHED, instance_id="i-1")
    h.clock.advance(timedelta(minutes=1))
    claim = h.store.transition(claim, ClaimState.REGISTERED, node_name="node-1",
                               attributes={**claim.attributes, "bootSeconds": "240"})  # initialized 3 min later
    h.clock.advance(timedelta(minutes=3) + h.config.timeouts.scheduling_grace - timedelta(seconds=1))
    assert h.service.handle(h.document([pod]), source="m2").created == ()
    h.clock.advance(timedelta(seconds=1))
    assert len(h.service.handle(h.document([pod]), source="m3").created) == 1


def test_pods_of_a_node_never_initialized_are_planned_again_past_its_registration_allowance(h: Harness) -> None:
    """A node not initialized `registrationTtl` after its registration is given up (the reconcile step ends its
    claim): its pods get new capacity then, whatever claims are in flight."""
    pod = make_pod(gpus=1)
    claim = h.store.claims[h.service.handle(h.document([pod]), source="m1").created[0]]
    claim = h.store.transition(claim, ClaimState.LAUNCHED, instance_id="i-1")
    h.clock.advance(timedelta(minutes=2))
    h.store.transition(claim, ClaimState.REGISTERED, node_name="node-1")
    assert h.service.handle(h.document([make_pod(gpus=4)]), source="other").created  # a claim in flight meanwhile
    h.clock.advance(h.config.timeouts.registration_ttl - timedelta(seconds=1))
    assert h.service.handle(h.document([pod]), source="m2").created == ()
    h.clock.advance(timedelta(seconds=1))
    again = h.service.handle(h.document([pod]), source="m3")
    assert len(again.created) == 1 and again.created[0] != claim.id


def test_one_document_reads_the_clusters_claims_and_its_pods_assignments_once(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read returns every claim kept (live ones and, for weeks, terminated ones): a backlog of documents
    pays it per document, so it is paid once, not once to release displaced pods and again to plan."""
    h.service.handle(h.document([make_pod(cpu="2", memory="8Gi") for _ in range(3)]), source="m-1")
    reads: list[str] = []
    for name in ("list_claims", "assignments"):
        original = getattr(h.store, name)
        def counted(*a: Any, _o: Any = original, _n: str = name, **k: Any) -> Any:
            reads.append(_n)
            return _o(*a, **k)

        monkeypatch.setattr(h.store, name, counted)

    h.service.handle(h.document([make_pod(cpu="2", memory="8Gi") for _ in range(3)]), source="m-2")

    assert sorted(reads) == ["assignments", "list_claims"]


def test_vcpus_the_rest_of_the_account_uses_leave_only_the_remainder_of_a_quota() -> None:
    """EC2's vCPU quotas are per account and region: another workload's 64 G vCPUs in use against a 96 vCPU quota
    leave this cluster 32. Without counting them the packer planned six g5.2xlarge (48 vCPUs) and CreateFleet
    refused what went past the quota (`VcpuLimitExceeded`)."""
    h = Harness()
    quotas = FixedQuotas({"g/on-demand": 96, "g/spot": 0, "p/spot": 0, "p/on-demand": 0},
                         usage={"g/on-demand": UsageReading(64, NOW - timedelta(minutes=1))})
    config = make_config(make_pool(capacityTypes=["on-demand"]))
    service = PackerService(config, h.store, make_catalog(), h.launches, clock=h.clock, quotas=quotas)
    pinned = {"node.kubernetes.io/instance-type": "g5.2xlarge"}
    outcome = service.handle(h.document([make_pod(cpu="2", memory="8Gi", nodeSelector=pinned) for _ in range(6)]),
                             source="m-1")
    assert len(outcome.created) == 4  # 4 x 8 vCPUs: the 32 the other workload leaves
    assert len(outcome.unschedulable) == 2
    assert outcome.unschedulable[0].reason == ("the vCPU quota g/on-demand (96 vCPUs, 32 in use or planned here, 64 by "
                                               "the account's other instances) has no room for it")


def test_a_quota_the_rest_of_the_account_fills_leaves_no_room_for_a_larger_node() -> None:
    h = Harness()
    quotas = FixedQuotas({"g/on-demand": 96, "g/spot": 0, "p/spot": 0, "p/on-demand": 0},
                         usage={"g/on-demand": UsageReading(64, NOW - timedelta(minutes=1))})
    config = make_config(make_pool(capacityTypes=["on-demand"]))
    service = PackerService(config, h.store, make_catalog(), h.launches, clock=h.clock, quotas=quotas)
    pinned = {"node.kubernetes.io/instance-type": "g5.12xlarge"}
    outcome = service.handle(h.document([make_pod(gpus=4, cpu="2", memory="8Gi", nodeSelector=pinned)
                                         for _ in range(2)]), source="m-1")
    assert outcome.created == ()  # one g5.12xlarge is 48 vCPUs: more than the 32 left
    assert all("vCPU quota g/on-demand" in u.reason for u in outcome.unschedulable)


def test_two_planners_at_once_never_record_more_on_a_claim_than_its_node_holds() -> None:
    """The interruption function plans replacements in its own invocations, beside the packer: when both place a pod
    on the last room of one claim in flight, the second write re-checks the fit on the claim as the first left it.
    The pod that no longer fits is released (its assignment deleted), so the next report plans it a node. On the
    versioned store (`MemoryStateStore`, as DynamoDB's): the fake's writes stand on the state alone."""
    clock = FixedClock(NOW)
    config = make_config(make_pool())
    store = MemoryStateStore("test", clock)
    claim = make_claim(pool="gpu", instance_types=("g5.12xlarge",), pods=("p-1", "p-2", "p-3"), attributes={
        "requests": '{"cpu":3000,"memory":12884901888,"nvidia.com/gpu":3,"pods":3}'})
    store.create_claim(claim)
    ours = PackerService(config, store, make_catalog(), RecordingLaunchQueue(), clock=clock)
    other = PackerService(config, store, make_catalog(), RecordingLaunchQueue(), clock=clock)
    mine, theirs = make_pod(), make_pod()
    original = store.update_claims
    raced: list[bool] = []

    def racing(updates: Any) -> Any:
        if not raced:  # we planned and assigned; the other planner runs whole before our write
            raced.append(True)
            assert other.handle(_document([theirs]), source="m-b").placed_in_flight == 1
        return original(updates)

    store.update_claims = racing  # type: ignore[method-assign]
    outcome = ours.handle(_document([mine]), source="m-a")
    stored = store.get_claim(claim.id)
    assert stored is not None and stored.pods == ("p-1", "p-2", "p-3", theirs.uid)
    assert stored.attributes["requests"] == '{"cpu":4000,"memory":17179869184,"nvidia.com/gpu":4,"pods":4}'
    assert outcome.placed_in_flight == 0 and store.assignments([mine.uid]) == {}  # released, not left on it
    store.update_claims = original  # type: ignore[method-assign]
    again = ours.handle(_document([mine]), source="m-c")
    assert len(again.created) == 1 and store.assignments([mine.uid]) == {mine.uid: again.created[0]}


def _document(pods: list[PendingPod]) -> PendingPodsDocument:
    return PendingPodsDocument.model_validate({"schemaVersion": 1, "cluster": "test", "sentAt": NOW.isoformat(),
                                               "pods": [p.model_dump(by_alias=True) for p in pods]})


def _live_gpus(store: MemoryStateStore) -> int:
    return sum(json.loads(c.attributes.get("requests", "{}")).get("nvidia.com/gpu", 0)
               for c in store.list_claims(CLAIMED_STATES))


def test_two_planners_at_once_keep_a_pool_within_its_gpu_limit() -> None:
    """The pool's limit is checked against the claims each planner read, and nothing serialises the planners (the
    interruption function plans replacements beside the packer). So each re-reads the pool once its claims are
    stored and withdraws its own that take the pool past the limit, counting every other planner's first (as
    Karpenter checks `limits` again just before each create, provisioner.go); their pods are released and planned on
    their next report. Before: `2 live claims hold 8 GPUs` in a pool limited to 4."""
    clock = FixedClock(NOW)
    config = make_config(make_pool(limits={"gpus": 4}))
    store = MemoryStateStore("test", clock)
    ours = PackerService(config, store, make_catalog(), RecordingLaunchQueue(), clock=clock)
    launches = RecordingLaunchQueue()
    other = PackerService(config, store, make_catalog(), launches, clock=clock)
    mine, theirs = make_pod(gpus=4, cpu="16", memory="64Gi"), make_pod(gpus=4, cpu="16", memory="64Gi")
    original = store.create_claims
    raced: list[bool] = []

    def racing(claims: Any) -> Any:
        if not raced:  # we planned against an empty pool; the other planner runs whole before our claim is stored
            raced.append(True)
            assert len(other.handle(_document([theirs]), source="m-b").created) == 1
        return original(claims)

    store.create_claims = racing  # type: ignore[method-assign]
    outcome = ours.handle(_document([mine]), source="m-a")
    assert _live_gpus(store) == 4
    assert outcome.created == () and outcome.launch_requests == ()
    assert store.assignments([mine.uid]) == {}  # released: its next report plans it again
    ended = [c for c in store.list_claims([ClaimState.TERMINATED]) if mine.uid in c.pods]
    assert len(ended) == 1 and "limit" in ended[0].reason


def test_a_gang_that_would_take_its_pool_past_the_limit_is_withdrawn_whole() -> None:
    """All or nothing: one member's claim past the limit withdraws every claim of the gang."""
    clock = FixedClock(NOW)
    config = make_config(make_pool(limits={"gpus": 8}))
    store = MemoryStateStore("test", clock)
    catalog = make_catalog(("g5.12xlarge",))  # 4 GPUs a node: the gang takes two claims
    ours = PackerService(config, store, catalog, RecordingLaunchQueue(), clock=clock)
    other = PackerService(config, store, catalog, RecordingLaunchQueue(), clock=clock)
    gang = make_gang("train", 2, gpus=4, cpu="16", memory="64Gi")
    original = store.create_claims
    raced: list[bool] = []

    def racing(claims: Any) -> Any:
        if not raced:
            raced.append(True)
            other.handle(_document([make_pod(gpus=4, cpu="16", memory="64Gi")]), source="m-b")
        return original(claims)

    store.create_claims = racing  # type: ignore[method-assign]
    outcome = ours.handle(_document(gang), source="m-a")
    assert len([c for c in store.list_claims([ClaimState.TERMINATED]) if c.gang]) == 2  # both members' claims
    assert outcome.created == () and _live_gpus(store) == 4
    assert store.assignments([p.uid for p in gang]) == {}

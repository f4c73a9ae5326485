"""A replacement claim's room after its pods are evicted: their successors (new uids, from the ReplicaSet) are
placed on it, never on a second node. Memory adapters, the real interruption, drain and packer services."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.adapters.memory.cluster import DisruptionBudget, MemoryCluster
from gpu_autoscaler.adapters.memory.queues import MemoryDrainQueue, MemoryLaunchQueue
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.interruption import parse_notice, replacement_pods
from gpu_autoscaler.domain.packing.fit import pod_requests
from gpu_autoscaler.domain.packing.results import REQUESTS_ATTRIBUTE, claim_requests, requests_attribute
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Toleration
from gpu_autoscaler.services.drain import DrainService
from gpu_autoscaler.services.interruption import InterruptionService
from gpu_autoscaler.services.packer import PackerService, free_room
from tests.unit.drain.fakes import RecordingFleet
from tests.unit.packing.builders import make_catalog, make_config, make_pool

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpu_autoscaler.models.messages import DrainRequest

INSTANCE = "i-0f3a9c1e5b7d24680"
NODE = "ip-10-0-7-1.ec2.internal"
WARNED_AT = datetime(2026, 11, 22, 10, 25, tzinfo=UTC)
REQUESTS = Resources.from_quantities({"cpu": "500m", "memory": "2Gi", "nvidia.com/gpu": "1"})
TOLERATE = (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),)


def spot_warning() -> dict[str, object]:
    return {"version": "0", "id": "5d2a6c1e-0000-4000-8000-000000000001", "source": "aws.ec2",
            "detail-type": "EC2 Spot Instance Interruption Warning", "account": "123456789012",
            "time": "2026-11-22T10:25:00Z", "region": "us-east-1",
            "resources": [f"arn:aws:ec2:us-east-1a:instance/{INSTANCE}"],
            "detail": {"instance-id": INSTANCE, "instance-action": "terminate"}}


class Scene:
    """A Registered Spot node running `pods` one-GPU ReplicaSet pods (and a DaemonSet pod); its controllers
    recreate evicted pods with new uids, as Kubernetes does."""

    def __init__(self, pods: int = 2) -> None:
        self.clock = FixedClock(WARNED_AT)
        self.config = make_config(make_pool())
        self.store = MemoryStateStore("test", self.clock)
        self.cluster = MemoryCluster(recreate_evicted=True)
        self.launches = MemoryLaunchQueue()
        self.drains = MemoryDrainQueue(self.clock)
        self.fleet = RecordingFleet(self.store)
        self.packer = PackerService(self.config, self.store, make_catalog(), self.launches, clock=self.clock)
        self.interruption = InterruptionService(self.config, self.store, self.cluster, self.fleet, self.packer,
                                                self.drains, clock=self.clock)
        self.drainer = DrainService("test", self.store, self.cluster, self.fleet, self.drains, clock=self.clock,
                                    sleep=lambda s: self.clock.advance(timedelta(seconds=s)))
        self.store.create_claim(NodeClaim(
            cluster="test", id="nc-old", pool="gpu", capacity_type="spot", zones=("us-east-1a",),
            instance_types=("g5.xlarge",), price_per_hour=0.41, created_at=WARNED_AT - timedelta(hours=2),
            state=ClaimState.REGISTERED, instance_id=INSTANCE, instance_type="g5.xlarge", zone="us-east-1a",
            node_name=NODE, pods=tuple(f"uid-{i}" for i in range(pods))))
        self.cluster.add_node(ClusterNode(name=NODE, provider_id=f"aws:///us-east-1a/{INSTANCE}", ready=True,
                                          allocatable=Resources.from_quantities({"cpu": "4", "nvidia.com/gpu": "4"})))
        for i in range(pods):
            self.cluster.add_pod(ClusterPod(uid=f"uid-{i}", namespace="ml", name=f"infer-{i}", node_name=NODE,
                                            requests=REQUESTS, owner_kind="ReplicaSet", phase="Running",
                                            labels={"app": "infer"}, tolerations=TOLERATE))
        self.cluster.add_pod(ClusterPod(uid="uid-ds", namespace="kube-system", name="nvidia-device-plugin",
                                        node_name=NODE, owner_kind="DaemonSet", phase="Running"))

    def warn(self) -> DrainRequest:
        """The Spot warning handled: replacements stored and launch requested, one drain request queued."""
        (outcome,) = self.interruption.handle(parse_notice(spot_warning()))
        assert outcome.action == "replace-and-drain" and outcome.replacements
        (request,) = self.drains.receive()
        return request

    def replacements(self) -> list[NodeClaim]:
        return sorted((c for c in self.store.list_claims() if c.id != "nc-old"), key=lambda c: c.id)

    def pending_document(self) -> PendingPodsDocument:
        """What the agent reports once the ReplicaSet has recreated the evicted pods."""
        pods = replacement_pods(self.cluster.pending_pods())
        return PendingPodsDocument(schema_version=1, cluster="test", sent_at=self.clock.now(), pods=pods)


def recorded(uids: Iterable[str], scene: Scene) -> Resources:
    """The requests a claim records for these pods, as the packer computes them."""
    total = Resources()
    by_uid = {p.uid: p for p in replacement_pods(scene.cluster.list_pods())}
    for uid in uids:
        total = total + pod_requests(by_uid[uid])
    return total


@pytest.mark.parametrize("launched", [False, True], ids=["pending", "launched"])
def test_the_evicted_pods_successors_land_on_the_replacement_not_on_a_second_node(launched: bool) -> None:
    s = Scene()
    request = s.warn()
    before = s.replacements()
    assert sorted(u for c in before for u in c.pods) == ["uid-0", "uid-1"]
    if launched:
        for claim in before:
            s.store.transition(claim, ClaimState.LAUNCHED, "fleet", instance_id=f"i-new{claim.id[-6:]}",
                               instance_type=claim.instance_types[0], zone=claim.zones[0])
    sent = len(s.launches.sent)

    outcome = s.drainer.drain(request, budget=timedelta(seconds=60))
    assert outcome.status == "continued" and "AWS reclaims" in outcome.reason  # emptied; the instance waits
    assert outcome.evicted == ["ml/infer-0", "ml/infer-1", "kube-system/nvidia-device-plugin"]
    emptied = s.replacements()
    assert all(c.pods == () and claim_requests(c) == Resources() for c in emptied)
    assert s.store.assignments(["uid-0", "uid-1"]) == {}

    document = s.pending_document()
    new_uids = sorted(p.uid for p in document.pods)
    assert len(new_uids) == 2 and not {"uid-0", "uid-1"} & set(new_uids)
    packed = s.packer.handle(document, source="agent-message-2")

    assert packed.created == () and packed.placed_in_flight == 2
    assert len(s.launches.sent) == sent  # nothing new to launch
    after = s.replacements()
    assert [c.id for c in after] == [c.id for c in before]
    assert sorted(u for c in after for u in c.pods) == new_uids
    for claim in after:
        assert claim_requests(claim) == recorded(claim.pods, s)
    assert set(s.store.assignments(new_uids).values()) <= {c.id for c in after}


def test_a_crash_between_freeing_the_room_and_evicting_is_repaired_by_the_redelivery() -> None:
    s = Scene()
    request = s.warn()
    s.cluster.fail_next("evict", RuntimeError("the Lambda died mid-pass"))
    with pytest.raises(RuntimeError):
        s.drainer.drain(request, budget=timedelta(seconds=60))
    assert {p.uid for p in s.cluster.list_pods(NODE)} == {"uid-0", "uid-1", "uid-ds"}  # nothing evicted yet
    freed = s.replacements()
    assert all(c.pods == () and claim_requests(c) == Resources() for c in freed)

    outcome = s.drainer.drain(request, budget=timedelta(seconds=60))  # SQS redelivers the same message
    assert outcome.status == "continued" and s.cluster.list_pods(NODE) == []
    assert s.replacements() == freed  # the repeat took nothing off twice (no negative room, no write)
    packed = s.packer.handle(s.pending_document(), source="agent-message-2")
    assert packed.created == () and packed.placed_in_flight == 2


def test_freeing_twice_writes_once_and_only_takes_off_the_named_pods() -> None:
    s = Scene(pods=3)
    s.warn()
    claims = s.replacements()
    holder = next(c for c in claims if c.pods)
    first = holder.pods[0]
    pod = next(p for p in replacement_pods(s.cluster.list_pods(NODE)) if p.uid == first)
    assert free_room(s.store, [holder.id], [pod]) == {holder.id: (first,)}
    once = s.store.get_claim(holder.id)
    assert once is not None and first not in once.pods
    assert claim_requests(once) == claim_requests(holder) - pod_requests(pod)
    s.clock.advance(timedelta(seconds=5))
    assert free_room(s.store, [holder.id], [pod]) == {}
    assert s.store.get_claim(holder.id) == once  # untouched: not even its updated_at moved


def test_a_refused_eviction_frees_the_room_and_the_drain_goes_on() -> None:
    s = Scene()
    request = s.warn()
    s.cluster.add_budget(DisruptionBudget(name="infer", namespace="ml", match_labels={"app": "infer"},
                                          min_available=2))
    outcome = s.drainer.drain(request, budget=timedelta(0))
    assert outcome.status == "continued" and outcome.blocked == 2 and outcome.evicted == []
    assert all(c.pods == () for c in s.replacements())
    assert len([p for p in s.cluster.list_pods(NODE) if p.owner_kind == "ReplicaSet"]) == 2


def test_registered_claims_and_the_drained_claim_itself_are_left_alone() -> None:
    s = Scene()
    request = s.warn()
    for claim in s.replacements():
        launched = s.store.transition(claim, ClaimState.LAUNCHED, "fleet", instance_id=f"i-{claim.id[-8:]}")
        s.store.transition(launched, ClaimState.REGISTERED, "joined", node_name=f"node-{claim.id[-8:]}")
    registered = s.replacements()
    s.drainer.drain(request, budget=timedelta(seconds=60))
    assert s.replacements() == registered  # their room is their node's now, which the scheduler sees
    old = s.store.get_claim("nc-old")
    assert old is not None and old.pods == ("uid-0", "uid-1")


def started_and_listed(s: Scene, started: datetime, claim_id: str, made: datetime) -> None:
    """The node's pods started at `started`; a claim in flight made at `made` lists uid-1, with its requests."""
    for pod in s.cluster.list_pods(NODE):
        s.cluster.add_pod(pod.model_copy(update={"started_at": started}))
    s.store.create_claim(NodeClaim(
        cluster="test", id=claim_id, pool="gpu", capacity_type="spot", zones=("us-east-1a",),
        instance_types=("g5.xlarge",), price_per_hour=0.41, created_at=made, state=ClaimState.PENDING,
        pods=("uid-1",), attributes={REQUESTS_ATTRIBUTE: requests_attribute(recorded(["uid-1"], s))}))


def test_a_claim_in_flight_planned_for_a_pod_that_then_ran_on_the_doomed_node_is_not_its_replacement() -> None:
    """A burst's claim lists a pod that kube-scheduler then bound to another node, the one AWS now reclaims (it
    binds the oldest pending pod to the first node up, not to the node planned for it; that claim's room goes to
    another pod when its node comes). The claim still lists the pod, but it was made before the pod started:
    the replacement is planned afresh. The demo's interruption, seen on the emulator: the replica assigned to
    such a claim was counted as replaced, its successor found no held room and stayed pending."""
    s = Scene()
    started_and_listed(s, WARNED_AT - timedelta(minutes=1), "nc-burst", made=WARNED_AT - timedelta(minutes=3))
    s.store.assign_pods("nc-burst", ["uid-1"], timedelta(minutes=30))

    request = s.warn()

    assert "nc-burst" not in request.replacements
    fresh = [c for c in s.replacements() if c.id != "nc-burst"]
    assert sorted(u for c in fresh for u in c.pods) == ["uid-0", "uid-1"]
    assert set(s.store.assignments(["uid-0", "uid-1"]).values()) == {c.id for c in fresh}
    s.drainer.drain(request, budget=timedelta(seconds=60))
    packed = s.packer.handle(s.pending_document(), source="agent-message-2")
    assert packed.created == () and packed.placed_in_flight == 2  # both successors on the held room


def test_a_claim_made_for_a_pod_after_it_started_still_replaces_it() -> None:
    """The other side of the rule above: a claim in flight made while the pod ran (a rebalance's replacement,
    whose assignment a later notice has released) still covers it."""
    s = Scene()
    started_and_listed(s, WARNED_AT - timedelta(hours=1), "nc-earlier", made=WARNED_AT - timedelta(minutes=3))

    request = s.warn()

    assert "nc-earlier" in request.replacements
    assert s.store.assignments(["uid-1"]) == {"uid-1": "nc-earlier"}


class RacingStore(MemoryStateStore):
    """The packer reads the claims in flight; a drain frees room on them before the packer writes."""

    def __init__(self, cluster: str, clock: FixedClock) -> None:
        super().__init__(cluster, clock)
        self.meanwhile: list[object] = []

    def list_claims(self, states: Iterable[ClaimState] | None = None) -> list[NodeClaim]:
        claims = super().list_claims(states)
        while self.meanwhile:
            action = self.meanwhile.pop()
            assert callable(action)
            action()
        return claims


def test_the_packer_does_not_put_back_pods_a_drain_took_off_while_it_planned() -> None:
    s = Scene(pods=1)
    s.store = RacingStore("test", s.clock)
    s.store.create_claim(NodeClaim(
        cluster="test", id="nc-repl", pool="gpu", capacity_type="on-demand", zones=("us-east-1a",),
        instance_types=("g5.12xlarge",), price_per_hour=5.672, created_at=WARNED_AT, pods=("uid-0",),
        attributes={"requests": '{"cpu":500,"memory":2147483648,"nvidia.com/gpu":1,"pods":1}'}))
    s.packer = PackerService(s.config, s.store, make_catalog(), s.launches, clock=s.clock)
    old = next(p for p in replacement_pods(s.cluster.list_pods(NODE)))
    s.store.meanwhile.append(lambda: free_room(s.store, ["nc-repl"], [old]))
    newcomer = replacement_pods([ClusterPod(uid="uid-new", namespace="ml", name="infer-0-b", requests=REQUESTS,
                                            owner_kind="ReplicaSet", tolerations=TOLERATE)])
    document = PendingPodsDocument(schema_version=1, cluster="test", sent_at=s.clock.now(), pods=newcomer)
    packed = s.packer.handle(document, source="m")
    assert packed.placed_in_flight == 1 and packed.created == ()
    claim = s.store.get_claim("nc-repl")
    assert claim is not None and claim.pods == ("uid-new",)
    assert claim_requests(claim) == pod_requests(newcomer[0])


def state_change() -> dict[str, object]:
    return {**spot_warning(), "id": "5d2a6c1e-0000-4000-8000-000000000002",
            "detail-type": "EC2 Instance State-change Notification", "time": "2026-11-22T10:27:00Z",
            "detail": {"instance-id": INSTANCE, "state": "terminated"}}


def test_an_instance_gone_before_its_drain_ran_frees_the_room_too() -> None:
    s = Scene()
    s.warn()  # the drain request waits in its queue
    s.clock.advance(timedelta(minutes=2))
    (closed,) = s.interruption.handle(parse_notice(state_change()))
    assert closed.action == "closed" and s.cluster.get_node(NODE) is None
    assert all(c.pods == () for c in s.replacements())
    packed = s.packer.handle(s.pending_document(), source="agent-message-2")
    assert packed.created == () and packed.placed_in_flight == 2


def test_a_drain_finding_its_claim_ended_frees_the_room_of_the_pods_its_node_takes_along() -> None:
    s = Scene()
    request = s.warn()
    s.fleet.terminate(s.store.get_claim("nc-old") or pytest.fail("no claim"), "ended elsewhere")
    outcome = s.drainer.drain(request, budget=timedelta(seconds=60))
    assert outcome.status == "finished" and outcome.reason == "claim already ended"
    assert s.cluster.get_node(NODE) is None and all(c.pods == () for c in s.replacements())
    assert s.packer.handle(s.pending_document(), source="agent-message-2").created == ()


OTHER_INSTANCE = "i-0b2d4f6a8c0e13579"
OTHER_NODE = "ip-10-0-7-2.ec2.internal"


def test_a_second_warning_does_not_take_the_room_a_drain_freed_for_the_first_nodes_pods() -> None:
    # The chaos suite's warning storm: node A's drain evicted its pod and freed the room on A's replacement for
    # the pod's successor; node B's warning, handled before that successor was reported, planned B's pod onto
    # that room; A's successor then found none and waited for a claim made only after its eviction.
    s = Scene(pods=1)
    s.store.create_claim(NodeClaim(
        cluster="test", id="nc-other", pool="gpu", capacity_type="spot", zones=("us-east-1a",),
        instance_types=("g5.xlarge",), price_per_hour=0.41, created_at=WARNED_AT - timedelta(hours=2),
        state=ClaimState.REGISTERED, instance_id=OTHER_INSTANCE, instance_type="g5.xlarge", zone="us-east-1a",
        node_name=OTHER_NODE, pods=("uid-b",)))
    s.cluster.add_node(ClusterNode(name=OTHER_NODE, provider_id=f"aws:///us-east-1a/{OTHER_INSTANCE}", ready=True,
                                   allocatable=Resources.from_quantities({"cpu": "4", "nvidia.com/gpu": "4"})))
    s.cluster.add_pod(ClusterPod(uid="uid-b", namespace="ml", name="train-b", node_name=OTHER_NODE,
                                 requests=REQUESTS, owner_kind="ReplicaSet", phase="Running",
                                 labels={"app": "train"}, tolerations=TOLERATE))
    request = s.warn()
    (first,) = (c for c in s.replacements() if c.id != "nc-other")
    s.drainer.drain(request, budget=timedelta(seconds=60))  # A's pod evicted, its room on `first` freed
    held = s.store.get_claim(first.id)
    assert held is not None and held.pods == ()

    other = {**spot_warning(), "id": "5d2a6c1e-0000-4000-8000-000000000003",
             "resources": [f"arn:aws:ec2:us-east-1a:instance/{OTHER_INSTANCE}"],
             "detail": {"instance-id": OTHER_INSTANCE, "instance-action": "terminate"}}
    (outcome,) = s.interruption.handle(parse_notice(other))

    assert outcome.replacements and first.id not in outcome.replacements, "B's pod took A's successor's room"
    successors = s.pending_document()
    assert [p.name for p in successors.pods] == ["infer-0-r1"]  # the ReplicaSet's new pod for A's
    packed = s.packer.handle(successors, source="agent-message-2")
    assert packed.created == () and packed.placed_in_flight == 1  # A's successor on A's replacement

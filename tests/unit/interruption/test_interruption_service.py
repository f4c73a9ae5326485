"""The interruption service on memory adapters and the real packer: each event kind in `events/`, acted on."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.memory.cluster import MemoryCluster
from gpu_autoscaler.adapters.memory.queues import MemoryDrainQueue, MemoryLaunchQueue
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.drain import DRAIN_TAINT
from gpu_autoscaler.domain.interruption import parse_notice
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
from gpu_autoscaler.models.fleet import OwnedInstance
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Toleration
from gpu_autoscaler.services.drain import DrainService
from gpu_autoscaler.services.interruption import InterruptionService
from gpu_autoscaler.services.packer import PackerService
from tests.conftest import ROOT

if TYPE_CHECKING:
    from gpu_autoscaler.models.messages import DrainRequest
from tests.unit.drain.fakes import RecordingFleet
from tests.unit.packing.builders import make_catalog, make_config, make_pool

SPOT = "i-0f3a9c1e5b7d24680"
REBALANCE = "i-0b5d7f9a1c3e58024"
RESERVATION = "i-07c2e4a6b8d0f1357"
RETIRING = "i-0d8e2f4a6c1b3e579"
DND = {"karpenter.sh/do-not-disrupt": "true"}


def event(name: str, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "events" / f"eventbridge-{name}.json").read_text())
    data.update(overrides)
    return data


class Harness:
    def __init__(self, instance_id: str, at: datetime, *, capacity_type: str = "spot", rebalance: str = "replace",
                 pods: int = 2, do_not_disrupt: bool = False, instance_type: str = "g5.xlarge") -> None:
        self.clock = FixedClock(at)
        self.config = make_config(make_pool(disruption={"rebalance": rebalance}))
        self.store = MemoryStateStore("test", self.clock)
        self.cluster = MemoryCluster()
        self.launches = MemoryLaunchQueue()
        self.drains = MemoryDrainQueue(self.clock)
        self.fleet = RecordingFleet(self.store)
        self.packer = PackerService(self.config, self.store, make_catalog(), self.launches, clock=self.clock)
        self.service = InterruptionService(self.config, self.store, self.cluster, self.fleet, self.packer,
                                           self.drains, clock=self.clock)
        self.node = f"ip-{instance_id[-6:]}.ec2.internal"
        self.claim = NodeClaim(cluster="test", id="nc-old", pool="gpu", capacity_type=capacity_type,
                               zones=("us-east-1a",), instance_types=(instance_type,), price_per_hour=0.41,
                               created_at=at - timedelta(hours=2), state=ClaimState.REGISTERED,
                               instance_id=instance_id, instance_type=instance_type, zone="us-east-1a",
                               node_name=self.node, pods=tuple(f"uid-{i}" for i in range(pods)))
        self.store.create_claim(self.claim)
        self.cluster.add_node(ClusterNode(name=self.node, provider_id=f"aws:///us-east-1a/{instance_id}", ready=True,
                                          allocatable=Resources.from_quantities({"cpu": "4", "nvidia.com/gpu": "1"})))
        requests = Resources.from_quantities({"cpu": "500m", "memory": "2Gi", "nvidia.com/gpu": "1"})
        tolerate = (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),)
        for i in range(pods):
            self.cluster.add_pod(ClusterPod(uid=f"uid-{i}", namespace="ml", name=f"infer-{i}", node_name=self.node,
                                            requests=requests, owner_kind="ReplicaSet", phase="Running",
                                            tolerations=tolerate, annotations=DND if do_not_disrupt else {}))
        self.cluster.add_pod(ClusterPod(uid="uid-ds", namespace="kube-system", name="nvidia-device-plugin",
                                        node_name=self.node, owner_kind="DaemonSet", phase="Running"))

    def claim_now(self, claim_id: str = "nc-old") -> NodeClaim:
        claim = self.store.get_claim(claim_id)
        assert claim is not None
        return claim

    def new_claims(self) -> list[NodeClaim]:
        return [c for c in self.store.list_claims() if c.id != "nc-old"]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def test_spot_warning_cordons_replaces_without_the_offering_and_drains_involuntarily() -> None:
    h = Harness(SPOT, at("2026-11-22T10:25:00Z"))
    (outcome,) = h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert outcome.action == "replace-and-drain" and outcome.cordoned
    node = h.cluster.get_node(h.node)
    assert node is not None and node.unschedulable and DRAIN_TAINT in node.taints
    assert ("g5.xlarge", "us-east-1a", "spot") in h.store.unavailable_offerings()
    assert h.claim_now().state is ClaimState.DRAINING
    replacements = h.new_claims()
    assert sorted(u for c in replacements for u in c.pods) == ["uid-0", "uid-1"]  # never the DaemonSet pod
    assert all(c.capacity_type == "spot" or c.capacity_type == "on-demand" for c in replacements)
    ids = sorted(c.id for c in replacements)
    assert outcome.replacements == ids
    assert sorted(i for r in h.launches.sent for i in r.claim_ids) == ids
    (drain,) = h.drains.receive()
    assert drain.involuntary and drain.claim_id == "nc-old" and drain.node_name == h.node
    assert drain.deadline == at("2026-11-22T10:26:30Z") and drain.wait_until == h.clock.now()
    assert sorted(drain.replacements) == ids


def test_the_outcome_names_the_pods_a_replacement_was_planned_for_and_says_when_there_were_none() -> None:
    """The log of a notice says which pods it moved: a notice acted on after something else emptied the node (its
    pods gone) reads differently from one whose pods found no replacement."""
    h = Harness(SPOT, at("2026-11-22T10:25:00Z"))
    (outcome,) = h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert outcome.summary()["pods"] == ["ml/infer-0", "ml/infer-1"]  # never the DaemonSet pod
    empty = Harness(SPOT, at("2026-11-22T10:25:00Z"), pods=0)
    (nothing,) = empty.service.handle(parse_notice(event("spot-interruption-warning")))
    assert nothing.action == "replace-and-drain" and nothing.summary()["pods"] == [] and not nothing.replacements



def test_a_spot_warning_plans_replacements_for_the_pods_its_drain_evicts_at_once() -> None:
    """The drain function, another invocation, may evict the node's pods within the second of its request (the chaos
    suite's Spot storm saw it when the drain was sent before the planning): the pods planned are those on the node
    when the notice came."""
    h = Harness(SPOT, at("2026-11-22T10:25:00Z"))
    send = h.drains.send

    def evicting(request: DrainRequest, delay: timedelta | None = None) -> None:
        send(request, delay)
        for pod in h.cluster.list_pods(h.node):
            if pod.owner_kind != "DaemonSet":
                h.cluster.evict(pod)

    h.drains.send = evicting  # type: ignore[method-assign]
    (outcome,) = h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert {p.owner_kind for p in h.cluster.list_pods(h.node)} == {"DaemonSet"}  # the drain evicted the rest
    assert sorted(u for c in h.new_claims() for u in c.pods) == ["uid-0", "uid-1"]
    assert outcome.replacements == sorted(c.id for c in h.new_claims())


def test_a_spot_warning_drains_a_node_whose_pod_asks_for_more_than_any_node_holds() -> None:
    """A pod asking for `memory: 10E` runs (kube-scheduler reads an overflowing request as 0): it gets no
    replacement, and the node's other pods still get theirs and the drain."""
    h = Harness(SPOT, at("2026-11-22T10:25:00Z"))
    h.cluster.add_pod(ClusterPod(
        uid="uid-absurd", namespace="team-x", name="typo-0", node_name=h.node, owner_kind="ReplicaSet",
        phase="Running", requests=Resources.from_quantities({"nvidia.com/gpu": "1", "memory": "10E"}),
        tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),)))
    (outcome,) = h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert sorted(u for c in h.new_claims() for u in c.pods) == ["uid-0", "uid-1"]
    (drain,) = h.drains.receive()
    assert drain.involuntary and drain.claim_id == "nc-old" and sorted(drain.replacements) == outcome.replacements


def test_a_spot_warning_before_the_node_is_listed_asks_for_a_drain_by_instance_not_by_a_guessed_name() -> None:
    """The Node is not listed yet and the claim names none: the request says only what is known (the instance),
    not the instance id as a node name, which on EKS (node named by its private DNS name) names nothing."""
    h = Harness(SPOT, at("2026-11-22T10:25:00Z"))
    h.store.update_claim(h.claim_now(), node_name=None)
    h.cluster.delete_node(h.node)
    h.service.handle(parse_notice(event("spot-interruption-warning")))
    (drain,) = h.drains.receive()
    assert drain.node_name is None and drain.instance_id == SPOT and drain.claim_id == "nc-old"


def test_the_replacement_avoids_the_offering_spot_took_back() -> None:
    """g6.xlarge Spot in us-east-1a is the cheapest fit for these pods; after the warning it is not chosen."""
    rebalanced = Harness(SPOT, at("2026-11-22T10:20:00Z"), instance_type="g6.xlarge")
    rebalance = event("rebalance-recommendation", time="2026-11-22T10:20:00Z")
    rebalance["detail"] = {"instance-id": SPOT}
    rebalanced.service.handle(parse_notice(rebalance))
    assert {c.price_per_hour for c in rebalanced.new_claims()} == {0.40}
    h = Harness(SPOT, at("2026-11-22T10:25:00Z"), instance_type="g6.xlarge")
    h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert h.new_claims() and all(c.price_per_hour > 0.40 for c in h.new_claims())


def test_after_a_spot_warning_do_not_disrupt_pods_get_their_grace_and_the_node_goes_when_aws_takes_it() -> None:
    """do-not-disrupt pods are held, then deleted at the drain deadline minus their grace period (10:26:30 − 30 s);
    the instance is terminated at the warning's instance-action-time (10:27:00), not before."""
    h = Harness(SPOT, at("2026-11-22T10:25:00Z"), do_not_disrupt=True)
    h.service.handle(parse_notice(event("spot-interruption-warning")))
    (drain,) = h.drains.receive()
    assert drain.terminate_after == at("2026-11-22T10:27:00Z")
    drainer = DrainService("test", h.store, h.cluster, h.fleet, h.drains, clock=h.clock,
                           sleep=lambda s: h.clock.advance(timedelta(seconds=s)))
    outcomes = [drainer.drain(drain, budget=timedelta(seconds=60))]
    while (visible := h.drains.next_visible()) is not None:
        h.clock.set(max(visible, h.clock.now()))
        outcomes.extend(drainer.drain(message, budget=timedelta(seconds=60)) for message in h.drains.receive())
    assert outcomes[-1].status == "finished" and h.clock.now() == at("2026-11-22T10:27:00Z")
    deleted = sorted(k for o in outcomes for k in o.deleted)  # the device plugin's time has come too
    assert deleted == ["kube-system/nvidia-device-plugin", "ml/infer-0", "ml/infer-1"]
    assert h.cluster.calls.delete_graces == [30, 30, 30]
    assert h.claim_now().state is ClaimState.TERMINATED and h.cluster.get_node(h.node) is None
    # The replacement was asked for before the drain even started.
    assert h.launches.sent and h.fleet.terminated == [("nc-old", h.fleet.terminated[0][1])]


def test_rebalance_replaces_first_and_drains_voluntarily_after_the_replacement() -> None:
    h = Harness(REBALANCE, at("2026-11-22T10:40:00Z"))
    (outcome,) = h.service.handle(parse_notice(event("rebalance-recommendation")))
    assert outcome.action == "replace-and-drain" and not outcome.cordoned
    assert h.cluster.calls.cordoned == [] and h.claim_now().state is ClaimState.REGISTERED
    assert h.store.unavailable_offerings() == set()
    ids = sorted(c.id for c in h.new_claims())
    (drain,) = h.drains.receive()
    now = h.clock.now()
    assert ids and not drain.involuntary and sorted(drain.replacements) == ids
    assert drain.wait_until == now + timedelta(minutes=10)
    assert drain.deadline == now + timedelta(minutes=10) + h.config.timeouts.interruption_drain


def test_rebalance_is_ignored_when_the_pool_says_so() -> None:
    h = Harness(REBALANCE, at("2026-11-22T10:40:00Z"), rebalance="ignore")
    (outcome,) = h.service.handle(parse_notice(event("rebalance-recommendation")))
    assert outcome.action == "ignored" and "ignored by pool setting" in outcome.reason
    assert h.new_claims() == [] and h.drains.messages == [] and h.cluster.calls.cordoned == []


def test_rebalance_buys_no_replacement_for_a_node_a_voluntary_drain_would_leave_alone() -> None:
    """A rebalance's drain is voluntary, and a voluntary drain leaves a do-not-disrupt node or pod alone: a
    replacement launched for it would only idle until consolidation removed it."""
    h = Harness(REBALANCE, at("2026-11-22T10:40:00Z"), do_not_disrupt=True)
    (outcome,) = h.service.handle(parse_notice(event("rebalance-recommendation")))
    assert outcome.action == "ignored" and "do-not-disrupt pods ml/infer-0, ml/infer-1" in outcome.reason
    assert h.new_claims() == [] and h.drains.messages == [] and h.cluster.calls.cordoned == []
    node = h.cluster.get_node(h.node)
    assert node is not None
    h.cluster.add_node(node.model_copy(update={"annotations": DND}))
    for pod in h.cluster.list_pods(h.node):
        h.cluster.add_pod(pod.model_copy(update={"annotations": {}}))
    (outcome,) = h.service.handle(parse_notice(event("rebalance-recommendation")))
    assert outcome.action == "ignored" and f"node {h.node} is do-not-disrupt" in outcome.reason
    assert h.new_claims() == []


def test_state_change_closes_the_claim_and_releases_its_pods() -> None:
    h = Harness(SPOT, at("2026-11-22T10:27:04Z"))
    h.store.assign_pods("nc-old", ["uid-0", "uid-1"], timedelta(minutes=30))
    (outcome,) = h.service.handle(parse_notice(event("state-change")))
    assert outcome.action == "closed" and outcome.reason == "instance terminated"
    assert h.claim_now().state is ClaimState.TERMINATED and len(h.fleet.terminated) == 1
    assert h.cluster.calls.deleted_nodes == [h.node] and h.cluster.list_pods() == []
    assert h.store.assignments(["uid-0", "uid-1"]) == {}
    assert h.new_claims() == [] and h.drains.messages == []


@pytest.mark.parametrize("state", ["stopping", "stopped", "shutting-down"])
def test_every_stopped_state_closes_the_claim_and_keeps_the_node_until_the_instance_is_terminated(
        state: str) -> None:
    """The Node goes once EC2 says `terminated`, as Karpenter's termination controller waits for the instance to
    be gone: until then its containers may still be running their graceful shutdown."""
    h = Harness(SPOT, at("2026-11-22T10:27:04Z"))
    data = event("state-change")
    data["detail"] = {**data["detail"], "state": state}
    (outcome,) = h.service.handle(parse_notice(data))
    assert outcome.action == "closed" and h.claim_now().state is ClaimState.TERMINATED
    assert h.cluster.get_node(h.node) is not None and h.cluster.calls.deleted_nodes == []
    data["detail"] = {**data["detail"], "state": "terminated"}
    h.service.handle(parse_notice(data))
    assert h.cluster.calls.deleted_nodes == [h.node] and h.cluster.list_pods() == []


def test_scheduled_change_replaces_then_drains_before_the_scheduled_start() -> None:
    h = Harness(RETIRING, at("2026-11-22T10:50:00Z"), capacity_type="on-demand")
    (outcome,) = h.service.handle(parse_notice(event("health-scheduled-change")))
    # Cordoned at once, as Karpenter (CordonAndDrain) and aws-node-termination-handler do: no new pod lands on a
    # node that is retiring while its replacement boots.
    assert outcome.action == "replace-and-drain" and outcome.cordoned
    ids = sorted(c.id for c in h.new_claims())
    (drain,) = h.drains.receive()
    start = at("2026-11-26T15:00:00Z")
    assert drain.deadline < start and drain.deadline > start - timedelta(minutes=1)
    assert drain.wait_until is not None and drain.wait_until < drain.deadline
    assert ids and sorted(drain.replacements) == ids and drain.involuntary  # the instance goes at the start


def test_reservation_interruption_is_involuntary_and_immediate() -> None:
    h = Harness(RESERVATION, at("2026-11-22T11:02:00Z"), capacity_type="on-demand")
    (outcome,) = h.service.handle(parse_notice(event("capacity-reservation-interruption-warning")))
    assert outcome.cordoned and h.claim_now().state is ClaimState.DRAINING
    assert ("g5.xlarge", "us-east-1a", "on-demand") in h.store.unavailable_offerings()
    (drain,) = h.drains.receive()
    assert drain.involuntary and drain.deadline == at("2026-11-22T11:03:30Z")
    assert drain.wait_until == h.clock.now()  # two minutes leave no time to wait for the replacement


def test_an_instance_we_do_not_own_is_acknowledged_and_ignored() -> None:
    h = Harness("i-0000000000000abcd", at("2026-11-22T10:25:00Z"))
    (outcome,) = h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert outcome.action == "ignored" and outcome.claim_id is None
    assert h.cluster.calls.cordoned == [] and h.new_claims() == [] and h.drains.messages == []
    assert h.store.unavailable_offerings() == set() and h.launches.sent == []


def test_the_same_notice_twice_plans_one_replacement() -> None:
    h = Harness(SPOT, at("2026-11-22T10:25:00Z"))
    notice = parse_notice(event("spot-interruption-warning"))
    first = h.service.handle(notice)[0]
    claims = h.new_claims()
    second = h.service.handle(notice)[0]
    assert h.new_claims() == claims and first.replacements == second.replacements == sorted(c.id for c in claims)


def test_a_notice_acted_on_again_after_its_drain_took_the_pods_names_the_replacement_planned_before() -> None:
    """An attempt that sent its drain and then failed (or a redelivery racing a slow first attempt) is acted on
    again: the drain has evicted the pods by then, so the node holds none. The replacement the first attempt
    planned is still on its way; the second outcome (the log, the ReplacementClaims metric) and the drain it sends
    must name it, not report a node replaced by nothing."""
    h = Harness(SPOT, at("2026-11-22T10:25:00Z"))
    notice = parse_notice(event("spot-interruption-warning"))
    first = h.service.handle(notice)[0]
    planned = sorted(c.id for c in h.new_claims())
    assert first.replacements == planned and planned
    h.drains.receive()
    for pod in h.cluster.list_pods(h.node):
        if pod.owner_kind != "DaemonSet":
            h.cluster.delete_pod(pod)
    again = h.service.handle(notice)[0]
    assert again.replacements == planned, f"the retry reports {again.replacements}, not {planned}"
    assert again.pods == []
    (drain,) = h.drains.receive()
    assert sorted(drain.replacements) == planned
    assert h.new_claims() == [c for c in h.new_claims() if c.id in planned]  # nothing planned twice


def test_a_rebalance_then_a_spot_warning_reuses_the_replacement() -> None:
    h = Harness(SPOT, at("2026-11-22T10:20:00Z"))
    rebalance = event("rebalance-recommendation", time="2026-11-22T10:20:00Z")
    rebalance["detail"] = {"instance-id": SPOT}
    h.service.handle(parse_notice(rebalance))
    h.clock.set(at("2026-11-22T10:25:00Z"))
    planned = h.new_claims()
    (spot,) = h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert h.new_claims() == planned and spot.replacements == sorted(c.id for c in planned) and spot.cordoned


def test_a_node_with_only_daemonset_pods_needs_no_replacement() -> None:
    h = Harness(SPOT, at("2026-11-22T10:25:00Z"), pods=0)
    (outcome,) = h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert outcome.replacements == [] and h.new_claims() == []
    (drain,) = h.drains.receive()
    assert drain.replacement_claim_id is None


def test_a_notice_about_a_claim_already_ended_touches_nothing() -> None:
    h = Harness(SPOT, at("2026-11-22T10:26:00Z"))
    h.store.transition(h.claim_now(), ClaimState.TERMINATED, "drained")
    h.cluster.fail_next("list_nodes", AssertionError("the cluster must not be asked"))
    (outcome,) = h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert outcome.action == "ignored" and outcome.reason == "claim already ended" and h.fleet.terminated == []


def test_the_instance_of_a_claim_already_ended_terminated_takes_its_node_along() -> None:
    """A drain ended the claim and left the Node to its instance's end: the `terminated` event deletes it."""
    h = Harness(SPOT, at("2026-11-22T10:27:04Z"))
    h.store.transition(h.claim_now(), ClaimState.TERMINATED, "drained")
    (outcome,) = h.service.handle(parse_notice(event("state-change")))
    assert outcome.reason == "claim already ended" and h.fleet.terminated == []
    assert h.cluster.calls.deleted_nodes == [h.node]


def test_kubernetes_is_only_connected_to_when_an_instance_is_ours() -> None:
    from gpu_autoscaler.adapters.kubernetes.lazy import LazyCluster

    h = Harness(SPOT, at("2026-11-22T10:25:00Z"))
    connects: list[int] = []

    def connect() -> MemoryCluster:
        connects.append(1)
        return h.cluster

    lazy = LazyCluster(connect)
    service = InterruptionService(h.config, h.store, lazy, h.fleet, h.packer, h.drains, clock=h.clock)
    notice = parse_notice(event("spot-interruption-warning"))
    assert service.handle_instance(notice, "i-0000000000000abcd").action == "ignored"
    assert not lazy.connected and connects == []
    assert service.handle_instance(notice, SPOT).action == "replace-and-drain"
    assert lazy.connected and connects == [1]


BLOCK = "cr-0b10c4e5a7d9f1357"
BLOCK_NODE = "i-0cb1a2b3c4d5e6f70"


class Inventory:
    """What DescribeInstances says of the cluster's instances (`ports.OwnedInstances`)."""

    def __init__(self, *instances: OwnedInstance) -> None:
        self.instances = list(instances)
        self.calls = 0

    def owned_instances(self) -> list[OwnedInstance]:
        self.calls += 1
        return self.instances


def test_a_capacity_block_ending_replaces_and_drains_its_nodes_before_ec2_terminates_them() -> None:
    """The warning names the reservation; its nodes are the claims launched into it. EC2 terminates them from
    30 minutes before the block's end: the drain must be done by then."""
    h = Harness(BLOCK_NODE, at("2026-11-22T11:20:00Z"), capacity_type="reserved")
    h.store.update_claim(h.claim_now(), reservation_id=BLOCK)
    notice = parse_notice(event("capacity-block-expiration-warning"))
    (outcome,) = h.service.handle(notice)
    assert outcome.instance_id == BLOCK_NODE and outcome.action == "replace-and-drain" and outcome.cordoned
    assert h.claim_now().state is ClaimState.DRAINING
    assert h.store.unavailable_offerings() == {("g5.xlarge", "us-east-1a", BLOCK)}  # the block alone
    assert h.new_claims() and all(c.capacity_type != "reserved" for c in h.new_claims())
    (drain,) = h.drains.receive()
    assert drain.involuntary and drain.deadline == at("2026-11-22T11:29:30Z")


def test_a_capacity_block_node_is_found_through_ec2_when_its_claim_does_not_name_the_block() -> None:
    h = Harness(BLOCK_NODE, at("2026-11-22T11:20:00Z"), capacity_type="on-demand")
    inventory = Inventory(OwnedInstance(instance_id=BLOCK_NODE, state="running", capacity_reservation_id=BLOCK),
                          OwnedInstance(instance_id="i-0other", state="running", capacity_reservation_id="cr-0other"))
    service = InterruptionService(h.config, h.store, h.cluster, h.fleet, h.packer, h.drains, clock=h.clock,
                                  inventory=inventory)
    notice = parse_notice(event("capacity-block-expiration-warning"))
    (outcome,) = service.handle(notice)
    assert outcome.instance_id == BLOCK_NODE and outcome.action == "replace-and-drain" and inventory.calls == 1


def test_an_on_demand_fallback_of_a_block_claim_is_not_drained_at_the_blocks_end() -> None:
    """A claim planned on the block whose launch fell back to On-Demand, recorded before nodes recorded the
    reservation they run in (it kept the planned one): EC2 (DescribeInstances) shows it in no reservation, and an
    On-Demand node does not end with the block."""
    h = Harness(BLOCK_NODE, at("2026-11-22T11:20:00Z"), capacity_type="on-demand")
    h.store.update_claim(h.claim_now(), reservation_id=BLOCK)
    inventory = Inventory(OwnedInstance(instance_id=BLOCK_NODE, state="running", capacity_reservation_id=None))
    service = InterruptionService(h.config, h.store, h.cluster, h.fleet, h.packer, h.drains, clock=h.clock,
                                  inventory=inventory)
    assert service.handle(parse_notice(event("capacity-block-expiration-warning"))) == []
    assert h.claim_now().state is ClaimState.REGISTERED and h.drains.receive() == []


def test_a_capacity_block_without_nodes_of_ours_is_acknowledged() -> None:
    h = Harness(BLOCK_NODE, at("2026-11-22T11:20:00Z"))
    assert h.service.handle(parse_notice(event("capacity-block-expiration-warning"))) == []
    assert h.drains.receive() == []


def test_a_claim_made_draining_by_a_notice_records_the_drain_it_is_to_get_before_it_is_sent() -> None:
    """The claim goes Draining before the replacements are planned and the drain is sent; an invocation failing in
    between (five times over: dead-lettered) left it Draining with no drain anywhere. The Draining transition
    records the drain (its reason, deadline, involuntary, termination time), so the consolidate tick can send it
    (`services.reconcile`) or, past its deadline, end the claim."""
    from gpu_autoscaler.domain.drain_progress import drain_progress

    h = Harness(RETIRING, at("2026-11-22T10:50:00Z"), capacity_type="on-demand")

    def failing(*_: Any, **__: Any) -> Any:
        raise ConnectionError("the packer's store failed every time")

    h.service.packer.handle = failing  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        h.service.handle(parse_notice(event("health-scheduled-change")))
    claim = h.claim_now()
    progress = drain_progress(claim)
    assert claim.state is ClaimState.DRAINING and h.drains.receive() == []
    assert progress is not None and progress.seen_at == h.clock.now() and progress.request is not None
    start = at("2026-11-26T15:00:00Z")
    assert progress.request.involuntary and start - timedelta(minutes=1) < progress.request.deadline < start
    assert progress.request.claim_id == "nc-old" and progress.request.node_name == h.node
    assert progress.request.reason == claim.reason


@pytest.mark.parametrize("status", [401, 403])
def test_a_notice_the_kubernetes_api_refuses_access_to_fails_naming_the_fix(status: int) -> None:
    """The record fails (SQS redelivers it, then dead-letters it: the DLQ's alarm), and its error says what grants
    the access, as a refused consolidation tick or drain does; an outage's error stays as the API gave it."""
    from gpu_autoscaler.errors import KubernetesAccessRefused, KubernetesApiError

    h = Harness(SPOT, at("2026-11-22T10:26:00Z"))
    h.cluster.fail_next("list_nodes", KubernetesApiError(f"GET /api/v1/nodes: HTTP {status}", status))
    with pytest.raises(KubernetesAccessRefused) as raised:
        h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert raised.value.status == status and "gpu-autoscaler-functions" in str(raised.value)
    h.cluster.fail_next("list_nodes", KubernetesApiError("GET /api/v1/nodes: HTTP 500", 500))
    with pytest.raises(KubernetesApiError) as outage:
        h.service.handle(parse_notice(event("spot-interruption-warning")))
    assert not isinstance(outage.value, KubernetesAccessRefused)

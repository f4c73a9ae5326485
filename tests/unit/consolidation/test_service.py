"""The consolidate service on the in-memory cluster and state store: reconcile, decide, launch, then drain."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.memory.cluster import DisruptionBudget, MemoryCluster
from gpu_autoscaler.adapters.memory.disruption_budgets import MemoryDisruptionBudgets
from gpu_autoscaler.adapters.memory.queues import MemoryDrainQueue
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.domain.consolidation import EMPTY_SINCE_ATTRIBUTE, POD_SET_ATTRIBUTE, PODS_CHANGED_AT_ATTRIBUTE
from gpu_autoscaler.domain.disruption_marks import DISRUPTION_ATTRIBUTE
from gpu_autoscaler.domain.drain import DRAIN_TAINT, is_drained_by_us
from gpu_autoscaler.domain.drift import (
    IMAGE_ATTRIBUTE,
    POOL_HASH_ATTRIBUTE,
    POOL_HASH_VERSION,
    POOL_HASH_VERSION_ATTRIBUTE,
    pool_hash,
)
from gpu_autoscaler.domain.forecast import bucket_start
from gpu_autoscaler.domain.prewarm import WARM_UNTIL_ATTRIBUTE
from gpu_autoscaler.models.claims import ClaimState, StateTransition
from gpu_autoscaler.models.cluster import ClusterNode
from gpu_autoscaler.models.labels import DO_NOT_DISRUPT
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.services.consolidate import ConsolidateOutcome, ConsolidateService
from gpu_autoscaler.services.drain import DrainService
from gpu_autoscaler.services.fleet import FleetService
from gpu_autoscaler.services.reconcile import ReconcileService
from tests.unit.consolidation.builders import NOW, TAINT, Cluster, make_config, make_pool, pool_config
from tests.unit.packing.builders import make_claim

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.messages import DrainRequest, LaunchRequest


class RecordingCompute:
    """EC2 as the fleet's termination path sees it: every instance asked for is ours and goes."""

    def __init__(self) -> None:
        self.terminated: list[str] = []

    def create_fleet(self, request: Any) -> Any:
        raise AssertionError("consolidation never launches through the fleet directly")

    def terminate(self, instance_ids: Sequence[str], *, unknown_is_gone: bool = False) -> list[str]:
        self.terminated.extend(instance_ids)
        return list(instance_ids)

    def instance_states(self, instance_ids: Sequence[str]) -> dict[str, str]:
        return {i: "terminated" if i in self.terminated else "running" for i in instance_ids}


class Journal:
    """Launch and drain queues writing into one ordered journal, so a test sees which came first."""

    def __init__(self, drains: MemoryDrainQueue) -> None:
        self.entries: list[tuple[str, Any]] = []
        self.drain_queue = drains

    def send(self, request: LaunchRequest) -> None:
        self.entries.append(("launch", request))

    def send_many(self, requests: Sequence[LaunchRequest]) -> None:
        self.entries.extend(("launch", r) for r in requests)

    def drain(self, request: DrainRequest, delay: timedelta | None = None) -> None:
        self.entries.append(("drain", request))
        self.drain_queue.send(request, delay)


class _Drains:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def send(self, request: DrainRequest, delay: timedelta | None = None) -> None:
        self.journal.drain(request, delay)


class Rig:
    def __init__(self, cluster: Cluster) -> None:
        self.scene = cluster
        self.config = cluster.config
        self.clock = cluster.clock
        self.kube = MemoryCluster(cluster.nodes, cluster.pods, recreate_evicted=True)
        self.store = MemoryStateStore(self.config.cluster_name, self.clock)
        for claim in cluster.claims.values():
            self.store.create_claim(claim)
        self.compute = RecordingCompute()
        self.fleet = FleetService(self.config, self.store, self.compute, clock=self.clock)
        self.journal = Journal(MemoryDrainQueue(self.clock))
        solver = cluster.solver()
        self.service = ConsolidateService(
            self.config, self.store, self.kube, self.journal, _Drains(self.journal),
            ReconcileService(self.config, self.store, self.kube, self.fleet, clock=self.clock,
                             drains=_Drains(self.journal)),
            solver=lambda: solver, clock=self.clock, budgets=MemoryDisruptionBudgets(self.kube),
        )

    def stored(self, claim_id: str) -> NodeClaim:
        """A claim the test knows the store holds (get_claim answers None for one it does not)."""
        claim = self.store.get_claim(claim_id)
        assert claim is not None, f"no claim {claim_id} in the store"
        return claim

    def claim(self, node: str) -> NodeClaim:
        """The claim of the scene's node."""
        return self.stored(self.scene.claims[node].id)

    def decide(self) -> ConsolidateOutcome:
        """Two ticks a minute apart, as the schedule fires them: the first proposes, the second validates and
        carries out; the second's outcome."""
        self.service.run()
        self.clock.advance(timedelta(minutes=1))
        return self.service.run()

    def sent(self, kind: str) -> list[Any]:
        return [request for what, request in self.journal.entries if what == kind]


def test_a_replacement_is_launched_and_ready_before_its_node_is_drained() -> None:
    scene = Cluster(pool_config())
    big = scene.node("g5.48xlarge")
    scene.pod(big, gpus=4, cpu="16", memory="64Gi")
    rig = Rig(scene)
    outcome = rig.decide()
    decided = rig.clock.now()
    [decision] = outcome.acted
    [replacement] = decision.replacements
    assert [what for what, _ in rig.journal.entries] == ["launch", "drain"]
    assert rig.sent("launch")[0].claim_ids == [replacement.id]
    [drain] = rig.sent("drain")
    assert (drain.node_name, drain.claim_id, drain.involuntary) == (big, rig.scene.claims[big].id, False)
    assert drain.replacements == [replacement.id]
    assert drain.deadline == decided + rig.config.timeouts.consolidation_drain
    assert drain.wait_until == decided + rig.config.timeouts.registration_ttl
    assert rig.stored(replacement.id).state is ClaimState.PENDING
    assert DISRUPTION_ATTRIBUTE in rig.claim(big).attributes

    # The drain waits while the replacement is on its way, and evicts once its node is initialized.
    drainer = DrainService(rig.config.cluster_name, rig.store, rig.kube, rig.fleet, rig.journal.drain_queue,
                           clock=rig.clock, sleep=lambda s: rig.clock.advance(timedelta(seconds=s)))
    waited = drainer.drain(drain)
    assert waited.status == "continued" and waited.evicted == [] and not rig.kube.calls.cordoned
    stored = rig.stored(replacement.id)
    stored = rig.store.transition(stored, ClaimState.LAUNCHED, "launched", instance_id="i-0replacement",
                                  instance_type=replacement.instance_types[0], zone=replacement.zones[0])
    provider_id = f"aws:///{replacement.zones[0]}/i-0replacement"
    rig.kube.add_node(ClusterNode(name="ip-10-9-9-9.ec2.internal", ready=True, taints=(TAINT,),
                                  provider_id=provider_id, created_at=rig.clock.now(),
                                  allocatable=Resources.from_quantities({"nvidia.com/gpu": "4"})))
    rig.service.run()  # reconcile registers it
    assert rig.stored(replacement.id).state is ClaimState.REGISTERED
    rig.clock.advance(timedelta(seconds=30))
    original, again = rig.journal.drain_queue.receive()  # consolidation's request, and the drain's continuation
    assert (original, again.attempt) == (drain, 1)
    finished = drainer.drain(again, budget=timedelta(minutes=5))
    assert finished.evicted and finished.status == "finished"
    assert rig.claim(big).state is ClaimState.TERMINATED


def test_each_tick_counts_the_gpu_pods_the_agent_must_have_been_reporting_for_minutes() -> None:
    """The server side's witness of the agent (it lists the pods anyway): unbound, unschedulable GPU pods older than
    `AGENT_REPORTS_WITHIN`, which the agent reports at once and again each resync window. An alarm weighs the count
    against what reached the pending-pods queue, so an agent gone silent is not taken for a quiet cluster."""
    scene = Cluster(pool_config())
    old = scene.clock.now() - timedelta(minutes=10)
    scene.pod(None, created_at=old, unschedulable=True)  # counted
    scene.pod(None, created_at=old, unschedulable=True, owner_kind="DaemonSet")
    scene.pod(None, created_at=old, unschedulable=False)  # gated, or not tried yet
    scene.pod(None, gpus=0, created_at=old, unschedulable=True)  # no GPU asked
    scene.pod(None, created_at=scene.clock.now() - timedelta(minutes=1), unschedulable=True)  # reported just now
    scene.pod(None, created_at=old, unschedulable=True, deletion_timestamp=scene.clock.now())
    scene.pod(None, created_at=old, unschedulable=True, phase="Failed")
    assert Rig(scene).service.run().gpu_pods_unschedulable == 1


def test_a_running_pod_asking_for_more_than_any_node_holds_stops_neither_the_tick_nor_the_other_nodes() -> None:
    """kube-scheduler reads an int64-overflowing request as 0 (apimachinery `Quantity.Value`), so a pod asking for
    `memory: 10E` is bound and runs: its node stays (no node could take the pod), the others are consolidated."""
    scene = Cluster(pool_config())
    big = scene.node("g5.48xlarge")
    scene.pod(big, gpus=4, cpu="16", memory="64Gi")
    absurd = scene.node("g5.48xlarge")
    scene.pod(absurd, gpus=1, cpu="1", memory="10E")
    [decision] = Rig(scene).decide().acted
    assert decision.nodes == (big,)


def test_a_node_being_consolidated_is_not_decided_on_again() -> None:
    scene = Cluster(pool_config())
    big = scene.node("g5.48xlarge")
    scene.pod(big, gpus=4, cpu="16", memory="64Gi")
    rig = Rig(scene)
    assert len(rig.decide().acted) == 1
    second = rig.service.run()
    assert second.acted == []
    assert second.result.skipped[big].startswith("disrupting")
    assert len(rig.sent("drain")) == 1


def test_an_empty_node_is_removed_once_empty_for_consolidate_after() -> None:
    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    empty = scene.node(empty_for=None)
    rig = Rig(scene)
    first = rig.service.run()
    assert first.acted == []
    assert rig.claim(empty).attributes[EMPTY_SINCE_ATTRIBUTE] == NOW.isoformat()
    rig.clock.advance(timedelta(minutes=6))
    [decision] = rig.decide().acted
    assert decision.reason == "Empty"
    [drain] = rig.sent("drain")
    assert drain.replacements == [] and rig.sent("launch") == []


def test_an_empty_replacement_is_kept_while_the_pods_it_replaces_are_still_on_their_draining_node() -> None:
    """A rebalance's replacement, Ready and empty while a PodDisruptionBudget holds the drain of the node it
    replaces (cordoned, its claim Draining): the pods still running there are assigned to it, so it is not
    removed as Empty. Karpenter's scheduling simulation for a disruption counts the pods of deleting nodes
    (`SimulateScheduling`, pkg/controllers/disruption/helpers.go): removing a node they need is invalid."""
    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    doomed = scene.node(state=ClaimState.DRAINING)
    leaving = scene.pod(doomed, gpus=4, cpu="16", memory="64Gi")
    replacement = scene.node(empty_for=timedelta(hours=1))
    rig = Rig(scene)
    rig.store.assign_pods(rig.claim(replacement).id, [leaving.uid], timedelta(minutes=30))
    rig.service.run()
    rig.clock.advance(timedelta(minutes=6))

    outcome = rig.decide()

    assert outcome.acted == []
    assert outcome.result.skipped[replacement] == "incoming: 1 pods are on their way to it"


def test_a_node_that_gets_pods_again_loses_its_empty_mark() -> None:
    scene = Cluster(pool_config())
    node = scene.node(empty_for=None)
    rig = Rig(scene)
    rig.service.run()
    assert EMPTY_SINCE_ATTRIBUTE in rig.claim(node).attributes
    rig.kube.add_pod(rig.scene.pod(node, gpus=4, cpu="40", memory="150Gi"))
    rig.service.run()
    assert EMPTY_SINCE_ATTRIBUTE not in rig.claim(node).attributes


def test_the_last_pod_event_is_kept_on_the_claim_and_consolidate_after_counts_from_it() -> None:
    """First tick: the latest start of its pods; a pod bound since: the tick that sees it. Unchanged pods keep
    the mark, and the node is consolidated only `consolidateAfter` after it (Karpenter's lastPodEventTime)."""
    scene = Cluster(pool_config(consolidateAfter="5m"))
    big = scene.node("g5.48xlarge", empty_for=None)
    scene.pod(big, gpus=4, cpu="16", memory="64Gi", started_at=NOW - timedelta(minutes=2))
    rig = Rig(scene)
    first = rig.service.run()
    assert first.result.decisions == () and first.result.skipped[big].startswith("too young")
    assert rig.claim(big).attributes[PODS_CHANGED_AT_ATTRIBUTE] == (NOW - timedelta(minutes=2)).isoformat()
    seen = rig.claim(big).attributes[POD_SET_ATTRIBUTE]
    rig.clock.advance(timedelta(minutes=2))
    rig.kube.add_pod(rig.scene.pod(big, gpus=1))
    rig.service.run()
    assert rig.claim(big).attributes[PODS_CHANGED_AT_ATTRIBUTE] == (NOW + timedelta(minutes=2)).isoformat()
    assert rig.claim(big).attributes[POD_SET_ATTRIBUTE] != seen
    rig.clock.advance(timedelta(minutes=4))  # 8 minutes after the first pod's start, 4 after the second's
    fourth = rig.service.run()
    assert fourth.result.decisions == () and fourth.result.skipped[big].startswith("too young")
    assert rig.claim(big).attributes[PODS_CHANGED_AT_ATTRIBUTE] == (NOW + timedelta(minutes=2)).isoformat()
    rig.clock.advance(timedelta(minutes=1))
    assert [d.nodes for d in rig.service.run().result.decisions] == [(big,)]


def test_do_not_disrupt_and_disruption_budgets_protect_nodes_through_the_service() -> None:
    scene = Cluster(pool_config())
    guarded = scene.node("g5.48xlarge")
    scene.pod(guarded, annotations={DO_NOT_DISRUPT: "true"})
    budgeted = scene.node("g5.48xlarge")
    scene.pod(budgeted, labels={"app": "db"})
    rig = Rig(scene)
    rig.kube.add_budget(DisruptionBudget("db", "team", {"app": "db"}, min_available=1))
    outcome = rig.service.run()
    assert outcome.acted == []
    assert outcome.result.skipped[guarded].startswith("do-not-disrupt")
    assert outcome.result.skipped[budgeted].startswith("pdb")
    rig.kube.remove_budget("team", "db")
    assert [d.nodes for d in rig.decide().acted] == [(budgeted,)]


def test_an_empty_node_whose_daemonset_or_mirror_pod_is_do_not_disrupt_is_not_removed() -> None:
    """Karpenter: "we will allow Mirror Pods and DaemonSets to block disruption using this annotation"
    (`StateNode.ValidatePodsDisruptable`): they move nowhere, yet keep the node."""
    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    daemon = scene.node()
    scene.pod(daemon, gpus=0, owner_kind="DaemonSet", annotations={DO_NOT_DISRUPT: "true"})
    static = scene.node()
    scene.pod(static, gpus=0, owner_kind="Node", mirror=True, annotations={DO_NOT_DISRUPT: "true"})
    plain = scene.node()
    scene.pod(plain, gpus=0, owner_kind="DaemonSet")
    rig = Rig(scene)
    rig.service.run()
    rig.clock.advance(timedelta(minutes=6))
    outcome = rig.decide()
    assert [d.nodes for d in outcome.acted] == [(plain,)]
    assert outcome.result.skipped[daemon].startswith("do-not-disrupt: pod team/")
    assert outcome.result.skipped[static].startswith("do-not-disrupt: pod team/")


def test_warm_capacity_survives_while_its_window_is_open_and_not_after() -> None:
    scene = Cluster(pool_config())
    until = NOW + timedelta(minutes=30)
    warm = scene.node(warm="window:peak", attributes={WARM_UNTIL_ATTRIBUTE: until.isoformat()})
    rig = Rig(scene)
    assert rig.service.run().acted == []
    rig.clock.set(until + timedelta(minutes=6))
    assert [d.nodes for d in rig.decide().acted] == [(warm,)]


# Reconcile


def launched(scene: Cluster, node: str, at: Any) -> None:
    claim = scene.claims[node]
    scene.claims[node] = claim.model_copy(update={
        "state": ClaimState.LAUNCHED, "node_name": None, "attributes": {},
        "history": (StateTransition(state=ClaimState.LAUNCHED, at=at, reason="launched"),),
    })


def test_reconcile_registers_launched_claims_whose_node_joined() -> None:
    scene = Cluster(pool_config())
    node = scene.node("g6.xlarge", capacity_type="spot")
    launched(scene, node, NOW - timedelta(minutes=3))
    rig = Rig(scene)
    outcome = rig.service.run()
    assert outcome.reconcile.registered == [scene.claims[node].id]
    claim = rig.claim(node)
    assert (claim.state, claim.node_name) == (ClaimState.REGISTERED, node)
    assert claim.attributes[POOL_HASH_ATTRIBUTE] == pool_hash(rig.config.pool("gpu"), rig.config.overhead)
    assert claim.attributes[IMAGE_ATTRIBUTE] == rig.config.ami.x86_64


def test_registration_keeps_the_image_recorded_at_launch_else_stamps_the_pools_own() -> None:
    """The image a node was launched from is the fleet's record; a claim launched before it recorded one gets its
    pool's image (its own where it sets one, as the fleet launches it), never the global one for such a pool."""
    pool_ami = {"family": "AL2023", "version": "v20261120", "x86_64": "ami-0aaaaaaaaaaaaaaa1"}
    scene = Cluster(make_config(make_pool(ami=pool_ami, disruption={"budgets": [{"nodes": "100%"}]})))
    recorded = scene.node("g6.xlarge", capacity_type="spot")
    unrecorded = scene.node("g6.xlarge", capacity_type="spot")
    launched(scene, recorded, NOW - timedelta(minutes=3))
    launched(scene, unrecorded, NOW - timedelta(minutes=3))
    scene.claims[recorded] = scene.claims[recorded].model_copy(
        update={"attributes": {IMAGE_ATTRIBUTE: "ami-0ddddddddddddddd4"}})
    rig = Rig(scene)
    rig.service.run()
    assert rig.claim(recorded).attributes[IMAGE_ATTRIBUTE] == "ami-0ddddddddddddddd4"
    assert rig.claim(unrecorded).attributes[IMAGE_ATTRIBUTE] == "ami-0aaaaaaaaaaaaaaa1"
    assert rig.claim(unrecorded).attributes[POOL_HASH_VERSION_ATTRIBUTE] == POOL_HASH_VERSION


def test_claims_whose_node_never_joined_are_ended_and_their_pods_released() -> None:
    scene = Cluster(pool_config())
    late = scene.node("g6.xlarge", capacity_type="spot")
    fresh = scene.node("g6.xlarge", capacity_type="spot")
    launched(scene, late, NOW - timedelta(minutes=16))
    launched(scene, fresh, NOW - timedelta(minutes=5))
    never = scene.node("g6.xlarge", capacity_type="spot", state=ClaimState.PENDING, instance_id=None,
                       created_at=NOW - timedelta(minutes=20))
    waiting = scene.pod(None)
    scene.nodes = [n for n in scene.nodes if n.name not in (late, fresh, never)]  # none of them joined
    rig = Rig(scene)
    rig.store.assign_pods(scene.claims[late].id, [waiting.uid], timedelta(minutes=30))
    outcome = rig.service.run()
    assert sorted(outcome.reconcile.timed_out) == sorted([scene.claims[late].id, scene.claims[never].id])
    assert rig.claim(late).state is ClaimState.TERMINATED
    assert rig.claim(never).state is ClaimState.TERMINATED
    assert rig.claim(fresh).state is ClaimState.LAUNCHED
    assert rig.compute.terminated == [scene.claims[late].instance_id]
    assert rig.store.assignments([waiting.uid]) == {}


def test_an_instance_whose_node_an_operator_deleted_is_ended_once_its_node_stays_gone() -> None:
    """`kubectl delete node` (Karpenter's documented manual removal): no finalizer of ours holds the Node, it goes
    at once with its pods, and the kubelet does not register it again (kubernetes#71398), while the instance runs
    and is paid for. A Registered claim whose Node has been missing for `NODE_MISSING_GRACE` is ended through the
    fleet; within it, nothing happens (a kubelet registering its Node again, kubernetes#123535)."""
    from gpu_autoscaler.services.reconcile import NODE_MISSING_GRACE

    scene = Cluster(pool_config())
    node = scene.node("g6.xlarge")
    scene.node("g6.xlarge")  # another node stays: the list is not empty
    rig = Rig(scene)
    claim = rig.claim(node)
    rig.kube.delete_node(node)
    rig.service.run()
    rig.clock.advance(NODE_MISSING_GRACE - timedelta(seconds=1))
    rig.service.run()
    assert rig.claim(node).state is ClaimState.REGISTERED and rig.compute.terminated == []
    rig.clock.advance(timedelta(seconds=1))
    outcome = rig.service.run()
    ended = rig.claim(node)
    assert ended.state is ClaimState.TERMINATED and rig.compute.terminated == [claim.instance_id]
    assert outcome.reconcile.node_missing == [claim.id] and "deleted" in ended.reason


def test_a_node_back_within_the_grace_keeps_its_claim_and_an_empty_node_list_counts_none_missing() -> None:
    """A Node registered again (or one the list failed to show) is not a missing one; a list of no Node at all (the
    agent's own node is always there) is not believed."""
    from gpu_autoscaler.services.reconcile import NODE_MISSING_ATTRIBUTE, NODE_MISSING_GRACE

    scene = Cluster(pool_config())
    node = scene.node("g6.xlarge")
    other = scene.node("g6.xlarge")
    rig = Rig(scene)
    kept = rig.kube.get_node(node)
    assert kept is not None
    rig.kube.delete_node(node)
    rig.service.run()
    assert NODE_MISSING_ATTRIBUTE in rig.claim(node).attributes
    rig.clock.advance(NODE_MISSING_GRACE / 2)
    rig.kube.add_node(kept)  # registered again
    rig.service.run()
    assert NODE_MISSING_ATTRIBUTE not in rig.claim(node).attributes
    rig.kube.delete_node(node)
    rig.kube.delete_node(other)
    for _ in range(3):  # a list of nothing: not believed
        rig.clock.advance(NODE_MISSING_GRACE)
        rig.service.run()
    assert rig.claim(node).state is ClaimState.REGISTERED and rig.compute.terminated == []


def test_reconcile_records_pending_and_running_gpus_per_pool() -> None:
    scene = Cluster(pool_config())
    busy = scene.node("g5.48xlarge")
    scene.pods_on(busy, 3, gpus=2)
    scene.pod(busy, gpus=0)
    coming = scene.node("g5.12xlarge", capacity_type="spot")
    launched(scene, coming, NOW)
    scene.nodes = [n for n in scene.nodes if n.name != coming]
    pending = scene.pod(None, gpus=4)
    stray = scene.pod(None, gpus=8)  # covered by no claim: the packer records it, not reconcile
    rig = Rig(scene)
    rig.store.assign_pods(scene.claims[coming].id, [pending.uid], timedelta(minutes=30))
    outcome = rig.service.run()
    assert outcome.reconcile.demand == {"gpu": 10.0}
    assert rig.store.demand_history("gpu", NOW - timedelta(hours=1)) == [(bucket_start(NOW), 10.0)]
    assert stray.uid not in rig.store.assignments([stray.uid])


class _DyingDrains(_Drains):
    """The drain queue of a tick that dies as it sends: the mark is written, the drain never queued."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(journal)
        self.dead = True

    def send(self, request: DrainRequest, delay: timedelta | None = None) -> None:
        if self.dead:
            self.dead = False
            raise ConnectionError("the function died before its drain was queued")
        super().send(request, delay)


def test_a_tick_that_died_between_its_mark_and_its_drain_is_completed_by_the_next() -> None:
    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    empty = scene.node(empty_for=None)
    rig = Rig(scene)
    rig.service.drains = dying = _DyingDrains(rig.journal)
    rig.service.run()
    rig.clock.advance(timedelta(minutes=6))
    rig.service.run()  # proposes
    rig.clock.advance(timedelta(minutes=1))
    with pytest.raises(ConnectionError):
        rig.service.run()  # validates, marks, dies sending the drain
    assert not dying.dead and rig.sent("drain") == []
    rig.clock.advance(timedelta(minutes=1))
    rig.service.run()
    [drain] = rig.sent("drain")
    assert drain.node_name == empty and "sent again" in drain.reason and not drain.involuntary
    rig.clock.advance(timedelta(minutes=1))
    rig.service.run()
    assert len(rig.sent("drain")) == 1, "noted as sent: not sent a third time"


def test_a_tick_while_the_kubernetes_api_is_down_is_skipped_with_its_reason_and_the_next_one_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A rate schedule's next tick is its retry: a tick that cannot see the cluster ends normally, saying why,
    rather than failing into the scheduler's dead-letter queue once a minute for as long as the API is down."""
    from gpu_autoscaler.errors import KubernetesApiError

    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    scene.node(empty_for=None)
    rig = Rig(scene)
    rig.kube.fail_next("list_pods", KubernetesApiError("list: HTTP 503 the server is currently unable", 503))
    with caplog.at_level("WARNING", logger="gpu_autoscaler.services.consolidate"):
        skipped = rig.service.run()
    assert skipped.api_failure is not None and "HTTP 503" in skipped.api_failure
    assert skipped.summary()["apiFailure"] == skipped.api_failure
    assert not skipped.proposed and not skipped.acted
    assert any("Kubernetes API" in r.getMessage() for r in caplog.records)
    rig.service.run()
    rig.clock.advance(timedelta(minutes=6))
    assert rig.decide().acted, "the API is back: the next ticks consolidate the empty node"


@pytest.mark.parametrize(("status", "reason", "message"), [
    (401, "Unauthorized", "Unauthorized"),
    (403, "Forbidden", 'nodes is forbidden: User "arn:aws:sts::123456789012:assumed-role/consolidate/x" cannot '
                       'list resource "nodes" in API group "" at the cluster scope'),
])
def test_a_tick_the_kubernetes_api_refuses_access_fails_naming_the_fix(
    status: int, reason: str, message: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """401 (no access entry for the role, or a token it cannot verify) and 403 (no RBAC for it) answer every
    request, every minute, until someone grants the access: unlike an outage they never pass, so the tick fails
    (the function's Errors alarm) and says what to do, rather than ending normally while reconcile, consolidation
    and garbage collection never run."""
    from gpu_autoscaler.adapters.kubernetes.rest import KubernetesHttpError
    from gpu_autoscaler.errors import KubernetesApiError

    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    scene.node(empty_for=None)
    rig = Rig(scene)
    refused = KubernetesHttpError("GET", "/api/v1/nodes", status, reason,
                                  {"kind": "Status", "code": status, "reason": reason, "message": message})
    rig.kube.fail_next("list_nodes", refused)
    with caplog.at_level("ERROR", logger="gpu_autoscaler.services.consolidate"), \
            pytest.raises(KubernetesApiError) as raised:
        rig.service.run()
    assert raised.value.status == status and f"HTTP {status}" in str(raised.value)
    assert "gpu-autoscaler-functions" in str(raised.value) and "agent/deploy/functions-rbac.yaml" in str(raised.value)
    assert [r.levelname for r in caplog.records] == ["ERROR"]


@pytest.mark.parametrize("error", [
    ("list: HTTP 429 too many requests", 429), ("list: HTTP 500 etcdserver: request timed out", 500),
    ("Kubernetes API unreachable: GET /api/v1/pods: read timed out", None),
])
def test_an_outage_of_any_kind_ends_the_tick_normally(error: tuple[str, int | None]) -> None:
    """Throttling (429), the server's own failure (5xx) and a timeout pass: the next tick is the retry."""
    from gpu_autoscaler.errors import KubernetesApiError

    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    scene.node(empty_for=None)
    rig = Rig(scene)
    rig.kube.fail_next("list_pods", KubernetesApiError(*error))
    assert rig.service.run().api_failure == error[0]


def _drained_by_us(rig: Rig, name: str) -> bool:
    return is_drained_by_us(next(n for n in rig.kube.list_nodes() if n.name == name))


def test_a_rejected_proposal_leaves_the_taint_of_a_drain_that_took_the_node_over() -> None:
    """A Spot warning for a node consolidation proposed: the interruption function cordons it with the same taint
    and its claim goes Draining, so validation rejects the proposal; the taint is the drain's now and stays, as
    `_untaint_lapsed` leaves the taint of any claim no longer Registered."""
    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    empty = scene.node(empty_for=None)
    rig = Rig(scene)
    rig.service.run()
    rig.clock.advance(timedelta(minutes=6))
    assert [d.nodes for d in rig.service.run().proposed] == [(empty,)]
    rig.kube.cordon(empty, DRAIN_TAINT)
    rig.store.transition(rig.claim(empty), ClaimState.DRAINING, "spot interruption warning")
    rig.clock.advance(timedelta(minutes=1))
    rejected = rig.service.run()
    assert [r.nodes for r in rejected.rejected] == [(empty,)] and rejected.untainted == []
    assert _drained_by_us(rig, empty)


def test_a_lapsed_marks_taint_stays_on_a_node_a_drain_cordoned_after_the_tick_listed_it() -> None:
    """The tick decides from nodes listed seconds earlier; a drain (a rebalance's, once its
    replacement is ready) that cordons meanwhile owns the taint, and taking it off would leave the node cordoned
    for good (its next pass reads an unschedulable node without our taint as a drain not started). The untaint
    leaves the taint on a node cordoned on its own fresh read, as Karpenter leaves a node the termination
    controller owns (statenode.go `RequireNoScheduleTaint`). Before: the taint came off."""
    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    node = scene.node(empty_for=None)
    rig = Rig(scene)
    rig.kube.taint(node, DRAIN_TAINT)  # a proposal's taint whose mark is gone
    listed = rig.kube.list_nodes

    def cordoned_after_the_list() -> list[ClusterNode]:
        nodes = listed()
        rig.kube.cordon(node, DRAIN_TAINT)
        return nodes

    rig.kube.list_nodes = cordoned_after_the_list  # type: ignore[method-assign]
    outcome = rig.service.run()
    rig.kube.list_nodes = listed  # type: ignore[method-assign]
    assert outcome.untainted == [] and _drained_by_us(rig, node)
    rig.kube.update_node(node, unschedulable=False)  # the drain done or undone by hand: the mark's taint goes
    assert rig.service.run().untainted == [node]


def test_a_decision_dropped_as_a_drain_takes_its_node_over_leaves_that_drains_taint() -> None:
    """The same race a moment later: the claim goes Draining after the validating tick read it, so its mark is
    refused and the decision dropped; the claim is read again before any taint comes off."""
    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    empty = scene.node(empty_for=None)
    rig = Rig(scene)
    rig.service.run()
    rig.clock.advance(timedelta(minutes=6))
    assert [d.nodes for d in rig.service.run().proposed] == [(empty,)]
    mark = rig.service._mark

    def warned_first(*args: Any, **kwargs: Any) -> Any:
        rig.kube.cordon(empty, DRAIN_TAINT)
        rig.store.transition(rig.claim(empty), ClaimState.DRAINING, "spot interruption warning")
        return mark(*args, **kwargs)

    rig.service._mark = warned_first  # type: ignore[method-assign]
    rig.clock.advance(timedelta(minutes=1))
    dropped = rig.service.run()
    assert dropped.acted == [] and len(dropped.dropped) == 1 and dropped.untainted == []
    assert _drained_by_us(rig, empty) and rig.sent("drain") == []


def test_a_node_gone_between_the_list_and_its_proposal_drops_that_decision_alone() -> None:
    """A Spot node reclaimed and its Node deleted while the tick computes; its taint's read answers
    404 (`NodeNotFound`). Karpenter ignores a NotFound candidate (statenode.go `RequireNoScheduleTaint`,
    `client.IgnoreNotFound`): its decision is dropped and its mark undone, the tick goes on with the others.
    Before: NodeNotFound escaped `run` (a Lambda error, the tick's other proposals and actions lost)."""
    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    gone, kept = scene.node(empty_for=None), scene.node(empty_for=None)
    rig = Rig(scene)
    rig.service.run()
    rig.clock.advance(timedelta(minutes=6))
    listed = rig.kube.list_nodes

    def reclaimed_after_the_list() -> list[ClusterNode]:
        nodes = listed()
        rig.kube.delete_node(gone)
        return nodes

    rig.kube.list_nodes = reclaimed_after_the_list  # type: ignore[method-assign]
    outcome = rig.service.run()
    assert [d.nodes for d in outcome.proposed] == [(kept,)]
    assert [text for text in outcome.dropped if gone in text] == [f"{gone}: node {gone} is gone"]
    assert DISRUPTION_ATTRIBUTE not in rig.claim(gone).attributes
    assert DISRUPTION_ATTRIBUTE in rig.claim(kept).attributes


def _draining(scene: Cluster, *, deadline: timedelta, involuntary: bool, seen: timedelta | None) -> str:
    """A node cordoned for a drain, its claim Draining for a minute; a drain last seen working on it `seen` ago
    (None: never stamped, as a claim made Draining before drains stamped their progress)."""
    from gpu_autoscaler.domain.drain_progress import progress_attributes
    from gpu_autoscaler.models.messages import DrainRequest

    doomed = scene.node(state=ClaimState.DRAINING, history=(
        StateTransition(state=ClaimState.REGISTERED, at=NOW - timedelta(hours=2)),
        StateTransition(state=ClaimState.DRAINING, at=NOW - timedelta(minutes=1), reason="drain: scheduled change"),
    ))
    claim = scene.claims[doomed]
    if seen is not None:
        request = DrainRequest(cluster=scene.config.cluster_name, node_name=doomed, instance_id=claim.instance_id,
                               claim_id=claim.id, reason="scheduled change", involuntary=involuntary,
                               deadline=NOW + deadline, attempt=7, backoff=4, cordoned_at=NOW - timedelta(minutes=1))
        scene.claims[doomed] = claim.model_copy(update={"attributes": progress_attributes(
            claim.attributes, request, NOW - seen)})
    scene.update_node(doomed, DRAIN_TAINT, unschedulable=True)
    scene.pod(doomed, gpus=1)
    return doomed


def test_a_draining_claim_whose_drain_stopped_is_sent_its_drain_again() -> None:
    """A drain lives in its SQS messages: one dead-lettered after five deliveries (or never sent: the interruption
    function failing after it marked the claim Draining) left the node cordoned and paid for, and a slot of its
    pool's disruption budget taken, for good. Karpenter reconciles a deleting Node until it is gone
    (pkg/controllers/node/termination/controller.go); here the consolidate tick sends the drain again, as the claim
    records it, once no drain has stamped the claim for `DRAIN_STALLED_AFTER`: never while a drain is alive."""
    from gpu_autoscaler.domain.drain_progress import drain_progress
    from gpu_autoscaler.services.reconcile import DRAIN_STALLED_AFTER

    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    doomed = _draining(scene, deadline=timedelta(days=1), involuntary=True, seen=timedelta(minutes=1))
    rig = Rig(scene)
    rig.clock.advance(DRAIN_STALLED_AFTER - timedelta(minutes=2))
    rig.service.run()
    assert rig.sent("drain") == []
    rig.clock.advance(timedelta(minutes=2))
    rig.service.run()
    [drain] = rig.sent("drain")
    assert drain.node_name == doomed and drain.claim_id == rig.claim(doomed).id and drain.involuntary
    assert drain.reason == "scheduled change" and drain.deadline == NOW + timedelta(days=1)
    assert drain.backoff == 0 and drain.cordoned_at == NOW - timedelta(minutes=1)
    progress = drain_progress(rig.claim(doomed))
    assert progress is not None and progress.seen_at == rig.clock.now()  # sent: not again next minute
    rig.clock.advance(timedelta(minutes=1))
    rig.service.run()
    assert len(rig.sent("drain")) == 1
    rig.clock.advance(DRAIN_STALLED_AFTER)  # that one was lost too
    rig.service.run()
    assert len(rig.sent("drain")) == 2 and rig.claim(doomed).state is ClaimState.DRAINING


def test_a_draining_claim_never_stamped_is_sent_a_voluntary_drain_once_stalled_since_it_began_draining() -> None:
    """A claim made Draining before drains stamped their progress: its drain is counted from its Draining
    transition, and sent again as a voluntary drain (nothing forced) with that transition's reason."""
    from gpu_autoscaler.services.reconcile import DRAIN_STALLED_AFTER

    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    doomed = _draining(scene, deadline=timedelta(0), involuntary=False, seen=None)
    rig = Rig(scene)
    rig.clock.advance(DRAIN_STALLED_AFTER)
    rig.service.run()
    [drain] = rig.sent("drain")
    assert drain.node_name == doomed and not drain.involuntary and drain.reason == "drain: scheduled change"
    assert drain.instance_id == rig.claim(doomed).instance_id and rig.compute.terminated == []


def test_a_stalled_drain_past_its_termination_time_ends_the_claim_through_the_fleet() -> None:
    """Past the time the node was to go (an involuntary drain's deadline), no drain is sent again: the claim is
    ended as the drain would have ended it, instance terminated, claim Terminated, pods released."""
    from gpu_autoscaler.services.reconcile import DRAIN_STALLED_AFTER

    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    doomed = _draining(scene, deadline=timedelta(minutes=10), involuntary=True, seen=timedelta(0))
    rig = Rig(scene)
    rig.clock.advance(DRAIN_STALLED_AFTER)
    rig.service.run()
    claim = rig.claim(doomed)
    assert rig.sent("drain") == [] and claim.state is ClaimState.TERMINATED
    assert rig.compute.terminated == [claim.instance_id] and "stalled" in claim.reason


def test_a_replacement_another_planner_leaves_no_room_for_within_the_pool_limit_drops_its_decision() -> None:
    """The decision's replacement was planned within the pool's limits against the claims the tick read; the
    packer may store claims meanwhile. Once stored, the replacement is checked again against every other live
    claim (`Solver.beyond_limits`, as the packer and prewarm do): past the limit, the replacements are ended before
    launch and the decision dropped, marks and taints off, its node left running. Before: launched, the pool held
    16 GPUs under a 12-GPU limit."""
    config = make_config(make_pool(limits={"gpus": 12},
                                   disruption={"budgets": [{"nodes": "100%"}], "underutilizedBelow": None}))
    scene = Cluster(config)
    big = scene.node("g5.48xlarge")
    scene.pod(big, gpus=4, cpu="16", memory="64Gi")
    rig = Rig(scene)
    rig.service.run()  # proposes
    rig.clock.advance(timedelta(minutes=1))
    original = rig.store.create_claim
    raced: list[bool] = []

    def racing(claim: NodeClaim) -> None:
        if not raced:  # the packer stores a 4-GPU claim just before the replacement is stored
            raced.append(True)
            original(make_claim(instance_types=("g5.12xlarge",), created_at=rig.clock.now()))
        original(claim)

    rig.store.create_claim = racing  # type: ignore[method-assign]
    outcome = rig.service.run()
    assert raced and outcome.acted == [] and rig.sent("launch") == [] and rig.sent("drain") == []
    assert any("limits" in text for text in outcome.dropped)
    assert DISRUPTION_ATTRIBUTE not in rig.claim(big).attributes
    node = rig.kube.get_node(big)
    assert node is not None and DRAIN_TAINT not in node.taints
    ended = [c for c in rig.store.list_claims([ClaimState.TERMINATED]) if c.id != rig.claim(big).id]
    assert len(ended) == 1 and "limits" in ended[0].reason


def test_the_tick_stamps_again_a_node_stamped_under_an_older_hash_version() -> None:
    """The reconcile step of each tick re-stamps (`domain.drift.restamp`) a registered claim whose stamp still
    matches what its version covered, so what the current version adds is compared from then on."""
    config = make_config(make_pool(disruption={"budgets": [{"nodes": "100%"}], "underutilizedBelow": None}),
                         overhead={"kubeReserved": {"memory": "2Gi"}})
    scene = Cluster(config)
    node = scene.node("g5.12xlarge")
    scene.pod(node, gpus=4, cpu="16", memory="64Gi")
    pool = config.pool("gpu")
    version_2 = pool_hash(pool, config.overhead.model_copy(update={"kube_reserved": {}}))  # what v2 covered
    scene.claims[node] = scene.claims[node].model_copy(update={"attributes": {
        **scene.claims[node].attributes, POOL_HASH_ATTRIBUTE: version_2, POOL_HASH_VERSION_ATTRIBUTE: "2"}})
    rig = Rig(scene)
    rig.service.run()
    stamped = rig.claim(node).attributes
    assert (stamped[POOL_HASH_ATTRIBUTE], stamped[POOL_HASH_VERSION_ATTRIBUTE]) == (
        pool_hash(pool, config.overhead), POOL_HASH_VERSION)

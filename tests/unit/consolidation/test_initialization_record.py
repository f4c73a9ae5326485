"""Reconcile latches each claim's initialization (Karpenter's: Ready, no ephemeral taint, every resource it was made
for allocatable) once, when first seen; a node still not initialized past its registration allowance is given up."""

from __future__ import annotations

from datetime import timedelta

from gpu_autoscaler.adapters.memory.cluster import MemoryCluster
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.domain.initialization import INITIALIZED_ATTRIBUTE, initialized_at
from gpu_autoscaler.models.claims import ClaimState, NodeClaim, StateTransition
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint
from gpu_autoscaler.services.reconcile import ReconcileService

from .builders import NOW, Cluster, pool_config

GPU = Resources.from_quantities({"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"})
NO_GPU = Resources.from_quantities({"cpu": "4", "memory": "16Gi"})
UNINITIALIZED = Taint(key="node.cloudprovider.kubernetes.io/uninitialized", value="true", effect="NoSchedule")


class Fleet:
    def __init__(self, store: MemoryStateStore) -> None:
        self.store = store
        self.ended: list[tuple[str, str]] = []

    def terminate(self, claim: NodeClaim, reason: str) -> NodeClaim:
        self.ended.append((claim.id, reason))
        return self.store.transition(claim, ClaimState.TERMINATED, reason)

    def instance_gone(self, claim: NodeClaim) -> bool:
        return any(ended == claim.id for ended, _ in self.ended)


class Rig:
    def __init__(self, launched_ago: timedelta, *, allocatable: Resources = NO_GPU,
                 taints: tuple[Taint, ...] = (UNINITIALIZED,), running_pod: bool = False,
                 requests: str = '{"nvidia.com/gpu":1}') -> None:
        scene = Cluster(pool_config())
        self.node = scene.node("g6.xlarge")
        claim = scene.claims[self.node]
        self.claim_id = claim.id
        scene.claims[self.node] = claim.model_copy(update={
            "state": ClaimState.LAUNCHED, "node_name": None,
            "attributes": {"requests": requests},
            "history": (StateTransition(state=ClaimState.LAUNCHED, at=NOW - launched_ago, reason="launched"),),
        })
        if running_pod:
            scene.pod(self.node)
        self.clock = scene.clock
        self.kube = MemoryCluster(scene.nodes, scene.pods)
        self.kube.update_node(self.node, ready_since=NOW, allocatable=allocatable, taints=taints)
        self.store = MemoryStateStore(scene.config.cluster_name, self.clock)
        for stored in scene.claims.values():
            self.store.create_claim(stored)
        self.config = scene.config
        self.fleet = Fleet(self.store)
        self.service = ReconcileService(scene.config, self.store, self.kube, fleet=self.fleet, clock=self.clock)

    def claim(self) -> NodeClaim:
        claim = self.store.get_claim(self.claim_id)
        assert claim is not None
        return claim


def test_a_node_initialized_as_it_registers_is_recorded_then() -> None:
    rig = Rig(timedelta(minutes=3), allocatable=GPU, taints=())
    outcome = rig.service.run()
    assert outcome.registered == outcome.initialized == [rig.claim_id]
    assert initialized_at(rig.claim()) == NOW
    assert rig.claim().attributes[INITIALIZED_ATTRIBUTE] == NOW.isoformat()


def test_initialization_is_recorded_when_the_taint_is_gone_and_the_gpus_allocatable_and_only_once() -> None:
    rig = Rig(timedelta(minutes=3))
    assert rig.service.run().registered == [rig.claim_id]
    assert rig.claim().state is ClaimState.REGISTERED and initialized_at(rig.claim()) is None
    rig.clock.advance(timedelta(minutes=1))
    rig.kube.update_node(rig.node, taints=())  # the cloud controller manager initialized it: no GPUs yet
    assert rig.service.run().initialized == []
    rig.clock.advance(timedelta(minutes=1))
    rig.kube.update_node(rig.node, allocatable=GPU)  # the device plugin registered them
    assert rig.service.run().initialized == [rig.claim_id]
    assert initialized_at(rig.claim()) == NOW + timedelta(minutes=2)
    rig.clock.advance(timedelta(minutes=1))
    assert rig.service.run().initialized == []
    assert initialized_at(rig.claim()) == NOW + timedelta(minutes=2)


EFA_REQUESTS = '{"nvidia.com/gpu":1,"vpc.amazonaws.com/efa":1,"hugepages-2Mi":5368709120}'
HUGE_PAGES = GPU + Resources.from_quantities({"hugepages-2Mi": "10560Mi"})


def test_a_node_made_for_efa_pods_is_initialized_once_the_efa_device_plugin_advertises_them() -> None:
    """Its GPUs and huge pages (the kubelet's, from its first status) come first; its EFAs with the EFA device
    plugin. Its boot time (launch → GPUs) is recorded then too, not before: it stands for initialization in claims
    from before initializedAt was."""
    rig = Rig(timedelta(minutes=3), allocatable=HUGE_PAGES, taints=(), requests=EFA_REQUESTS)
    assert rig.service.run().initialized == [] and initialized_at(rig.claim()) is None
    rig.clock.advance(timedelta(minutes=1))
    assert rig.service.run().initialized == [] and initialized_at(rig.claim()) is None
    rig.kube.update_node(rig.node, allocatable=HUGE_PAGES + Resources({"vpc.amazonaws.com/efa": 1}))
    assert rig.service.run().initialized == [rig.claim_id]
    assert initialized_at(rig.claim()) == NOW + timedelta(minutes=1)


def test_a_node_whose_efas_never_come_is_given_up_though_its_gpus_did() -> None:
    """The EFA device plugin never runs there (not installed, or its tolerations keep it off): the node never
    takes the pods it was made for, so it is given up after registrationTtl like any node never initialized."""
    rig = Rig(timedelta(minutes=3), allocatable=HUGE_PAGES, taints=(), requests=EFA_REQUESTS)
    rig.service.run()
    rig.clock.advance(rig.config.timeouts.registration_ttl)
    assert rig.service.run().timed_out == [rig.claim_id]
    [(_, reason)] = rig.fleet.ended
    assert "vpc.amazonaws.com/efa is not allocatable yet" in reason


def test_a_node_not_initialized_within_the_registration_ttl_of_its_registration_is_given_up() -> None:
    """Counted from the Node's registration, not the launch: registrationTtl is Karpenter's allowance from launch to
    registration, and a slow GPU node (a p5's boot, the GPU Operator's chain) may take minutes more after it to its
    GPUs; counted from the launch, such a node would be terminated and bought again, over and over."""
    rig = Rig(timedelta(minutes=3))
    rig.service.run()  # registers now, three minutes after its launch
    ttl = rig.config.timeouts.registration_ttl
    rig.clock.advance(ttl - timedelta(seconds=1))
    assert rig.service.run().timed_out == [] and rig.fleet.ended == []
    rig.clock.advance(timedelta(seconds=1))
    assert rig.service.run().timed_out == [rig.claim_id]
    [(claim_id, reason)] = rig.fleet.ended
    assert claim_id == rig.claim_id and reason.startswith("registration timeout: node ")
    assert "uninitialized" in reason and rig.claim().state is ClaimState.TERMINATED


def test_a_node_that_runs_pods_or_was_initialized_before_is_not_given_up() -> None:
    busy = Rig(timedelta(hours=2), running_pod=True)
    busy.service.run()
    assert busy.fleet.ended == [] and busy.claim().state is ClaimState.REGISTERED
    # NotReady now, its GPUs allocatable: initialized before the time was recorded (an earlier version's claim).
    earlier = Rig(timedelta(hours=2), allocatable=GPU, taints=())
    earlier.kube.update_node(earlier.node, ready=False, ready_since=None)
    earlier.service.run()
    assert earlier.fleet.ended == [] and initialized_at(earlier.claim()) is None


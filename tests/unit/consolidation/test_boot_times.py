"""Reconcile records each claim's boot once: launch → Node Ready (its condition's lastTransitionTime) → GPUs
allocatable (the first tick that sees them), into the state store with the measured-lead-time TTL."""

from __future__ import annotations

from datetime import timedelta

from gpu_autoscaler.adapters.memory.cluster import MemoryCluster
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.domain.boot_times import BOOT_ATTRIBUTE
from gpu_autoscaler.models.claims import ClaimState, StateTransition
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.services.reconcile import ReconcileService

from .builders import NOW, Cluster, pool_config

GPU = Resources.from_quantities({"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"})
NO_GPU = Resources.from_quantities({"cpu": "4", "memory": "16Gi"})


class Rig:
    def __init__(self, launched_ago: timedelta, ready_ago: timedelta, allocatable: Resources) -> None:
        scene = Cluster(pool_config())
        self.node = scene.node("g6.xlarge", capacity_type="spot")
        claim = scene.claims[self.node]
        self.claim_id = claim.id
        scene.claims[self.node] = claim.model_copy(update={
            "state": ClaimState.LAUNCHED, "node_name": None, "attributes": {},
            "history": (StateTransition(state=ClaimState.LAUNCHED, at=NOW - launched_ago, reason="launched"),),
        })
        self.clock = scene.clock
        self.kube = MemoryCluster(scene.nodes, [])
        self.kube.update_node(self.node, ready_since=NOW - ready_ago, allocatable=allocatable)
        self.store = MemoryStateStore(scene.config.cluster_name, self.clock)
        for stored in scene.claims.values():
            self.store.create_claim(stored)
        self.config = scene.config
        self.service = ReconcileService(scene.config, self.store, self.kube, fleet=None,  # type: ignore[arg-type]
                                        clock=self.clock)

    def samples(self) -> list[tuple[float, float]]:
        found = self.store.boot_times("gpu", NOW - timedelta(days=1))
        return [(s.to_ready.total_seconds(), s.to_gpus.total_seconds()) for s in found]


def test_a_node_ready_with_its_gpus_is_recorded_as_it_registers() -> None:
    rig = Rig(launched_ago=timedelta(minutes=4), ready_ago=timedelta(minutes=1), allocatable=GPU)
    outcome = rig.service.run()
    assert outcome.registered == [rig.claim_id]
    assert rig.samples() == [(180.0, 240.0)]
    [boot] = outcome.boots
    assert (boot.instance_type, boot.capacity_type, boot.zone) == ("g6.xlarge", "spot", "us-east-1a")
    claim = rig.store.get_claim(rig.claim_id)
    assert claim is not None
    assert claim.state is ClaimState.REGISTERED and claim.attributes[BOOT_ATTRIBUTE] == "240"
    assert outcome.summary()["boots"] == [{"claim": rig.claim_id, "instanceType": "g6.xlarge",
                                           "readySeconds": 180.0, "gpusSeconds": 240.0}]


def test_gpus_that_come_later_are_recorded_when_first_seen_and_only_once() -> None:
    rig = Rig(launched_ago=timedelta(minutes=4), ready_ago=timedelta(minutes=1), allocatable=NO_GPU)
    assert rig.service.run().registered == [rig.claim_id]
    assert rig.samples() == []
    rig.clock.advance(timedelta(minutes=1))
    assert rig.service.run().boots == []  # still no device plugin
    rig.kube.update_node(rig.node, allocatable=GPU)
    rig.clock.advance(timedelta(minutes=1))
    assert [b.claim_id for b in rig.service.run().boots] == [rig.claim_id]
    assert rig.samples() == [(180.0, 360.0)]
    rig.clock.advance(timedelta(minutes=1))
    assert rig.service.run().boots == []
    assert rig.samples() == [(180.0, 360.0)]


def test_a_claim_whose_mark_a_concurrent_write_lost_keeps_its_first_sample() -> None:
    rig = Rig(launched_ago=timedelta(minutes=4), ready_ago=timedelta(minutes=1), allocatable=GPU)
    rig.service.run()
    claim = rig.store.get_claim(rig.claim_id)
    assert claim is not None
    rig.store.update_claim(claim, attributes={})  # another function's update from a copy read before the mark
    rig.clock.advance(timedelta(minutes=1))
    rig.service.run()
    assert rig.samples() == [(180.0, 240.0)]


def test_a_node_not_ready_yet_or_booted_long_ago_gives_no_sample() -> None:
    rig = Rig(launched_ago=timedelta(minutes=2), ready_ago=timedelta(0), allocatable=GPU)
    rig.kube.update_node(rig.node, ready=False, ready_since=None)
    rig.service.run()
    assert rig.samples() == []
    old = Rig(launched_ago=timedelta(hours=3), ready_ago=timedelta(hours=2), allocatable=GPU)
    old.service.run()
    assert old.samples() == []  # a claim from before boot times were recorded: its GPUs' time is unknown


def test_samples_expire_after_the_measured_lead_time_history() -> None:
    rig = Rig(launched_ago=timedelta(minutes=4), ready_ago=timedelta(minutes=1), allocatable=GPU)
    rig.service.run()
    rig.clock.advance(rig.config.measured_lead_time.history + timedelta(seconds=1))
    assert rig.store.boot_times("gpu", NOW - timedelta(days=30)) == []


def test_the_kubernetes_adapter_reads_when_the_node_became_ready() -> None:
    from gpu_autoscaler.adapters.kubernetes.cluster import node_from_json

    conditions = [{"type": "MemoryPressure", "status": "False", "lastTransitionTime": "2026-11-22T09:50:00Z"},
                  {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-22T09:57:30Z"}]
    node = node_from_json({"metadata": {"name": "n1"}, "status": {"conditions": conditions}})
    assert node.ready and node.ready_since == NOW - timedelta(minutes=2, seconds=30)
    conditions[1]["status"] = "False"
    not_ready = node_from_json({"metadata": {"name": "n1"}, "status": {"conditions": conditions}})
    assert not not_ready.ready and not_ready.ready_since is None

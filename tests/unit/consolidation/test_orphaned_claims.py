"""Claims in flight none of whose pods waits for them any more: found (`domain.orphaned_claims`), their room given
back by the reconcile step, and taken by the next pending pod instead of a new node."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gpu_autoscaler.adapters.memory.cluster import MemoryCluster
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.orphaned_claims import LIST_MARGIN, orphaned_claims
from gpu_autoscaler.domain.packing.results import REQUESTS_ATTRIBUTE, claim_requests
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
from gpu_autoscaler.models.pods import PendingPod, PendingPodsDocument
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.services.packer import PackerService
from gpu_autoscaler.services.reconcile import ReconcileService
from tests.unit.packing.builders import NOW, make_catalog, make_claim, make_config, make_pod, make_pool
from tests.unit.packing.fakes import RecordingLaunchQueue

MADE = NOW - timedelta(minutes=3)
"""When the claim in flight was made."""


def pod(uid: str, node: str | None = None, started: Any = None) -> ClusterPod:
    return ClusterPod(uid=uid, namespace="test", name=uid, node_name=node, phase="Running" if node else "Pending",
                      requests=Resources.from_quantities({"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"}),
                      started_at=started)


def claim(*pods: str, **fields: Any) -> NodeClaim:
    values: dict[str, Any] = {"state": ClaimState.LAUNCHED, "created_at": MADE, "pods": pods,
                              "instance_id": "i-0000000000000beef"}
    return make_claim(**{**values, **fields})


def orphaned(claims: list[NodeClaim], pods: list[ClusterPod], joined: dict[str, str] | None = None) -> list[str]:
    return [c.id for c in orphaned_claims(claims, pods, NOW, joined or {})]


def test_a_claim_whose_pod_started_on_another_node_since_it_was_made_is_orphaned() -> None:
    made_for = claim("a")
    assert orphaned([made_for], [pod("a", "ip-old", started=MADE + timedelta(seconds=90))]) == [made_for.id]


def test_a_claim_keeps_its_pods_while_any_of_them_still_waits_for_it() -> None:
    both = claim("a", "b")
    pods = [pod("a", "ip-old", started=MADE + timedelta(seconds=90)), pod("b")]
    assert orphaned([both], pods) == []
    # b already on the claim's own node (joined, not yet marked Registered): it is where it was meant to go
    pods[1] = pod("b", "ip-own", started=NOW)
    assert orphaned([both], pods, {"i-0000000000000beef": "ip-own"}) == []


def test_a_replacement_for_pods_still_running_on_a_doomed_node_keeps_them() -> None:
    """Consolidation's and the interruption function's replacements list pods running on the node they replace:
    those started before the replacement claim was made, and wait for it."""
    replacement = claim("a", "b")
    pods = [pod("a", "ip-doomed", started=MADE - timedelta(hours=5)), pod("b", "ip-doomed", started=None)]
    assert orphaned([replacement], pods) == []


def test_a_pod_missing_from_the_list_is_gone_only_if_its_claim_was_written_before_the_list_margin() -> None:
    """A pod created after the list and planned at once — on a new claim, or added to an older one in flight — is
    missing from the list but not gone."""
    old = claim("gone", updated_at=MADE + timedelta(seconds=2))
    young = claim("new", created_at=NOW - LIST_MARGIN + timedelta(seconds=1))
    added_to = claim("gone", "new", updated_at=NOW - timedelta(seconds=1))
    assert orphaned([old, young, added_to], []) == [old.id]


def test_registered_warm_and_gang_claims_and_claims_without_pods_are_left_alone() -> None:
    started = [pod("a", "ip-old", started=NOW)]
    left = [claim("a", state=ClaimState.REGISTERED), claim("a", warm="forecast"), claim("a", gang="test/train"),
            claim()]
    assert orphaned(left, started) == []
    assert orphaned([claim("a", state=ClaimState.PENDING, instance_id=None)], started) != []


class Cluster:
    """A node up and full, a pending pod `a`, the packer and the reconcile step on the in-memory store."""

    def __init__(self) -> None:
        self.clock = FixedClock(MADE)
        self.config = make_config(make_pool())
        self.store = MemoryStateStore("test", self.clock)
        self.kube = MemoryCluster([ClusterNode(name="ip-old", provider_id="aws:///us-east-1a/i-0000000000000001",
                                               ready=True)], [])
        self.launches = RecordingLaunchQueue()
        self.packer = PackerService(self.config, self.store, make_catalog(), self.launches, clock=self.clock)
        self.reconcile = ReconcileService(self.config, self.store, self.kube, fleet=None,  # type: ignore[arg-type]
                                          clock=self.clock)

    def pack(self, pending: PendingPod, source: str) -> tuple[str, ...]:
        document = PendingPodsDocument(schema_version=1, cluster="test", sent_at=self.clock.now(), pods=[pending])
        return self.packer.handle(document, source=source).created

    def launch(self, claim_id: str) -> None:
        stored = self.store.get_claim(claim_id)
        assert stored is not None
        self.store.transition(stored, ClaimState.LAUNCHED, "launched", instance_id="i-0000000000000002",
                              instance_type="g5.xlarge", zone="us-east-1a")


def test_the_next_pod_takes_the_room_of_a_claim_whose_pod_started_elsewhere_instead_of_a_new_node() -> None:
    """Pod a waits; its claim launches; a pod on a node already up ends and kube-scheduler binds a there 90 s later.
    The reconcile step gives the claim's room back, so pod b, pending a minute later, is placed on that claim —
    one node booting for b, not a second one while the first boots empty."""
    rig = Cluster()
    a, b = make_pod(uid="a"), make_pod(uid="b")
    [made] = rig.pack(a, "m-1")
    rig.launch(made)
    rig.clock.set(MADE + timedelta(seconds=90))
    rig.kube.add_pod(pod("a", "ip-old", started=rig.clock.now()))
    rig.clock.set(MADE + timedelta(minutes=2))
    outcome = rig.reconcile.run()
    assert outcome.freed == [made]
    freed = rig.store.get_claim(made)
    assert freed is not None and freed.pods == () and not claim_requests(freed)
    assert freed.attributes[REQUESTS_ATTRIBUTE] == "{}" and rig.store.assignments(["a"]) == {}
    assert outcome.summary()["freed"] == [made]
    rig.clock.set(MADE + timedelta(minutes=3))
    rig.kube.add_pod(pod("b"))
    assert rig.pack(b, "m-2") == ()
    placed = rig.store.get_claim(made)
    assert placed is not None and placed.pods == ("b",) and rig.store.assignments(["b"]) == {"b": made}
    # a second tick finds it waited for again: nothing given back
    assert rig.reconcile.run().freed == []


def test_a_claim_whose_pod_still_waits_keeps_its_room() -> None:
    rig = Cluster()
    [made] = rig.pack(make_pod(uid="a"), "m-1")
    rig.launch(made)
    rig.kube.add_pod(pod("a"))
    rig.clock.set(MADE + timedelta(minutes=2))
    assert rig.reconcile.run().freed == []
    assert len(rig.pack(make_pod(uid="b"), "m-2")) == 1


def test_giving_back_alone_frees_the_room_and_records_nothing_else() -> None:
    """The step the simulator runs on the minutes between registrations: the room freed, no registration made."""
    rig = Cluster()
    [made] = rig.pack(make_pod(uid="a"), "m-1")
    rig.launch(made)
    rig.kube.add_pod(pod("a", "ip-old", started=MADE + timedelta(seconds=90)))
    rig.clock.set(MADE + timedelta(minutes=2))
    assert rig.reconcile.give_back(rig.kube.list_nodes(), rig.kube.list_pods()) == [made]
    freed = rig.store.get_claim(made)
    assert freed is not None and freed.state is ClaimState.LAUNCHED and freed.pods == ()

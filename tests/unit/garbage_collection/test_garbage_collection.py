"""The garbage collector: owned instances without a live claim terminated after the grace, claims whose instance
is gone closed; nothing younger than the grace touched (EC2's eventual consistency, launches being recorded)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.adapters.memory.cluster import MemoryCluster
from gpu_autoscaler.adapters.memory.compute import MemoryCompute, MemoryInstance
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.config import parse_config
from gpu_autoscaler.domain.garbage_collection import collect
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.fleet import OwnedInstance
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER
from gpu_autoscaler.services.fleet import FleetService
from gpu_autoscaler.services.garbage_collection import GarbageCollector
from tests.conftest import example_config_data
from tests.unit.drain.builders import NOW, make_claim, make_node

if TYPE_CHECKING:
    from collections.abc import Iterable

GRACE = timedelta(minutes=5)


def owned(instance_id: str, age: timedelta, state: str = "running", claim: str | None = None) -> OwnedInstance:
    return OwnedInstance(instance_id=instance_id, state=state, launched_at=NOW - age, claim_id=claim)


def test_an_old_instance_without_a_live_claim_is_a_leak_and_a_young_one_is_not_yet() -> None:
    claims = [make_claim(id="c-1", instance_id="i-live"),
              make_claim(id="c-2", instance_id="i-closed", state=ClaimState.TERMINATED),
              make_claim(id="c-3", instance_id=None, state=ClaimState.PENDING)]
    instances = [owned("i-live", timedelta(hours=1)), owned("i-closed", timedelta(hours=1)),
                 owned("i-young", timedelta(seconds=30)), owned("i-launching", timedelta(hours=1), claim="c-3"),
                 owned("i-ending", timedelta(hours=1), state="shutting-down")]
    decision = collect(instances, claims, NOW, GRACE)
    assert [i.instance_id for i in decision.leaked] == ["i-closed"]
    assert decision.gone == []


def test_a_claim_whose_instance_is_gone_is_closed_after_the_grace() -> None:
    launched = make_claim(id="c-new", instance_id="i-new", state=ClaimState.LAUNCHED, created_at=NOW)
    claims = [make_claim(id="c-1", instance_id="i-vanished"),
              make_claim(id="c-2", instance_id="i-terminated"),
              launched]  # no Launched step in its history: created now, not shown by EC2 yet
    instances = [owned("i-terminated", timedelta(hours=1), state="terminated")]
    decision = collect(instances, claims, NOW, GRACE)
    assert sorted(c.id for c in decision.gone) == ["c-1", "c-2"]


def test_the_collector_terminates_leaks_and_closes_claims_through_the_fleet() -> None:
    config = parse_config(example_config_data())
    clock = FixedClock(NOW)
    store = MemoryStateStore("ml-prod", clock)
    compute = MemoryCompute("ml-prod", clock)
    tags = {TAG_CLUSTER: "ml-prod"}
    compute.instances["i-leak"] = MemoryInstance("i-leak", "g6.xlarge", "us-east-1a", "spot",
                                                 {**tags, TAG_CLAIM: "c-old"}, launched_at=NOW - timedelta(hours=2))
    compute.instances["i-mine"] = MemoryInstance("i-mine", "g6.xlarge", "us-east-1a", "spot", dict(tags),
                                                 launched_at=NOW - timedelta(hours=2))
    foreign = compute.add_foreign("g6.xlarge", "us-east-1a")
    store.create_claim(make_claim(id="c-old", instance_id="i-leak", state=ClaimState.TERMINATED))
    store.create_claim(make_claim(id="c-mine", instance_id="i-mine"))
    store.create_claim(make_claim(id="c-lost", instance_id="i-lost", pods=("pod-a",), node_name="node-lost"))
    store.assign_pods("c-lost", ["pod-a"], timedelta(minutes=30))
    cluster = MemoryCluster([make_node("node-leak", "i-leak"), make_node("node-lost", "i-lost"),
                             make_node("node-mine", "i-mine")])
    fleet = FleetService(config, store, compute, clock=clock)
    collector = GarbageCollector(config, store, compute, compute, fleet, cluster, clock=clock)

    outcome = collector.run(cluster.list_nodes())
    assert outcome.terminated == ["i-leak"] and outcome.closed == ["c-lost"]
    assert compute.instances["i-leak"].state == "terminated"
    assert compute.instances["i-mine"].state == "running" and compute.instances[foreign].state == "running"
    lost = store.get_claim("c-lost")
    assert lost is not None and lost.state is ClaimState.TERMINATED and "gone" in lost.reason
    assert store.assignments(["pod-a"]) == {}
    # node-lost's instance EC2 no longer knows: gone. node-leak's was running when listed: it stays until EC2
    # shows it terminated (the next tick).
    assert sorted(n.name for n in cluster.list_nodes()) == ["node-leak", "node-mine"]
    assert collector.run(cluster.list_nodes()).summary() == {"terminatedInstances": [], "closedClaims": [],
                                                              "ownershipLost": []}
    assert sorted(n.name for n in cluster.list_nodes()) == ["node-mine"]
    # c-lost's instance was launched hours ago: EC2 not knowing it means gone, not yet visible (no waiting).
    assert compute.terminations == [["i-leak"], ["i-lost"]] and compute.unknown_is_gone == [False, True]


def test_an_instance_of_a_request_for_several_claims_is_spared_while_its_claims_are_pending() -> None:
    """Issue 19, scenario 1 at 200 pods: a request for ten claims is one CreateFleet; each instance gets its claim's
    tag only afterwards (CreateTags, throttled, or the invocation dying before it). Untagged past the grace, the
    instances were terminated as leaks although their claims were still Pending and a replay of the same request
    (same ClientToken) hands EC2's answer back: the claims were then recorded Launched on terminated instances.
    The request's token, tagged at launch and recorded on each claim as its attempt, says whose they are."""
    from gpu_autoscaler.domain.fleet import Attempt

    token = "gpu-autoscaler-0123456789abcdef0123456789abcdef01234567-1"
    attempt = Attempt(1, "spot", (("g6.xlarge", "us-east-1a"),)).to_json(token)
    claims = [make_claim(id=f"c-{n}", instance_id=None, state=ClaimState.PENDING,
                         attributes={"launchAttempt": attempt}) for n in (1, 2)]
    instances = [OwnedInstance(instance_id=f"i-{n}", state="running", launched_at=NOW - timedelta(hours=1),
                               launch_token=token) for n in (1, 2)]
    stray = OwnedInstance(instance_id="i-3", state="running", launched_at=NOW - timedelta(hours=1),
                          launch_token=token[:-1] + "2")
    decision = collect([*instances, stray], claims, NOW, GRACE)
    assert [i.instance_id for i in decision.leaked] == ["i-3"]
    closed = [c.model_copy(update={"state": ClaimState.TERMINATED}) for c in claims]
    assert [i.instance_id for i in collect(instances, closed, NOW, GRACE).leaked] == ["i-1", "i-2"]


def test_the_collector_reads_only_the_claims_that_have_not_ended() -> None:
    """It runs on every consolidation tick, and ended claims are kept 30 days: reading them all each minute (the
    state table's `ENDED#` items) would cost more read capacity each day the cluster runs, for claims the
    decision ignores (an instance whose claim ended is a leak either way)."""
    asked: list[set[ClaimState] | None] = []

    class Recording(MemoryStateStore):
        def list_claims(self, states: Iterable[ClaimState] | None = None) -> list[NodeClaim]:
            asked.append(set(states) if states is not None else None)
            return super().list_claims(states)

    config = parse_config(example_config_data())
    clock = FixedClock(NOW)
    store = Recording("ml-prod", clock)
    compute = MemoryCompute("ml-prod", clock)
    store.create_claim(make_claim(id="c-old", instance_id="i-old", state=ClaimState.TERMINATED))
    compute.instances["i-old"] = MemoryInstance("i-old", "g6.xlarge", "us-east-1a", "spot",
                                                {TAG_CLUSTER: "ml-prod", TAG_CLAIM: "c-old"},
                                                launched_at=NOW - timedelta(hours=2))
    collector = GarbageCollector(config, store, compute, compute, FleetService(config, store, compute, clock=clock),
                                 MemoryCluster([]), clock=clock)
    assert collector.run([]).terminated == ["i-old"]  # its claim ended: a leak, found without reading that claim
    assert asked and all(a is not None and ClaimState.TERMINATED not in a for a in asked)


def test_a_node_stays_while_its_instance_shuts_down_and_goes_once_ec2_shows_it_terminated() -> None:
    """Whoever terminated the instance (a drain, the interruption function, this collector), its Node goes once
    EC2 shows it `terminated`, as Karpenter's termination controller waits for the instance to be gone; this
    collector, every minute, deletes it if the path that terminated it did not see that."""
    config = parse_config(example_config_data())
    clock = FixedClock(NOW)
    store = MemoryStateStore("ml-prod", clock)
    compute = MemoryCompute("ml-prod", clock)
    tags = {TAG_CLUSTER: "ml-prod"}
    for instance_id, state in (("i-ending", "shutting-down"), ("i-ended", "terminated"), ("i-mine", "running")):
        compute.instances[instance_id] = MemoryInstance(instance_id, "g6.xlarge", "us-east-1a", "spot", dict(tags),
                                                        state=state, launched_at=NOW - timedelta(hours=2))
    store.create_claim(make_claim(id="c-ending", instance_id="i-ending", node_name="node-ending"))
    store.create_claim(make_claim(id="c-ended", instance_id="i-ended", state=ClaimState.TERMINATED))
    store.create_claim(make_claim(id="c-mine", instance_id="i-mine"))
    cluster = MemoryCluster([make_node("node-ending", "i-ending"), make_node("node-ended", "i-ended"),
                             make_node("node-mine", "i-mine")])
    collector = GarbageCollector(config, store, compute, compute, FleetService(config, store, compute, clock=clock),
                                 cluster, clock=clock)
    outcome = collector.run(cluster.list_nodes())
    assert outcome.closed == ["c-ending"]
    assert sorted(n.name for n in cluster.list_nodes()) == ["node-ending", "node-mine"]
    compute.instances["i-ending"].state = "terminated"
    collector.run(cluster.list_nodes())
    assert sorted(n.name for n in cluster.list_nodes()) == ["node-mine"]


@pytest.mark.parametrize("state", ["stopping", "stopped"])
def test_a_claim_whose_instance_stopped_is_closed_as_its_state_change_would_have(state: str) -> None:
    """A stopped instance runs nothing: its kubelet is down, its Node NotReady and tainted
    `node.cloudprovider.kubernetes.io/shutdown` by the cloud controller manager. The interruption function closes
    its claim on the stopping/stopped state change (as Karpenter's interruption controller deletes the NodeClaim);
    when that event is missed, the listing says the same, and the claim is closed (its instance terminated)
    rather than left Registered on a NotReady Node forever."""
    claims = [make_claim(id="c-1", instance_id="i-stopped")]
    decision = collect([owned("i-stopped", timedelta(hours=1), state=state)], claims, NOW, GRACE)
    assert [c.id for c in decision.gone] == ["c-1"] and decision.leaked == []


@pytest.mark.parametrize("state", ["pending", "running", "stopping", "stopped"])
def test_a_claim_whose_instance_lost_our_tag_but_still_exists_is_left_alone_and_counted(state: str) -> None:
    """The listing is filtered by our tag, which anyone with ec2:CreateTags or ec2:DeleteTags can
    change. Karpenter's NodeClaim garbage collection (kubernetes-sigs/karpenter pkg/controllers/nodeclaim/
    garbagecollection/controller.go) leaves a claim alone whose Node is Ready although the cloud provider's list
    misses its instance ("we know that the kubelet process is still running if the Node Ready condition is
    true"). Ours asks EC2 for the instance by id first: one that still exists is not gone, so its claim stays, its
    Node stays (its pods with it), and it is counted as `OwnershipTagLost`; closing it would have left it running
    and billing, owned by nobody (TerminateInstances is refused by the IAM ResourceTag condition)."""
    config = parse_config(example_config_data())  # cluster ml-prod
    clock = FixedClock(NOW)
    store = MemoryStateStore("ml-prod", clock)
    compute = MemoryCompute("ml-prod", clock)
    compute.instances["i-retagged"] = MemoryInstance("i-retagged", "g6.xlarge", "us-east-1a", "spot",
                                                     {TAG_CLUSTER: "ml-staging"}, state=state,
                                                     launched_at=NOW - timedelta(hours=2))
    store.create_claim(make_claim(id="c-mine", instance_id="i-retagged", node_name="node-mine"))
    store.create_claim(make_claim(id="c-lost", instance_id="i-lost", node_name="node-lost"))  # EC2 knows it not
    cluster = MemoryCluster([make_node("node-mine", "i-retagged"), make_node("node-lost", "i-lost")])  # both Ready
    collector = GarbageCollector(config, store, compute, compute, FleetService(config, store, compute, clock=clock),
                                 cluster, clock=clock)
    outcome = collector.run(cluster.list_nodes())
    claim = store.get_claim("c-mine")
    assert claim is not None and claim.state is not ClaimState.TERMINATED, f"claim closed: {claim and claim.reason}"
    assert compute.instances["i-retagged"].state == state
    assert [n.name for n in cluster.list_nodes()] == ["node-mine"], "a node of an existing instance was deleted"
    assert outcome.closed == ["c-lost"] and outcome.ownership_lost == ["i-retagged"]
    assert compute.described == [["i-lost", "i-retagged"]]  # one DescribeInstances, for the claims that look gone


def test_a_claim_whose_unlisted_instance_shuts_down_is_closed_and_its_node_waits() -> None:
    """An instance missing from the listing that EC2 shows shutting down is gone (its claim closed), but its Node
    waits for `terminated`, as for a listed one (module docstring: Karpenter's `awaitInstanceTermination`)."""
    claims = [make_claim(id="c-1", instance_id="i-ending"), make_claim(id="c-2", instance_id="i-ended")]
    decision = collect([], claims, NOW, GRACE)
    assert decision.unlisted == ["i-ended", "i-ending"] and decision.ended == []
    settled = decision.settled({"i-ending": "shutting-down"})
    assert [c.id for c in settled.gone] == ["c-1", "c-2"] and settled.ended == ["i-ended"]
    assert settled.ownership_lost == []

"""One contract, two stores: the DynamoDB store on moto and the in-memory one must answer alike."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.errors import ClaimExists, StaleClaim, StateStoreError
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from tests.integration.state.conftest import START

if TYPE_CHECKING:

    from gpu_autoscaler.clock import FixedClock
    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.ports import StateStore

TTL = timedelta(minutes=10)


def claim(claim_id: str = "claim-1", pods: tuple[str, ...] = ("p1", "p2")) -> NodeClaim:
    return NodeClaim(cluster="c", id=claim_id, pool="gpu", capacity_type="spot", zones=("us-east-1a",),
                     instance_types=("g5.xlarge", "g6.xlarge"), price_per_hour=0.4, pods=pods, created_at=START)


def test_a_claim_is_stored_once_and_read_back(clock_and_store: tuple[FixedClock, StateStore]) -> None:
    _, store = clock_and_store
    store.create_claim(claim())
    with pytest.raises(ClaimExists):
        store.create_claim(claim())
    assert store.get_claim("claim-1") == claim()
    assert store.get_claim("missing") is None
    assert [c.id for c in store.list_claims([ClaimState.PENDING])] == ["claim-1"]
    assert store.list_claims([ClaimState.LAUNCHED]) == []


def test_lifecycle_writes_are_conditional_and_leave_a_history(clock_and_store: tuple[FixedClock, StateStore]) -> None:
    clock, store = clock_and_store
    pending = claim()
    store.create_claim(pending)
    clock.advance(timedelta(seconds=30))
    launched = store.transition(pending, ClaimState.LAUNCHED, "fleet launched", instance_id="i-0abc",
                                instance_type="g5.xlarge", zone="us-east-1a")
    assert launched.state is ClaimState.LAUNCHED
    assert launched.history[-1].reason == "fleet launched"
    assert store.claim_for_instance("i-0abc") == launched
    assert store.claim_for_instance("i-other") is None
    with pytest.raises(StaleClaim):  # a second fleet invocation working from the Pending copy loses
        store.transition(pending, ClaimState.LAUNCHED, "again", instance_id="i-0def")
    with pytest.raises(StaleClaim):  # not an allowed step
        store.transition(launched, ClaimState.PENDING)
    with pytest.raises(StaleClaim):
        store.update_claim(pending, reason="stale copy")
    updated = store.update_claim(launched, warm="forecast")
    assert updated.warm == "forecast"
    assert updated.state is ClaimState.LAUNCHED
    done = store.transition(updated, ClaimState.TERMINATED, "interrupted")
    assert [step.state for step in done.history] == [ClaimState.LAUNCHED, ClaimState.TERMINATED]
    assert store.get_claim("claim-1") == done


def test_every_conditional_write_checks_the_version_not_only_the_state(
        clock_and_store: tuple[FixedClock, StateStore]) -> None:
    """Two functions read one claim; both update it without changing its state. The second works from a copy the
    first has outdated, so it loses (StaleClaim) instead of overwriting the first's change."""
    _, store = clock_and_store
    store.create_claim(claim())
    read_by_packer = store.get_claim("claim-1")
    read_by_consolidate = store.get_claim("claim-1")
    assert read_by_packer is not None and read_by_consolidate is not None
    assert read_by_packer.version == 0
    added = store.update_claim(read_by_packer, pods=("p1", "p2", "p3"))
    assert added.version == 1
    with pytest.raises(StaleClaim):
        store.update_claim(read_by_consolidate, attributes={"emptySince": "2026-11-23T12:00:00+00:00"})
    with pytest.raises(StaleClaim):  # a lifecycle step from the outdated copy loses too
        store.transition(read_by_consolidate, ClaimState.TERMINATED, "stale")
    stored = store.get_claim("claim-1")
    assert stored == added and stored.pods == ("p1", "p2", "p3") and stored.attributes == {}
    launched = store.transition(added, ClaimState.LAUNCHED, "launched", instance_id="i-0v")
    assert launched.version == 2
    assert store.claim_for_instance("i-0v") == launched


def test_a_pod_is_covered_by_one_live_claim_at_a_time(clock_and_store: tuple[FixedClock, StateStore]) -> None:
    clock, store = clock_and_store
    first, second = claim("a", ("p1", "p2")), claim("b", ("p2", "p3"))
    store.create_claim(first)
    store.create_claim(second)
    assert sorted(store.assign_pods("a", ["p1", "p2"], TTL)) == ["p1", "p2"]
    assert store.assign_pods("a", ["p1"], TTL) == []  # reported again: nothing new
    assert store.assign_pods("b", ["p2", "p3"], TTL) == ["p3"]
    assert store.assignments(["p1", "p2", "p3", "p4"]) == {"p1": "a", "p2": "a", "p3": "b"}

    store.transition(first, ClaimState.TERMINATED, "could not launch")
    assert store.assignments(["p1", "p2"]) == {}  # a dead claim covers nothing
    assert store.assign_pods("b", ["p2"], TTL) == ["p2"]

    store.release_pods(["p2", "p3"])
    assert store.assignments(["p2", "p3"]) == {}

    store.assign_pods("b", ["p3"], TTL)
    clock.advance(TTL + timedelta(seconds=1))
    assert store.assignments(["p3"]) == {}  # expired, whatever TTL deletion has done yet
    assert store.assign_pods("b", ["p3"], TTL) == ["p3"]


def test_many_claims_are_created_at_once_and_those_stored_before_are_left_alone(
        clock_and_store: tuple[FixedClock, StateStore]) -> None:
    _, store = clock_and_store
    store.create_claim(claim("c-1"))
    taken = store.update_claim(claim("c-1"), reason="changed since")
    many = [claim(f"c-{n}", (f"p{n}",)) for n in range(1, 151)]  # more than one transaction holds
    assert store.create_claims(many) == {"c-1"}
    assert store.get_claim("c-1") == taken
    assert store.get_claim("c-150") == many[-1]
    assert len(store.list_claims([ClaimState.PENDING])) == 150
    assert store.create_claims(many[100:]) == {c.id for c in many[100:]}
    # A claim that ended in the middle of a later transaction is refused alone, the rest written.
    store.transition(store.get_claim("c-75") or many[74], ClaimState.TERMINATED, "ended")
    again = [claim(f"d-{n}") for n in range(60)] + [many[74]] + [claim(f"e-{n}") for n in range(60)]
    assert store.create_claims(again) == {"c-75"}
    assert len(store.list_claims([ClaimState.PENDING])) == 149 + 120


def test_the_actions_of_one_key_are_never_split_over_two_transactions() -> None:
    from gpu_autoscaler.adapters.aws.state_store import TRANSACT_ITEMS, _batches

    writes = [(f"k{n}", {"n": n}) for n in range(TRANSACT_ITEMS - 1)] + [("claim", {"a": 1}), ("claim", {"b": 2})]
    batches = _batches(writes)
    assert [len(b) for b in batches] == [TRANSACT_ITEMS - 1, 2]
    assert [w for b in batches for w in b] == writes
    unkeyed = [("", {"n": n}) for n in range(TRANSACT_ITEMS + 1)]  # no key: no group, split anywhere
    assert [len(b) for b in _batches(unkeyed)] == [TRANSACT_ITEMS, 1]


def test_pods_of_many_claims_are_assigned_at_once_with_each_pods_own_condition(
        clock_and_store: tuple[FixedClock, StateStore]) -> None:
    """Free, expired, already ours, held by a live claim, held by a dead one: in one call, each as `assign_pods`
    decides it alone; and more pods than one transaction holds."""
    clock, store = clock_and_store
    for name in ("live", "dead", "a", "b"):
        store.create_claim(claim(name, ()))
    store.assign_pods("live", ["held"], TTL)
    store.assign_pods("dead", ["orphan"], TTL)
    store.assign_pods("a", ["mine", "old"], timedelta(seconds=5))
    store.transition(claim("dead", ()), ClaimState.TERMINATED, "gone")
    clock.advance(timedelta(seconds=10))
    store.assign_pods("a", ["mine"], TTL)  # renewed: still a's below; "old" has expired
    many = [f"q{n}" for n in range(130)]
    newly = store.assign_many({"a": ["mine", "old", "held", "orphan", "free", *many], "b": ["free", "other"]}, TTL)
    assert sorted(newly["a"]) == sorted(["old", "orphan", "free", *many])
    assert newly["b"] == ["other"]  # "free" was named for a first
    assert store.assignments(["mine", "old", "held", "orphan", "free", "other", "q129"]) == {
        "mine": "a", "old": "a", "held": "live", "orphan": "a", "free": "a", "other": "b", "q129": "a"}
    assert store.assign_many({"a": ["mine"], "b": ["held"]}, TTL) == {}
    clock.advance(TTL - timedelta(seconds=1))
    assert store.assignments(["mine"]) == {"mine": "a"}  # its expiry was renewed by the call before


def test_many_claims_are_updated_at_once_each_on_its_own_state_and_version(
        clock_and_store: tuple[FixedClock, StateStore]) -> None:
    """The packer adds a document's pods to its claims in flight in one call: each claim's write stands on the copy
    it was read at, so one another writer changed meanwhile is left out (and left as that writer made it), the
    others are written — and more claims than one transaction holds."""
    _, store = clock_and_store
    many = [claim(f"u-{n}", (f"p{n}",)) for n in range(130)]
    store.create_claims(many)
    read = store.get_claims([c.id for c in many] + ["absent"])
    assert read == {c.id: c for c in many}
    changed = store.update_claim(read["u-7"], reason="another writer")  # after our read
    launched = store.transition(read["u-9"], ClaimState.LAUNCHED, "launched", instance_id="i-0u9")
    written = store.update_claims([(c, {"pods": (*c.pods, "new")}) for c in read.values()])
    assert set(written) == {c.id for c in many} - {"u-7", "u-9"}
    after = store.get_claims(c.id for c in many)
    assert after["u-7"] == changed and after["u-9"] == launched
    assert after["u-0"] == written["u-0"] and written["u-0"].pods == ("p0", "new") and written["u-0"].version == 1
    assert after["u-129"].pods == ("p129", "new")
    assert store.update_claims([(read["u-0"], {"reason": "stale copy"})]) == {}  # u-0 moved on since `read`


def test_unavailable_offerings_expire(clock_and_store: tuple[FixedClock, StateStore]) -> None:
    clock, store = clock_and_store
    store.mark_unavailable(("p5.48xlarge", "us-east-1a", "spot"), timedelta(minutes=3), "InsufficientInstanceCapacity")
    store.mark_unavailable(("g5.xlarge", "us-east-1b", "on-demand"), timedelta(minutes=10), "VcpuLimitExceeded")
    assert store.unavailable_offerings() == {
        ("p5.48xlarge", "us-east-1a", "spot"), ("g5.xlarge", "us-east-1b", "on-demand")
    }
    clock.advance(timedelta(minutes=5))
    assert store.unavailable_offerings() == {("g5.xlarge", "us-east-1b", "on-demand")}


def test_a_reservations_record_names_it_beside_an_older_record_for_all(
        clock_and_store: tuple[FixedClock, StateStore]) -> None:
    """A reservation's record holds its id where the capacity type stands (`domain.catalog.unavailable_key`), in the
    same three parts; a record older code wrote for every reservation of a type and zone reads back as it was."""
    _, store = clock_and_store
    store.mark_unavailable(("p5.48xlarge", "us-east-1a", "cr-0123456789abcdef0"), timedelta(minutes=3),
                           "ReservationCapacityExceeded")
    store.mark_unavailable(("p4d.24xlarge", "us-east-1b", "reserved"), timedelta(minutes=3), "older code")
    assert store.unavailable_offerings() == {
        ("p5.48xlarge", "us-east-1a", "cr-0123456789abcdef0"), ("p4d.24xlarge", "us-east-1b", "reserved")}


def test_demand_keeps_each_buckets_peak_in_time_order(clock_and_store: tuple[FixedClock, StateStore]) -> None:
    _, store = clock_and_store
    week = timedelta(days=7)
    for minutes, gpus in [(10, 4.0), (0, 8.0), (5, 2.0), (0, 3.0)]:
        store.record_demand("gpu", START + timedelta(minutes=minutes), gpus, week)
    store.record_demand("other", START, 99.0, week)
    assert store.demand_history("gpu", START) == [
        (START, 8.0), (START + timedelta(minutes=5), 2.0), (START + timedelta(minutes=10), 4.0)
    ]
    assert store.demand_history("gpu", START + timedelta(minutes=5)) == [
        (START + timedelta(minutes=5), 2.0), (START + timedelta(minutes=10), 4.0)
    ]


def test_the_live_claims_read_does_not_read_the_terminated_ones(aws: EmbeddedAws) -> None:
    """A filter does not lower what a Query reads: DynamoDB bills every item the key condition reaches before the
    filter drops any ("A filter expression is applied after a Query finishes, but before the results are
    returned... the read capacity is the same", DynamoDB Developer Guide, Query filter expressions; ScannedCount
    is that number). Terminated claims are kept 30 days, so a packer document, a consolidation tick or a
    pre-warm tick that reads the live claims must not reach them: in a cluster that replaces 200 nodes a day,
    6,000 ended claims of ~2 KB, 3,000 strongly consistent read units and a dozen 1 MB pages each time."""
    db = aws.clients.client("dynamodb")
    store = DynamoStateStore(db, aws.table_name, f"c-{uuid.uuid4().hex[:8]}")
    for n in range(12):
        store.create_claim(claim(f"ended-{n}", ()))
        store.transition(claim(f"ended-{n}", ()), ClaimState.TERMINATED, "done")
    store.create_claim(claim("live", ()))
    scanned: list[int] = []

    def count(parsed: dict[str, Any], **_: Any) -> None:
        scanned.append(int(parsed.get("ScannedCount", 0)))

    db.meta.events.register("after-call.dynamodb.Query", count)
    try:
        live = store.list_claims([ClaimState.PENDING, ClaimState.LAUNCHED, ClaimState.REGISTERED,
                                  ClaimState.DRAINING])
        assert [c.id for c in live] == ["live"]
        assert sum(scanned) == 1
    finally:
        db.meta.events.unregister("after-call.dynamodb.Query", count)
    # Ended claims are still there for whoever asks for them, by id or by state.
    assert {c.id for c in store.list_claims([ClaimState.TERMINATED])} == {f"ended-{n}" for n in range(12)}
    ended = store.get_claim("ended-3")
    assert ended is not None and ended.state is ClaimState.TERMINATED
    assert set(store.get_claims(["ended-4", "live", "unknown"])) == {"ended-4", "live"}
    assert len(store.list_claims()) == 13  # asked for all, all come


def test_an_ended_claim_is_not_created_again(clock_and_store: tuple[FixedClock, StateStore]) -> None:
    """A redelivered packer message plans the same claim ids: a claim that already ran and ended must not be
    stored again as a new Pending claim (it would launch a node for pods long gone)."""
    _, store = clock_and_store
    store.create_claim(claim("once", ()))
    store.transition(claim("once", ()), ClaimState.TERMINATED, "done")
    assert store.create_claims([claim("once", ()), claim("fresh", ())]) == {"once"}
    with pytest.raises(ClaimExists):
        store.create_claim(claim("once", ()))
    once = store.get_claim("once")
    assert once is not None and once.state is ClaimState.TERMINATED
    fresh = store.get_claim("fresh")
    assert fresh is not None and fresh.state is ClaimState.PENDING


def test_an_ended_claim_with_an_instance_is_found_by_its_instance(
        clock_and_store: tuple[FixedClock, StateStore]) -> None:
    """Interruption and state-change events name instances, often after their claim ended."""
    _, store = clock_and_store
    store.create_claim(claim("ran", ()))
    launched = store.transition(claim("ran", ()), ClaimState.LAUNCHED, "launched", instance_id="i-0ran",
                                instance_type="g5.xlarge", zone="us-east-1a")
    store.transition(launched, ClaimState.TERMINATED, "gone")
    found = store.claim_for_instance("i-0ran")
    assert found is not None and found.id == "ran" and found.state is ClaimState.TERMINATED
    with pytest.raises(StaleClaim):
        store.transition(launched, ClaimState.TERMINATED, "again, from a stale read")


def test_hundreds_of_pods_are_released_in_a_few_calls(aws: EmbeddedAws) -> None:
    """The packer releases a document's displaced pods (hundreds in a burst) and the fleet a failed request's: a
    DeleteItem each was a round trip each (a third of the packer's time in a 300-pod burst on the emulator)."""
    db = aws.clients.client("dynamodb")
    store = DynamoStateStore(db, aws.table_name, f"c-{uuid.uuid4().hex[:8]}")
    store.create_claim(claim("holder", ()))
    uids = [f"r{n}" for n in range(60)]
    store.assign_pods("holder", uids, TTL)
    calls: list[str] = []

    def count(model: Any, **_: Any) -> None:
        calls.append(model.name)

    db.meta.events.register("before-call.dynamodb.*", count)
    try:
        store.release_pods([*uids, "never-assigned"])
    finally:
        db.meta.events.unregister("before-call.dynamodb.*", count)
    assert len(calls) <= 3, calls
    assert store.assignments(uids) == {}


class _Throttled:
    """The DynamoDB client, but BatchGetItem answers the first `partial` calls with half their keys unprocessed, and
    every call after `partial` with all of them when `stuck` (a throttled partition, as DynamoDB answers it: "If
    at least one of the items is successfully processed, then BatchGetItem completes successfully, while returning
    the keys of the unread items in UnprocessedKeys"). moto never leaves keys unprocessed for items this small."""

    def __init__(self, db: Any, *, partial: int, stuck: bool = False) -> None:
        self._db, self.partial, self.stuck, self.calls = db, partial, stuck, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:  # noqa: N803 (boto3's name)
        self.calls += 1
        if self.calls > self.partial and self.stuck:
            return {"Responses": {}, "UnprocessedKeys": RequestItems}
        if self.calls > self.partial:
            return self._db.batch_get_item(RequestItems=RequestItems)
        (table, asked), = RequestItems.items()
        keys = asked["Keys"]
        answer = self._db.batch_get_item(RequestItems={table: {**asked, "Keys": keys[:len(keys) // 2]}})
        return {**answer, "UnprocessedKeys": {table: {**asked, "Keys": keys[len(keys) // 2:]}}}


def test_keys_left_unprocessed_are_read_again_after_a_growing_pause_and_not_for_ever(
        aws: EmbeddedAws, monkeypatch: pytest.MonkeyPatch) -> None:
    """DynamoDB API reference, BatchGetItem: "If DynamoDB returns any unprocessed items, you should retry the batch
    operation on those items. However, we strongly recommend that you use an exponential backoff algorithm. If you
    retry the batch operation immediately, the underlying read or write requests can still fail due to throttling
    on the individual tables." Every claim read goes through it (`get_claims`, `assignments`), so a throttled
    partition was asked again in a tight loop until the Lambda timed out; now as `release_pods`' BatchWriteItem."""
    from gpu_autoscaler.adapters.aws import state_store as module

    slept: list[float] = []
    monkeypatch.setattr(module.time, "sleep", slept.append)
    db = aws.clients.client("dynamodb")
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    DynamoStateStore(db, aws.table_name, cluster).create_claims([claim(f"nc-{n}", ()) for n in range(8)])
    wanted = [f"nc-{n}" for n in range(8)]
    throttled = _Throttled(db, partial=2)
    assert sorted(DynamoStateStore(throttled, aws.table_name, cluster).get_claims(wanted)) == wanted
    assert throttled.calls == 3 and slept == [0.05, 0.1]
    slept.clear()
    stuck = _Throttled(db, partial=0, stuck=True)
    with pytest.raises(StateStoreError, match="8 read"):
        DynamoStateStore(stuck, aws.table_name, cluster).get_claims(wanted)
    assert stuck.calls == 6 and slept == [0.05, 0.1, 0.2, 0.4, 0.8]


class _ThrottledTransactions:
    """The DynamoDB client, but TransactWriteItems is cancelled for throughput its first `throttled` times, every
    action's reason `reason` (one per action, in order, as DynamoDB sends them). DynamoDB API reference,
    TransactionCanceledException: "ThrottlingError … Throughput exceeds the current capacity of your table or index.
    DynamoDB is automatically scaling your table or index so please try again shortly … returned when writes get
    throttled on an On-Demand table"; `ProvisionedThroughputExceeded` on a provisioned one. botocore's retries do
    not retry a TransactionCanceledException, and neither moto nor the emulator ever throttles."""

    def __init__(self, db: Any, *, throttled: int, reason: str = "ThrottlingError") -> None:
        self._db, self.throttled, self.reason, self.calls = db, throttled, reason, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def transact_write_items(self, TransactItems: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
        self.calls += 1
        if self.calls <= self.throttled:
            raise ClientError({"Error": {"Code": "TransactionCanceledException",
                                         "Message": "Transaction cancelled, please refer cancellation reasons"},
                               "CancellationReasons": [{"Code": self.reason, "Message": "Throughput exceeds the "
                                                        "current capacity of your table or index."}
                                                       for _ in TransactItems]},
                              "TransactWriteItems")
        answer: dict[str, Any] = self._db.transact_write_items(TransactItems=TransactItems)
        return answer


@pytest.mark.parametrize("reason", ["ThrottlingError", "ProvisionedThroughputExceeded"])
def test_a_transaction_cancelled_for_throughput_is_sent_again_after_a_growing_pause_and_not_for_ever(
        aws: EmbeddedAws, monkeypatch: pytest.MonkeyPatch, reason: str) -> None:
    """A document's `assign_many` puts hundreds of pods under the cluster's one partition key in seconds: a
    throttled transaction failed its record (or a consolidate tick) at once, and a throttled claim write was taken
    for another writer's (StaleClaim). Now each is sent again as BatchGetItem's unprocessed keys are."""
    from gpu_autoscaler.adapters.aws import state_store as module

    slept: list[float] = []
    monkeypatch.setattr(module.time, "sleep", slept.append)
    db = aws.clients.client("dynamodb")
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    throttled = _ThrottledTransactions(db, throttled=2, reason=reason)
    store = DynamoStateStore(throttled, aws.table_name, cluster)
    uids = [f"pod-{n}" for n in range(150)]  # two transactions
    assert sorted(store.assign_many({"nc-1": uids}, TTL)["nc-1"]) == sorted(uids)
    assert throttled.calls == 4 and slept == [0.05, 0.1]
    slept.clear()
    throttled.calls, throttled.throttled = 0, 1
    store.create_claim(claim("nc-1"))
    assert throttled.calls == 2 and slept == [0.05]
    slept.clear()
    throttled.calls = 0
    launched = store.transition(claim("nc-1"), ClaimState.LAUNCHED, instance_id="i-1")
    assert throttled.calls == 2 and slept == [0.05]
    assert store.get_claim("nc-1") == launched
    slept.clear()
    throttled.calls, throttled.throttled = 0, 100
    with pytest.raises(StateStoreError, match="throttled"):
        store.assign_many({"nc-1": ["pod-x"]}, TTL)
    assert throttled.calls == 6 and slept == [0.05, 0.1, 0.2, 0.4, 0.8]

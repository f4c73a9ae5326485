"""A burst of pods costs the packer a few writes, not one per pod: a 1,000-pod document used to be ~1,500
conditional puts and 500 launch messages, one call each (95 s in the emulator, and as many round trips in a
Lambda). Claims and pod assignments go in transactions of up to 100 conditional writes, like claims share a
launch request, and launch requests go ten to a SendMessageBatch."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.adapters.aws.launch_queue import SqsLaunchQueue
from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler.services.packer import PackerService, free_room
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

PODS = 300
WRITES = ("PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem", "SendMessage",
          "SendMessageBatch")


@pytest.fixture(scope="module")
def config() -> Config:
    data = example_config_data()
    for pool in data["nodePools"]:
        pool.pop("limits", None)  # the burst is placed, not cut at the example's 256 GPUs
    return parse_config(data)


@pytest.fixture(scope="module")
def aws(config: Config) -> Iterator[EmbeddedAws]:
    with EmbeddedAws(config) as embedded:
        yield embedded


def document(cluster: str, pods: int) -> PendingPodsDocument:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return PendingPodsDocument.model_validate_json(json.dumps({
        "schemaVersion": 1, "cluster": cluster, "sentAt": now, "pods": [{
            "uid": str(uuid.uuid4()), "namespace": "load", "name": f"load-{n}", "createdAt": now,
            "requests": {"cpu": "4", "memory": "24Gi", "nvidia.com/gpu": "1"},
            "nodeSelector": {L.NODE_POOL: "gpu-burst"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        } for n in range(pods)]}))


def test_a_document_of_hundreds_of_pods_takes_a_few_write_calls(aws: EmbeddedAws, config: Config) -> None:
    calls: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    db, sqs = aws.clients.client("dynamodb"), aws.clients.client("sqs")
    for client in (db, sqs):
        client.meta.events.register("before-call.*.*", count)
    store = DynamoStateStore(db, aws.table_name, config.cluster_name)
    catalog = Ec2CatalogSource.from_config(aws.clients, config, use_pricing_api=False).catalog()
    service = PackerService(config, store, catalog, SqsLaunchQueue(sqs, aws.queue_url("launch")), clock=SystemClock())
    doc = document(config.cluster_name, PODS)

    outcome = service.handle(doc, source="m-1")

    claims = len(outcome.created)
    assert outcome.unschedulable == () and claims >= PODS // 8
    assert sum(len(ids) for ids in outcome.launch_requests) == claims
    assert len(outcome.launch_requests) <= claims // 10 + 3  # like claims share a request, ten at most
    writes = sum(calls[name] for name in WRITES)
    # Claims: ⌈claims / 100⌉ transactions; assignments: ⌈pods / 100⌉; launch messages: ⌈requests / 10⌉; the
    # demand history: a put per pool and shape. Nothing per pod or per claim.
    assert writes <= -(-claims // 100) + -(-PODS // 100) + -(-len(outcome.launch_requests) // 10) + 6, dict(calls)
    assert store.assignments([p.uid for p in doc.pods]).keys() == {p.uid for p in doc.pods}

    calls.clear()
    again = service.handle(doc, source="m-2")  # the agent reports them again while they launch
    assert again.created == () and again.covered == PODS
    assert sum(calls[name] for name in WRITES) <= 6, dict(calls)  # the demand history's puts at most


def test_pods_joining_claims_in_flight_take_a_few_calls_not_a_read_and_a_write_per_claim(
        aws: EmbeddedAws, config: Config) -> None:
    """The agent reports pods as they are created, so most documents of a burst place pods on claims already in
    flight. Each such claim was read twice and rewritten on its own (GetItem, GetItem, TransactWriteItems): a
    1,000-pod burst spent 671 s in the packer over 16 documents against ~10 s for one 1,000-pod document. The
    claims are now read in one BatchGetItem and written in transactions of up to 100, each put still conditional
    on the claim's state and version."""
    calls: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    db, sqs = aws.clients.client("dynamodb"), aws.clients.client("sqs")
    store = DynamoStateStore(db, aws.table_name, config.cluster_name)
    catalog = Ec2CatalogSource.from_config(aws.clients, config, use_pricing_api=False).catalog()
    service = PackerService(config, store, catalog, SqsLaunchQueue(sqs, aws.queue_url("launch")), clock=SystemClock())
    first = document(config.cluster_name, 80)
    made = service.handle(first, source="m-first")
    claims = [c for c in store.list_claims() if c.id in made.created and len(c.pods) > 1]
    assert len(claims) >= 30
    # A drain takes one pod off each (its node is going): each claim now has room for one pod more.
    by_uid = {p.uid: p for p in first.pods}
    freed = free_room(store, [c.id for c in claims], [by_uid[c.pods[0]] for c in claims])
    assert len(freed) == len(claims)

    db.meta.events.register("before-call.*.*", count)
    joining = document(config.cluster_name, len(claims))
    outcome = service.handle(joining, source="m-joining")

    assert outcome.created == () and outcome.placed_in_flight == len(claims)
    reads, writes = calls["GetItem"] + calls["BatchGetItem"], calls["TransactWriteItems"] + calls["PutItem"]
    assert calls["GetItem"] == 0 and reads <= 4, dict(calls)  # assignments' owners, the claims before the write
    assert writes <= 2 + 2 + 2, dict(calls)  # the assignments, the claims, the demand history
    stored = {c.id: c for c in store.list_claims()}
    owner = store.assignments([p.uid for p in joining.pods])
    for claim in claims:
        joined = [uid for uid, cid in owner.items() if cid == claim.id]
        assert len(joined) == 1 and stored[claim.id].pods == (*claim.pods[1:], joined[0])
        assert stored[claim.id].version == claim.version + 2  # the drain's write, then this one

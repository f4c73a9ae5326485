"""A Spot warning on moto and the local Kubernetes API, then the pods' successors: the interruption Lambda plans a
replacement for the node's pods, the fleet Lambda launches it, the drain Lambda evicts the pods, and when their
ReplicaSet's new pods (new uids) reach the packer Lambda they are placed on the replacement: no second claim."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.domain.interruption import replacement_pods
from gpu_autoscaler.domain.packing.results import claim_requests
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.messages import DrainRequest
from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler.models.resources import Resources
from tests.integration.interruption.conftest import (
    _handler,
    bind_pod,
    drain_queue,
    event_body,
    invoke,
    launch_all,
    launch_node,
    receive,
)
from tests.integration.interruption.test_interruption_lambda import put_event

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

    from kubernetes import client

    from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
    from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes


@pytest.fixture(scope="module")
def packer(aws: EmbeddedAws) -> Iterator[ModuleType]:
    yield from _handler(aws, "packer")


def test_the_evicted_pods_successors_are_placed_on_the_replacement(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, cluster: KubernetesCluster,
        core: client.CoreV1Api, fleet: ModuleType, interruption: ModuleType, drain: ModuleType,
        packer: ModuleType) -> None:
    old = launch_node(aws, fleet, kube, store, "gpu-burst-spot-room")
    assert old.instance_id and old.node_name
    bind_pod(core, old.node_name, "room-0", labels={"app": "room"})
    bind_pod(core, old.node_name, "room-1", labels={"app": "room"})
    running = [p for p in cluster.list_pods(old.node_name) if p.owner_kind != "DaemonSet"]

    put_event(aws, event_body("spot-interruption-warning", old.instance_id))
    assert invoke(aws, interruption, "interruption", "interruption",
                  receive(aws, "interruption", wait=1)) == {"batchItemFailures": []}
    launched = [i for r in launch_all(aws, fleet) for i in r.claim_ids]
    replacements = [store.get_claim(i) for i in launched]
    assert replacements and all(c is not None and c.state is ClaimState.LAUNCHED for c in replacements)
    assert sorted(u for c in replacements if c is not None for u in c.pods) == sorted(p.uid for p in running)

    (request,) = [DrainRequest.model_validate_json(m["Body"]) for m in drain_queue(aws, "drain")]
    aws.clients.client("sqs").send_message(QueueUrl=aws.queue_url("drain"),
                                           MessageBody=request.model_dump_json(by_alias=True))
    assert invoke(aws, drain, "drain", "drain", receive(aws, "drain", wait=1)) == {"batchItemFailures": []}
    assert cluster.list_pods(old.node_name) == []
    for claim_id in launched:
        emptied = store.get_claim(claim_id)
        assert emptied is not None and emptied.pods == () and claim_requests(emptied) == Resources()

    # The ReplicaSet recreates the evicted pods with new uids; the agent reports them pending.
    successors = [p.model_copy(update={"uid": str(uuid.uuid4()), "name": f"{p.name}-b", "node_name": None,
                                       "phase": "Pending"}) for p in running]
    document = PendingPodsDocument(schema_version=1, cluster="ml-prod", sent_at=datetime.now(UTC),
                                   pods=replacement_pods(successors))
    aws.clients.client("sqs").send_message(
        QueueUrl=aws.queue_url("pending-pods"), MessageGroupId="ml-prod", MessageDeduplicationId=str(uuid.uuid4()),
        MessageBody=json.dumps(document.model_dump(mode="json", by_alias=True)))
    before = {c.id for c in store.list_claims()}
    assert invoke(aws, packer, "packer", "pending-pods",
                  receive(aws, "pending-pods", wait=1)) == {"batchItemFailures": []}

    assert {c.id for c in store.list_claims()} == before  # no second claim
    assert drain_queue(aws, "launch") == []
    placed = [store.get_claim(i) for i in launched]
    assert sorted(u for c in placed if c is not None for u in c.pods) == sorted(p.uid for p in successors)
    assert set(store.assignments([p.uid for p in successors]).values()) <= set(launched)

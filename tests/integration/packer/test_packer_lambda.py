"""The packer Lambda on moto (server mode): real queues, table and parameter, events as Lambda delivers them.

A batch with a valid document and a poison message: the poison fails alone (its validation error logged)
and, received again and again, lands in the dead-letter queue; the document becomes claims in DynamoDB,
pod assignments and launch requests. The same document delivered again, or the same message redelivered,
provisions nothing more.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.sqs_events import RECEIVE_ARGUMENTS, sqs_event
from gpu_autoscaler.lambda_context import local_context
from gpu_autoscaler.models.pods import PendingPodsDocument
from tests.conftest import ROOT, example_config_data, log_to_stdout
from tests.emf import metric_values

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

DOCUMENT = (ROOT / "events" / "pending-pods-document.json").read_text()
ELSEWHERE = json.dumps({**json.loads(DOCUMENT), "cluster": "ml-dev"})
"""Valid, but another cluster's: an agent pointed at the wrong queue."""
POISON = json.dumps({"schemaVersion": 1, "cluster": "ml-prod", "pods": [{"uid": "x", "requests": {"cpu": "lots"}}]})


@pytest.fixture(scope="module")
def config() -> Config:
    return parse_config(example_config_data())


@pytest.fixture(scope="module")
def aws(config: Config) -> Iterator[EmbeddedAws]:
    with EmbeddedAws(config) as embedded:
        yield embedded


@pytest.fixture(scope="module")
def packer(aws: EmbeddedAws) -> Iterator[ModuleType]:
    """The handler module imported as Lambda would, with the function's environment; kept warm for the module."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in aws.function_environment("packer").items():
            patch.setenv(key, value)
        patch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
        path = Path(ROOT / "functions" / "packer" / "handler.py")
        spec = importlib.util.spec_from_file_location("packer_handler_under_test", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
        sys.modules.pop("packer_handler_under_test", None)


@pytest.fixture(scope="module")
def store(aws: EmbeddedAws, config: Config) -> DynamoStateStore:
    from gpu_autoscaler.clock import SystemClock

    return DynamoStateStore(aws.clients.client("dynamodb"), aws.resources.table_name, config.cluster_name,
                            clock=SystemClock())


def send(aws: EmbeddedAws, body: str, dedup: str) -> None:
    aws.clients.client("sqs").send_message(QueueUrl=aws.queue_url("pending-pods"), MessageBody=body,
                                           MessageGroupId="ml-prod", MessageDeduplicationId=dedup)


def receive(aws: EmbeddedAws, logical: str = "pending-pods") -> list[dict[str, Any]]:
    answer = aws.clients.client("sqs").receive_message(QueueUrl=aws.queue_url(logical), MaxNumberOfMessages=10,
                                                       WaitTimeSeconds=0, **RECEIVE_ARGUMENTS)
    return answer.get("Messages", [])


def receive_documents(aws: EmbeddedAws) -> list[dict[str, Any]]:
    """The document messages received; anything else (the poison, still in the FIFO group) made visible again,
    so it neither blocks its group for the visibility timeout nor skips a receive count."""
    messages = receive(aws)
    for message in messages:
        if message["Body"] != DOCUMENT:
            aws.clients.client("sqs").change_message_visibility(
                QueueUrl=aws.queue_url("pending-pods"), ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    return [m for m in messages if m["Body"] == DOCUMENT]


def invoke(aws: EmbeddedAws, packer: ModuleType, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Hand the handler an SQS event and, as the event source mapping does, delete what succeeded."""
    event = sqs_event(messages, aws.resources.queue_arns["pending-pods"])
    response = packer.handler(event, local_context("packer"))
    failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
    sqs = aws.clients.client("sqs")
    for message in messages:
        if message["MessageId"] in failed:
            sqs.change_message_visibility(QueueUrl=aws.queue_url("pending-pods"),
                                          ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
        else:
            sqs.delete_message(QueueUrl=aws.queue_url("pending-pods"), ReceiptHandle=message["ReceiptHandle"])
    return response


def launch_requests(aws: EmbeddedAws) -> list[dict[str, Any]]:
    out = []
    while messages := receive(aws, "launch"):
        for message in messages:
            out.append(json.loads(message["Body"]))
            aws.clients.client("sqs").delete_message(QueueUrl=aws.queue_url("launch"),
                                                     ReceiptHandle=message["ReceiptHandle"])
    return out


def test_a_batch_with_a_poison_message(aws: EmbeddedAws, packer: ModuleType, store: DynamoStateStore,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The poison comes first in the cluster's FIFO group. It can never become a document, so it goes to the
    dead-letter queue at once, with its reason, instead of holding the group back for maxReceiveCount deliveries
    (and dragging the documents behind it there): the document behind it is packed in the same batch."""
    log_to_stdout(packer)
    send(aws, POISON, "poison-1")
    send(aws, DOCUMENT, "doc-1")
    messages = receive(aws)
    assert [m["Body"] for m in messages] == [POISON, DOCUMENT]
    response = invoke(aws, packer, messages)
    assert response == {"batchItemFailures": []}
    assert "not a pending-pods document" in capsys.readouterr().out

    pods = PendingPodsDocument.model_validate_json(DOCUMENT).pods
    claims = store.list_claims()
    assert len(claims) == 3
    assert sorted(u for c in claims for u in c.pods) == sorted(p.uid for p in pods)
    assert store.assignments([p.uid for p in pods]) == {u: c.id for c in claims for u in c.pods}
    gang = [c for c in claims if c.gang == "training/train-42"]
    assert len(gang) == 1 and gang[0].zones == ("us-east-1a",) and gang[0].instance_types[0] == "p5.48xlarge"

    requests = launch_requests(aws)
    assert sorted(tuple(r["claimIds"]) for r in requests) == sorted((c.id,) for c in claims)
    assert {r.get("gang") for r in requests} == {None, "training/train-42"}


def test_a_fifo_batch_stops_at_its_first_failure_and_returns_the_rest(
        aws: EmbeddedAws, packer: ModuleType, store: DynamoStateStore, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue is FIFO: a document after a failed one in its group must not be packed ahead of it (AWS Lambda's
    SQS guide and Powertools' `SqsFifoPartialProcessor`); both go back, in order."""
    before = {c.id for c in store.list_claims()}
    packing = packer.service()

    class Failing:
        """The packer failing its first record (DynamoDB throttled, say): that one may succeed when retried."""

        def handle(self, document: PendingPodsDocument, *, source: str) -> Any:
            if source == "m-first":
                raise RuntimeError("ProvisionedThroughputExceededException")
            return packing.handle(document, source=source)

    monkeypatch.setattr(packer, "service", Failing)
    messages = [{**m, "Attributes": {**m.get("Attributes", {}), "MessageGroupId": "ml-prod"}} for m in (
        _fake_message("m-first", DOCUMENT), _fake_message("m-doc", DOCUMENT))]
    event = sqs_event(messages, aws.resources.queue_arns["pending-pods"])
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No application metrics")
        response = packer.handler(event, local_context("packer"))
    assert response == {"batchItemFailures": [{"itemIdentifier": "m-first"}, {"itemIdentifier": "m-doc"}]}
    assert {c.id for c in store.list_claims()} == before
    # Records going back to the queue are counted: a partial batch failure is no Lambda error, so no other
    # metric or alarm shows them until they reach the dead-letter queue.
    assert metric_values(capsys.readouterr().out, "RecordsFailed") == [2]


def _fake_message(message_id: str, body: str) -> dict[str, Any]:
    """A message as ReceiveMessage returns it, not taken from the queue (so nothing needs settling after)."""
    import hashlib

    return {"MessageId": message_id, "ReceiptHandle": f"handle-{message_id}", "Body": body,
            "MD5OfBody": hashlib.md5(body.encode()).hexdigest(), "Attributes": {"ApproximateReceiveCount": "1"}}


def test_the_same_document_delivered_again_provisions_nothing_more(aws: EmbeddedAws, packer: ModuleType,
                                                                    store: DynamoStateStore) -> None:
    before = {c.id for c in store.list_claims()}
    send(aws, DOCUMENT, "doc-2")  # the agent's resync: same pods, a new message
    messages = receive_documents(aws)
    assert len(messages) == 1
    assert invoke(aws, packer, messages) == {"batchItemFailures": []}
    assert {c.id for c in store.list_claims()} == before
    assert launch_requests(aws) == []


def test_a_redelivered_message_provisions_nothing_more(aws: EmbeddedAws, packer: ModuleType,
                                                       store: DynamoStateStore) -> None:
    before = {c.id for c in store.list_claims()}
    send(aws, DOCUMENT, "doc-3")
    messages = receive_documents(aws)
    event = sqs_event(messages, aws.resources.queue_arns["pending-pods"])
    packer.handler(event, local_context("packer"))
    packer.handler(event, local_context("packer"))  # the same message id again (the first reply was lost)
    assert {c.id for c in store.list_claims()} == before
    aws.clients.client("sqs").delete_message(QueueUrl=aws.queue_url("pending-pods"),
                                             ReceiptHandle=messages[0]["ReceiptHandle"])


def test_a_document_with_a_pod_asking_for_more_than_any_node_holds_is_packed(aws: EmbeddedAws, packer: ModuleType,
                                                                               store: DynamoStateStore) -> None:
    """`memory: 10E` is a valid request (kube-apiserver bounds it only from below) and the agent passes it on: the
    record succeeds, the absurd pod gets no claim, and the pods beside it are not held behind it in the FIFO group."""
    absurd = {"uid": "uid-absurd", "namespace": "team-x", "name": "typo-0",
              "requests": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "10E"},
              "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    document = json.loads(DOCUMENT)
    pending = {p["uid"] for p in document["pods"]}
    for pod in document["pods"]:  # pods no claim covers yet: this module's first test packed the sample's
        pod["uid"] += "-again"
    document["pods"].append(absurd)
    send(aws, json.dumps(document), "absurd-1")
    messages = receive(aws)
    assert len(messages) == 1
    assert invoke(aws, packer, messages) == {"batchItemFailures": []}
    placed = {u for c in store.list_claims() for u in c.pods}
    assert {uid + "-again" for uid in pending} <= placed and "uid-absurd" not in placed
    launch_requests(aws)


def test_a_document_for_another_cluster_goes_to_the_dead_letter_queue_at_once(aws: EmbeddedAws,
                                                                              packer: ModuleType) -> None:
    """An agent pointed at the wrong queue: its documents can never succeed here, like one that is no document, so
    each goes to the dead-letter queue with its reason instead of holding the group for maxReceiveCount deliveries."""
    send(aws, ELSEWHERE, "elsewhere-1")
    messages = receive(aws)
    assert [m["Body"] for m in messages] == [ELSEWHERE]
    assert invoke(aws, packer, messages) == {"batchItemFailures": []}


def test_the_poison_message_lands_in_the_dead_letter_queue_with_its_reason(aws: EmbeddedAws) -> None:
    assert receive(aws) == []  # nothing of the first batch was left behind
    dead = aws.clients.client("sqs").receive_message(
        QueueUrl=aws.queue_url("pending-pods-dlq"), MaxNumberOfMessages=10, WaitTimeSeconds=0,
        MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in dead] == [POISON, ELSEWHERE]
    poison, elsewhere = (m["MessageAttributes"] for m in dead)
    assert "sentAt" in poison["reason"]["StringValue"]  # a field the document lacks, named
    assert elsewhere["reason"]["StringValue"] == "document for cluster 'ml-dev' reached the packer of 'ml-prod'"
    assert poison["sourceMessageId"]["StringValue"] and elsewhere["sourceMessageId"]["StringValue"]
    assert {m["Attributes"]["MessageGroupId"] for m in dead} == {"ml-prod"}

"""The pending-pods FIFO queue on the embedded AWS (moto server on 127.0.0.1), what was delivered to it, and the
local Kubernetes API the agent watches."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from gpu_autoscaler.emulator.session import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kubernetes import client


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    with EmbeddedAws(parse_config(example_config_data())) as embedded:
        yield embedded


class Queue:
    """Reads the pending-pods queue as the packer would, deleting what it reads."""

    def __init__(self, aws: EmbeddedAws) -> None:
        self.sqs = aws.clients.client("sqs")
        self.url = aws.queue_url("pending-pods")
        self.cluster = aws.config.cluster_name
        self.drain()

    def receive(self) -> list[dict[str, Any]]:
        """Every message now in the queue: body (parsed), size in bytes, group and deduplication id."""
        out: list[dict[str, Any]] = []
        while True:
            response = self.sqs.receive_message(
                QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                MessageSystemAttributeNames=["MessageGroupId", "MessageDeduplicationId"],
            )
            messages = response.get("Messages", [])
            if not messages:
                return out
            for message in messages:
                out.append({
                    "document": json.loads(message["Body"]),
                    "bytes": len(message["Body"].encode()),
                    "group": message["Attributes"]["MessageGroupId"],
                    "dedup": message["Attributes"]["MessageDeduplicationId"],
                })
                self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=message["ReceiptHandle"])

    def drain(self) -> None:
        """Empty it by reading (SQS allows one PurgeQueue a minute)."""
        self.receive()


@pytest.fixture
def queue(aws: EmbeddedAws) -> Queue:
    return Queue(aws)


class FlakySqs:
    """The real SQS client, but the next `failures` SendMessage calls fail as SQS fails them when throttling.

    Failures are raised by botocore's own error type with SQS's error shape, after (optionally) letting the
    request through, as a lost response would: the retry must then be deduplicated, not delivered twice.
    """

    def __init__(self, real: Any, failures: int = 0, *, deliver_then_fail: bool = False) -> None:
        self._real = real
        self.failures = failures
        self.deliver_then_fail = deliver_then_fail
        self.attempts = 0
        self._lock = threading.Lock()

    def send_message(self, **kwargs: Any) -> Any:
        from botocore.exceptions import ClientError

        with self._lock:
            self.attempts += 1
            fail = self.failures > 0
            self.failures -= 1 if fail else 0
        if fail:
            if self.deliver_then_fail:
                self._real.send_message(**kwargs)
            raise ClientError(
                {"Error": {"Code": "RequestThrottled", "Message": "Rate exceeded"},
                 "ResponseMetadata": {"HTTPStatusCode": 400}},  # type: ignore[typeddict-item]  # as a test makes one: the stubs want a whole response's metadata
                "SendMessage",
            )
        return self._real.send_message(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture
def kube(aws: EmbeddedAws) -> Iterator[LocalKubernetes]:
    with LocalKubernetes(cluster_name=aws.config.cluster_name) as local:
        yield local


def agent_api(kube: LocalKubernetes) -> client.ApiClient:
    """The agent's own client: its ServiceAccount's token, so RBAC allows it what the shipped ClusterRole allows
    (the tests' `api` is the cluster admin, setting the scene)."""
    return kube.client(kube.service_account_token(AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT))


@pytest.fixture
def api(kube: LocalKubernetes) -> Iterator[client.ApiClient]:
    with kube.client() as api_client:
        yield api_client

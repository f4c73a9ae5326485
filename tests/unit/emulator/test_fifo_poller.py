"""The emulator's SQS event source mapping on a FIFO queue: what Lambda's parameters page allows, one receive per
batch, and exactly the records not reported failed deleted."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gpu_autoscaler.emulator.lambdas import Invocation
from gpu_autoscaler.emulator.pollers import QueuePoller
from gpu_autoscaler.wiring import FunctionWiring

URL = "https://sqs.us-east-1.amazonaws.com/123456789012/c-pending-pods.fifo"
ARN = "arn:aws:sqs:us-east-1:123456789012:c-pending-pods.fifo"


@dataclass
class FakeSqs:
    waiting: list[dict[str, Any]]
    receives: int = 0
    deleted: list[str] = field(default_factory=list)

    def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        self.receives += 1
        batch, self.waiting = self.waiting[:kwargs["MaxNumberOfMessages"]], self.waiting[kwargs["MaxNumberOfMessages"]:]
        return {"Messages": batch}

    def delete_message_batch(self, **kwargs: Any) -> dict[str, Any]:
        self.deleted += [e["ReceiptHandle"] for e in kwargs["Entries"]]
        return {"Successful": kwargs["Entries"]}


@dataclass
class FifoHost:
    """A function as `SqsFifoPartialProcessor` makes it answer: the first failure and every record after it."""

    fails: str

    def invoke(self, name: str, event: dict[str, Any], *, trigger: str, records: int) -> Invocation:
        ids = [r["messageId"] for r in event["Records"]]
        failed = ids[ids.index(self.fails):] if self.fails in ids else []
        return Invocation(function=name, trigger=trigger, records=records, started=datetime.now(UTC),
                          duration_ms=0.0, response={"batchItemFailures": [{"itemIdentifier": i} for i in failed]})


def message(n: int) -> dict[str, Any]:
    return {"MessageId": f"m{n}", "ReceiptHandle": f"h{n}", "Body": "{}", "MD5OfBody": "x",
            "Attributes": {"MessageGroupId": "c", "SequenceNumber": str(n)}}


def test_a_fifo_mapping_refuses_a_batching_window_and_a_batch_over_ten() -> None:
    for wiring in (FunctionWiring("packer", 60, 512, "pending-pods", batch_size=10, batching_window_seconds=5),
                   FunctionWiring("packer", 60, 512, "pending-pods", batch_size=11)):
        with pytest.raises(ValueError, match="FIFO queue's event source mapping"):
            QueuePoller(FifoHost("none"), FakeSqs([]), "pending-pods", URL, ARN, wiring)  # type: ignore[arg-type]


def test_a_fifo_batch_is_one_receive_and_what_follows_a_failure_stays_queued() -> None:
    sqs = FakeSqs([message(n) for n in range(1, 6)])
    wiring = FunctionWiring("packer", 60, 512, "pending-pods", batch_size=10)
    poller = QueuePoller(FifoHost("m3"), sqs, "pending-pods", URL, ARN, wiring)  # type: ignore[arg-type]
    poller.poll_once()
    assert sqs.receives == 1
    assert sqs.deleted == ["h1", "h2"]
    assert poller.stats.failed == 3

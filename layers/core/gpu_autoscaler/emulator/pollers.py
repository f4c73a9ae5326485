"""SQS event source mappings, played by the emulator: one poller per work queue.

What Lambda's pollers do, with the stack's settings (`gpu_autoscaler.wiring`):

- long-poll `ReceiveMessage` for up to the function's batch size (at most 10 per call), and with a batching
  window keep receiving until the batch is full or the window has passed;
- hand the function the SQS event built from the received messages (`sqs_events.sqs_event`);
- `ReportBatchItemFailures`: delete every record except those the response lists in `batchItemFailures`;
  an identifier that names no record of the batch, or a handler that raised, fails the whole batch;
- failed records are left alone: they become visible again after the queue's visibility timeout, and on
  the receive after `maxReceiveCount` deliveries SQS (moto too) moves them to the dead-letter queue.

FIFO queues (`.fifo`), as Lambda's "Lambda parameters for Amazon SQS event source mappings" page gives them: a
batch is at most 10 messages and there is no batching window (one receive per batch), so a batch is what SQS
hands over in group order. SQS itself holds back a group while any of its messages is in flight, so a group is
never in two batches at once however many workers poll. Lambda deletes exactly the records the function did
not report failed; keeping a group in order is the function's part (it must report the first failure and every
record after it: "Implementing partial batch responses", AWS Lambda developer guide).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.emulator.sqs_events import RECEIVE_ARGUMENTS, sqs_event

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.lambdas import Invocation, LambdaHost
    from gpu_autoscaler.wiring import FunctionWiring

__all__ = ["QueuePoller", "SQS_MAX_BATCH"]

log = logging.getLogger(__name__)

SQS_MAX_BATCH = 10
"""ReceiveMessage returns at most ten messages per call."""


@dataclass
class PollerStats:
    batches: int = 0
    received: int = 0
    deleted: int = 0
    failed: int = 0


@dataclass
class QueuePoller:
    """Feeds one queue's messages to one function until `stop` is set."""

    host: LambdaHost
    sqs: Any
    queue: str
    """The logical name (`pending-pods`, …): the trigger the host logs."""
    queue_url: str
    queue_arn: str
    wiring: FunctionWiring
    wait_seconds: int = 2
    """Long-poll wait per receive. Lambda waits 20 s; shorter keeps stopping quick and costs nothing here."""
    workers: int = 1
    """Concurrent receive-and-invoke loops (`run` is started this many times), as Lambda scales pollers out."""
    stats: PollerStats = field(default_factory=PollerStats)
    _busy: int = field(default=0, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.fifo and (self.wiring.batch_size > SQS_MAX_BATCH or self.wiring.batching_window_seconds > 0):
            # CreateEventSourceMapping refuses these for a FIFO queue; so does the emulator, naming the setting.
            raise ValueError(
                f"{self.wiring.name}: a FIFO queue's event source mapping takes a batch size of at most "
                f"{SQS_MAX_BATCH} and no batching window (given {self.wiring.batch_size}, "
                f"{self.wiring.batching_window_seconds} s)"
            )

    @property
    def fifo(self) -> bool:
        return self.queue_url.endswith(".fifo")

    @property
    def busy(self) -> bool:
        """A batch is received and not yet settled."""
        with self._lock:
            return self._busy > 0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll_once(stop)
            except (BotoCoreError, ClientError) as error:
                if stop.is_set():
                    return
                log.warning("poller %s: %s; retrying", self.queue, error)
                stop.wait(1.0)

    def poll_once(self, stop: threading.Event | None = None) -> Invocation | None:
        """Receive one batch and settle it; None when nothing arrived within the wait."""
        messages = self._receive(stop)
        if not messages:
            return None
        with self._lock:
            self._busy += 1
        try:
            return self._deliver(messages)
        finally:
            with self._lock:
                self._busy -= 1

    def _receive(self, stop: threading.Event | None) -> list[dict[str, Any]]:
        wanted = self.wiring.batch_size
        messages = self._receive_call(min(wanted, SQS_MAX_BATCH), self.wait_seconds)
        if not messages or self.fifo or self.wiring.batching_window_seconds <= 0:
            return messages
        deadline = time.monotonic() + self.wiring.batching_window_seconds
        while len(messages) < wanted and time.monotonic() < deadline and not (stop and stop.is_set()):
            wait = max(0, min(self.wait_seconds, int(deadline - time.monotonic())))
            messages += self._receive_call(min(wanted - len(messages), SQS_MAX_BATCH), wait)
        return messages

    def _receive_call(self, count: int, wait: int) -> list[dict[str, Any]]:
        response = self.sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=count, WaitTimeSeconds=wait, **RECEIVE_ARGUMENTS
        )
        return list(response.get("Messages", []))

    def _deliver(self, messages: list[dict[str, Any]]) -> Invocation:
        with self._lock:
            self.stats.batches += 1
            self.stats.received += len(messages)
        event = sqs_event(messages, self.queue_arn)
        invocation = self.host.invoke(self.wiring.name, event, trigger=self.queue, records=len(messages))
        failed = _failed_ids(invocation, {m["MessageId"] for m in messages})
        done = [m for m in messages if m["MessageId"] not in failed]
        with self._lock:
            self.stats.failed += len(messages) - len(done)
        for start in range(0, len(done), SQS_MAX_BATCH):
            chunk = done[start:start + SQS_MAX_BATCH]
            result = self.sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)],
            )
            with self._lock:
                self.stats.deleted += len(result.get("Successful", []))
            for failure in result.get("Failed", []):
                log.warning("poller %s: could not delete a processed message: %s", self.queue, failure)
        return invocation


def _failed_ids(invocation: Invocation, batch: set[str]) -> set[str]:
    """The message ids to keep: those reported failed, or the whole batch when the report is not usable."""
    if invocation.error is not None:
        return batch
    response = invocation.response
    if not isinstance(response, dict) or "batchItemFailures" not in response:
        return set()
    items = response["batchItemFailures"]
    if not isinstance(items, list):
        return batch
    ids = set()
    for item in items:
        identifier = item.get("itemIdentifier") if isinstance(item, dict) else None
        if not identifier or identifier not in batch:
            return batch  # Lambda: an invalid identifier fails the whole batch
        ids.add(identifier)
    return ids

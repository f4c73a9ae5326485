"""One message to the pending-pods FIFO queue, and the rules for trying again.

The sender makes a single attempt and says how it failed; the dispatcher decides when to try again, so a
slow or throttled queue never blocks the watch and a failed batch keeps its place until it is accepted.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from mypy_boto3_sqs import SQSClient

    from gpu_autoscaler_agent.batcher import Report

__all__ = ["MISCONFIGURED_CODES", "THROTTLING_CODES", "Backoff", "QueueSender", "SendFailed", "deduplication_id"]

THROTTLING_CODES = frozenset({
    "RequestThrottled",
    "ThrottlingException",
    "Throttling",
    "TooManyRequestsException",
    "KmsThrottled",
    "AWS.SimpleQueueService.RequestThrottled",
})
REJECTED_CODES = frozenset({
    "InvalidMessageContents",
    "AWS.SimpleQueueService.InvalidMessageContents",
    "InvalidParameterValue",
    "InvalidParameterValueException",
})
MISCONFIGURED_CODES = frozenset({
    "AWS.SimpleQueueService.NonExistentQueue",
    "QueueDoesNotExist",
    "AccessDenied",
    "AccessDeniedException",
    "KMS.AccessDeniedException",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
})
"""The queue, or AWS, refuses the agent itself: a queue URL that names no queue (or a queue of another region than
the client's), an identity without the stack's policy, no identity at all. Unlike throttling or an outage it never
passes by itself: someone has to fix the agent's configuration (SQS API reference, SendMessage and common errors)."""
_MAX_DEDUP_ID = 128


class SendFailed(Exception):
    """A send that did not go through; `rejected` means SQS refused this content and a retry cannot help;
    `misconfigured`, that it refuses the agent (`MISCONFIGURED_CODES`): retried, but only a fix makes it pass."""

    def __init__(self, message: str, code: str = "", *, throttled: bool = False, rejected: bool = False,
                 misconfigured: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.throttled = throttled
        self.rejected = rejected
        self.misconfigured = misconfigured


def deduplication_id(reports: Sequence[Report], window: int) -> str:
    """Pod uid + resourceVersion (a hash of them all for several pods), and the resync window.

    SQS drops a message whose id it saw in the last five minutes: so a retried send of the same batch is
    delivered once, while the next resync window (a new id) reports a still-pending pod again.
    """
    if len(reports) == 1:
        plain = f"{reports[0].uid}.{reports[0].resource_version}.{window}"
        if len(plain) <= _MAX_DEDUP_ID and plain.isascii() and plain.isprintable():
            return plain
    digest = hashlib.sha256()
    for uid, rv in sorted((r.uid, r.resource_version) for r in reports):
        digest.update(f"{uid}\0{rv}\n".encode())
    digest.update(f"window\0{window}".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Backoff:
    """Exponential with full jitter, capped: many agents throttled together do not retry in step."""

    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0
    jitter: Callable[[], float] = random.random

    def delay(self, attempt: int) -> float:
        """Seconds to wait before try number `attempt + 1` (attempt counts failures so far, from 1)."""
        ceiling = min(self.maximum, self.initial * self.factor ** max(attempt - 1, 0))
        return ceiling / 2 + ceiling / 2 * self.jitter()


class QueueSender:
    def __init__(self, sqs: SQSClient, queue_url: str, group_id: str) -> None:
        self._sqs = sqs
        self.queue_url = queue_url
        self.group_id = group_id

    def send(self, body: str, dedup_id: str) -> str:
        """The message id; raises SendFailed."""
        try:
            response = self._sqs.send_message(
                QueueUrl=self.queue_url,
                MessageBody=body,
                MessageGroupId=self.group_id,
                MessageDeduplicationId=dedup_id,
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            raise SendFailed(
                f"SendMessage failed: {code}: {error}",
                code,
                throttled=code in THROTTLING_CODES,
                rejected=code in REJECTED_CODES,
                misconfigured=code in MISCONFIGURED_CODES,
            ) from error
        except BotoCoreError as error:  # connection refused, timeouts, endpoint errors: try again later
            raise SendFailed(f"SendMessage failed: {error}", type(error).__name__) from error
        return response["MessageId"]

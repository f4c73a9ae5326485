"""A queue's dead-letter queue, written to directly for a message that can never succeed.

SQS moves a message to the DLQ only after `maxReceiveCount` failed deliveries. On a FIFO queue each of those
holds back every later message of its group (the consumer must stop at the first failure), and the messages
behind it are returned unprocessed each time, their own receive counts rising. A message that cannot ever be
processed (it does not parse) is therefore sent to the DLQ by its consumer at once, with the reason as a
message attribute, and acknowledged: nothing is lost and the group moves on.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SqsDeadLetters"]

_REASON_LIMIT = 1024


class SqsDeadLetters:
    def __init__(self, sqs_client: Any, queue_url: str) -> None:
        self._sqs = sqs_client
        self.queue_url = queue_url

    def send(self, body: str, reason: str, *, message_id: str, group_id: str | None) -> None:
        """`message_id`: the source message's (kept as an attribute, and the FIFO deduplication id)."""
        params: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MessageBody": body,
            "MessageAttributes": {
                "reason": {"DataType": "String", "StringValue": reason[:_REASON_LIMIT] or "unknown"},
                "sourceMessageId": {"DataType": "String", "StringValue": message_id},
            },
        }
        if self.queue_url.endswith(".fifo"):
            params["MessageGroupId"] = group_id or "dead-letters"
            params["MessageDeduplicationId"] = message_id
        self._sqs.send_message(**params)

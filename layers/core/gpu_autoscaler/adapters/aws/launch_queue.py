"""The launch queue: packer, interruption and prewarm hand stored NodeClaims to the fleet function here.

A `LaunchRequest` only names claim ids (the claims themselves are in the table), so a redelivered or
duplicated message acts on each claim's current state and never launches twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_autoscaler.errors import GpuAutoscalerError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpu_autoscaler.models.messages import LaunchRequest

__all__ = ["SQS_SEND_BATCH", "LaunchNotSent", "SqsLaunchQueue"]

SQS_SEND_BATCH = 10
"""SendMessageBatch takes up to ten messages (SQS API reference, SendMessageBatch)."""


class LaunchNotSent(GpuAutoscalerError):
    """SQS refused some launch requests of a batch: the caller's message is retried, and the claims it stored
    are found again and their requests sent again (the fleet acts on a claim's state, so a repeat is harmless)."""


class SqsLaunchQueue:
    """`LaunchQueue` over the standard SQS launch queue."""

    def __init__(self, sqs_client: Any, queue_url: str) -> None:
        self._sqs = sqs_client
        self.queue_url = queue_url

    def send(self, request: LaunchRequest) -> None:
        self.send_many([request])

    def send_many(self, requests: Sequence[LaunchRequest]) -> None:
        """SendMessageBatch, ten at a time; entries it reports failed are sent once more, then raise."""
        for start in range(0, len(requests), SQS_SEND_BATCH):
            entries = [{
                "Id": str(n),
                "MessageBody": request.model_dump_json(by_alias=True, exclude_none=True),
                "MessageAttributes": {"cluster": {"DataType": "String", "StringValue": request.cluster}},
            } for n, request in enumerate(requests[start:start + SQS_SEND_BATCH])]
            for attempt in range(2):
                failed = self._sqs.send_message_batch(QueueUrl=self.queue_url, Entries=entries).get("Failed") or []
                if not failed:
                    break
                if attempt == 1:
                    raise LaunchNotSent("SQS refused launch requests: " + "; ".join(
                        f"{f.get('Code')} {f.get('Message', '')}".strip() for f in failed))
                ids = {f["Id"] for f in failed}
                entries = [e for e in entries if e["Id"] in ids]

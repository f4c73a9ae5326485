"""The launch queue: packer, interruption and prewarm hand stored NodeClaims to the fleet function here.

A `LaunchRequest` only names claim ids (the claims themselves are in the table), so a redelivered or
duplicated message acts on each claim's current state and never launches twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_autoscaler.models.messages import LaunchRequest

__all__ = ["SqsLaunchQueue"]


class SqsLaunchQueue:
    """`LaunchQueue` over the standard SQS launch queue."""

    def __init__(self, sqs_client: Any, queue_url: str) -> None:
        self._sqs = sqs_client
        self.queue_url = queue_url

    def send(self, request: LaunchRequest) -> None:
        self._sqs.send_message(
            QueueUrl=self.queue_url,
            MessageBody=request.model_dump_json(by_alias=True, exclude_none=True),
            MessageAttributes={"cluster": {"DataType": "String", "StringValue": request.cluster}},
        )

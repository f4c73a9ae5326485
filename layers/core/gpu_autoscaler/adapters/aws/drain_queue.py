"""The drain queue: interruption and consolidation ask for drains here, and the drain function re-enqueues its
own progress here with a delay, so a drain outlives any one invocation and nothing is lost if one dies."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import timedelta

    from gpu_autoscaler.models.messages import DrainRequest

__all__ = ["MAX_DELAY_SECONDS", "SqsDrainQueue"]

MAX_DELAY_SECONDS = 900


class SqsDrainQueue:
    """`DrainQueue` over the standard SQS drain queue."""

    def __init__(self, sqs_client: Any, queue_url: str) -> None:
        self._sqs = sqs_client
        self.queue_url = queue_url

    def send(self, request: DrainRequest, delay: timedelta | None = None) -> None:
        seconds = 0 if delay is None else math.ceil(delay.total_seconds())
        self._sqs.send_message(
            QueueUrl=self.queue_url,
            MessageBody=request.model_dump_json(by_alias=True, exclude_none=True),
            DelaySeconds=min(max(seconds, 0), MAX_DELAY_SECONDS),
            MessageAttributes={"cluster": {"DataType": "String", "StringValue": request.cluster}},
        )

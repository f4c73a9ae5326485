"""Every queue of the pipeline, each with its dead-letter queue, so a poison message is kept and never dropped."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from aws_cdk import Duration
from aws_cdk import aws_sqs as sqs
from cdk_nag import NagSuppressions
from constructs import Construct

from gpu_autoscaler.wiring import FIFO_QUEUE, MAX_RECEIVE_COUNT, VISIBILITY_FACTOR

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.naming import ResourceNames

__all__ = ["DLQ_RETENTION", "MAX_RECEIVE_COUNT", "VISIBILITY_FACTOR", "WorkQueue", "WorkQueues"]

DLQ_RETENTION = Duration.days(14)
"""The longest SQS keeps anything: time for someone to look at a poison message and redrive it."""


class WorkQueue(StrEnum):
    """The queues that carry work to a function (the keys of `WorkQueues.queues`)."""

    PENDING_PODS = "pending-pods"
    INTERRUPTION = "interruption"
    LAUNCH = "launch"
    DRAIN = "drain"


class WorkQueues(Construct):
    """The four work queues with their DLQs, plus the DLQ that catches failed schedule deliveries."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        names: ResourceNames,
        consumer_timeouts: Mapping[WorkQueue, Duration],
    ) -> None:
        super().__init__(scope, construct_id)
        queue_names = {
            WorkQueue.PENDING_PODS: (names.pending_pods_queue, names.pending_pods_dlq),
            WorkQueue.INTERRUPTION: (names.interruption_queue, names.interruption_dlq),
            WorkQueue.LAUNCH: (names.launch_queue, names.launch_dlq),
            WorkQueue.DRAIN: (names.drain_queue, names.drain_dlq),
        }
        self.queues: dict[WorkQueue, sqs.Queue] = {}
        self.dead_letter_queues: dict[WorkQueue, sqs.Queue] = {}
        for kind, (queue_name, dlq_name) in queue_names.items():
            # The agent sets a deduplication id per document, so content-based deduplication stays off.
            fifo = kind.value == FIFO_QUEUE
            construct = "".join(part.title() for part in kind.value.split("-"))
            dlq = _queue(self, f"{construct}Dlq", dlq_name, fifo=fifo, retention_period=DLQ_RETENTION)
            self.dead_letter_queues[kind] = dlq
            self.queues[kind] = _queue(
                self,
                f"{construct}Queue",
                queue_name,
                fifo=fifo,
                visibility_timeout=Duration.seconds(consumer_timeouts[kind].to_seconds() * VISIBILITY_FACTOR),
                dead_letter_queue=sqs.DeadLetterQueue(queue=dlq, max_receive_count=MAX_RECEIVE_COUNT),
            )
        self.scheduler_dlq = _queue(
            self, "SchedulerDlq", names.scheduler_dlq, fifo=False, retention_period=DLQ_RETENTION
        )
        NagSuppressions.add_resource_suppressions(
            self.scheduler_dlq,
            [{
                "id": "AwsSolutions-SQS3",
                "reason": "This queue is itself a dead-letter queue: of the EventBridge Scheduler schedules and of the "
                "asynchronous invocations of the scheduled functions, neither of which is an SQS redrive policy.",
            }],
        )  # fmt: skip

    @property
    def all_dead_letter_queues(self) -> dict[str, sqs.Queue]:
        """Every DLQ by a short label, for alarms and the dashboard."""
        labelled: dict[str, sqs.Queue] = {kind.value: dlq for kind, dlq in self.dead_letter_queues.items()}
        labelled["scheduler"] = self.scheduler_dlq
        return labelled


def _queue(scope: Construct, construct_id: str, name: str, *, fifo: bool, **props: object) -> sqs.Queue:
    return sqs.Queue(
        scope,
        construct_id,
        queue_name=name,
        fifo=fifo or None,
        content_based_deduplication=False if fifo else None,
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        **props,  # type: ignore[arg-type]
    )

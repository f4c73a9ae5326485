"""SQS receives side by side: the Lambda pollers of one queue (Lambda runs five and more at once on a standard
queue; the emulator up to three) receiving while messages reach their queue's maxReceiveCount.

SQS moves a message past its maxReceiveCount to the dead-letter queue once ("When the ReceiveCount for a message
exceeds the maxReceiveCount for a queue, Amazon SQS moves the message to the dead-letter queue", SQS API
reference, SetQueueAttributes RedrivePolicy) and hands a message to one receiver at a time until its visibility
timeout ends ("Amazon SQS visibility timeout", SQS developer guide). moto's `receive_message` walks the queue with no
lock: two receives that both found a message past its maxReceiveCount both moved it, and the second failed with
`list.remove(x): x not in list`, an HTTP 500 to its poller (met in the chaos soak's 100 Spot warnings, where 69
notices were dead-lettered while three pollers received; this test failed so 3 times of 3 while a receive took
350 ms, `moto_fixes._retention_read_from_the_queue`); and two receives took the same visible message, so the first
receiver's handle was no longer valid, or a message was marked received that no receiver was handed, left in
flight. Once receives were fast, this test without the lock failed in 5 of 9 runs of one round (10–20 of 150
messages left in flight, in 2 runs two handed out twice at once); it runs three rounds.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws

MESSAGES = 100
RECEIVERS = 4
ROUNDS = 3


def _sqs(aws: EmbeddedAws) -> Any:
    return boto3.client("sqs", endpoint_url=aws.endpoint_url, region_name=aws.config.region,
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=BotoConfig(retries={"max_attempts": 1, "mode": "standard"}))


def _race(aws: EmbeddedAws, name: str) -> None:
    sqs = _sqs(aws)
    dlq = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue = sqs.create_queue(QueueName=name, Attributes={
        "VisibilityTimeout": "0",  # a received message is visible again at once: the next receive finds it
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})})["QueueUrl"]
    for start in range(0, MESSAGES, 10):
        sqs.send_message_batch(QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": f"m{start + i}"}
                                                        for i in range(10)])
    errors: list[str] = []
    received: list[str] = []
    lock = threading.Lock()

    def receiver() -> None:
        client = _sqs(aws)
        for _ in range(20):
            try:
                batch = client.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                               VisibilityTimeout=30).get("Messages", [])
                for message in batch:  # handed back at once: the next receive counts another delivery
                    # ReceiptHandleIsInvalid here: another receiver was handed the same message meanwhile.
                    client.change_message_visibility(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"],
                                                     VisibilityTimeout=0)
            except ClientError as error:
                with lock:
                    errors.append(str(error))
                continue
            with lock:
                received.extend(m["Body"] for m in batch)

    threads = [threading.Thread(target=receiver) for _ in range(RECEIVERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors, errors[:3]
    counts = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    assert counts["ApproximateNumberOfMessagesNotVisible"] == "0", "messages no receiver was handed, left in flight"
    dead: list[str] = []
    while batch := sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10).get("Messages", []):
        dead.extend(m["Body"] for m in batch)
        sqs.delete_message_batch(QueueUrl=dlq, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                                                        for i, m in enumerate(batch)])
    assert sorted(dead) == sorted(set(dead)), "a message dead-lettered twice"
    assert len(dead) + int(counts["ApproximateNumberOfMessages"]) == MESSAGES
    assert all(received.count(body) <= 2 for body in set(received)), "handed out past maxReceiveCount"


def test_receivers_side_by_side_dead_letter_each_message_once_and_hand_none_out_twice(aws: EmbeddedAws) -> None:
    for round_ in range(ROUNDS):
        _race(aws, f"race-{round_}")


def test_a_message_past_its_queues_retention_period_is_never_handed_out(aws: EmbeddedAws) -> None:
    """The retention check a receive makes reads the queue's period straight (`moto_fixes`), as it must still
    refuse: "Amazon SQS automatically deletes messages that have been in a queue for more than the maximum message
    retention period" (SQS developer guide, "Amazon SQS message quotas")."""
    from moto.sqs.models import sqs_backends

    sqs = _sqs(aws)
    old, fresh = (sqs.create_queue(QueueName=name, Attributes={"MessageRetentionPeriod": "60"})["QueueUrl"]
                  for name in ("retained-old", "retained-fresh"))
    for url in (old, fresh):
        sqs.send_message(QueueUrl=url, MessageBody="m")
    account = aws.clients.client("sts").get_caller_identity()["Account"]
    backend = sqs_backends[account][aws.config.region]
    kept = backend.get_queue("retained-old")._messages
    assert len(kept) == 1
    message: Any = kept[0]
    message.sent_timestamp -= 61_000  # sent 61 s earlier: past the 60 s period
    assert sqs.receive_message(QueueUrl=old, WaitTimeSeconds=0).get("Messages", []) == []
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=fresh, WaitTimeSeconds=0)["Messages"]] == ["m"]

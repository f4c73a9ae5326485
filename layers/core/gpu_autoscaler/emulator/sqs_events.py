"""Lambda's SQS event, built from messages as ReceiveMessage returns them.

An event source mapping hands a function `{"Records": [...]}` with camelCase keys and string
attributes; building it from real received messages keeps the emulator's deliveries and the samples
in `events/` in exactly the shape Lambda uses.
"""

from __future__ import annotations

import base64
from typing import Any

__all__ = ["RECEIVE_ARGUMENTS", "lambda_record", "sqs_event"]

RECEIVE_ARGUMENTS: dict[str, Any] = {
    "MessageSystemAttributeNames": ["All"],
    "MessageAttributeNames": ["All"],
}
"""Pass to ReceiveMessage so the messages carry everything a Lambda record holds."""

_SYSTEM_ATTRIBUTES = (
    "ApproximateReceiveCount", "SentTimestamp", "SenderId", "ApproximateFirstReceiveTimestamp",
    "SequenceNumber", "MessageGroupId", "MessageDeduplicationId", "AWSTraceHeader", "DeadLetterQueueSourceArn",
)


def lambda_record(message: dict[str, Any], queue_arn: str) -> dict[str, Any]:
    """One record of the Lambda SQS event for a message from ReceiveMessage (with `RECEIVE_ARGUMENTS`)."""
    region = queue_arn.split(":")[3]
    attributes = message.get("Attributes", {})
    record: dict[str, Any] = {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": {k: str(attributes[k]) for k in _SYSTEM_ATTRIBUTES if k in attributes},
        "messageAttributes": {
            name: _message_attribute(value) for name, value in message.get("MessageAttributes", {}).items()
        },
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    }
    if "MD5OfMessageAttributes" in message:
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    return record


def sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    return {"Records": [lambda_record(m, queue_arn) for m in messages]}


def _message_attribute(value: dict[str, Any]) -> dict[str, Any]:
    converted: dict[str, Any] = {
        "stringListValues": value.get("StringListValues", []),
        "binaryListValues": [_b64(b) for b in value.get("BinaryListValues", [])],
        "dataType": value["DataType"],
    }
    if "StringValue" in value:
        converted["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        converted["binaryValue"] = _b64(value["BinaryValue"])
    return converted


def _b64(data: bytes | str) -> str:
    """Lambda carries binary attributes base64-encoded; boto3 hands them over decoded."""
    return data if isinstance(data, str) else base64.b64encode(data).decode("ascii")

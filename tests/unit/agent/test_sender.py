from __future__ import annotations

from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber

from gpu_autoscaler_agent.batcher import Report
from gpu_autoscaler_agent.sender import Backoff, QueueSender, SendFailed, deduplication_id

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/ml-prod-gpu-autoscaler-pending-pods.fifo"


def report(uid: str, rv: str) -> Report:
    return Report.of({"uid": uid, "name": uid, "requests": {}}, rv)


@pytest.fixture
def sqs() -> SQSClient:
    return boto3.client("sqs", region_name="us-east-1")


def test_one_pod_keeps_its_uid_and_resource_version_in_the_id() -> None:
    assert deduplication_id([report("6f1c", "812")], 7) == "6f1c.812.7"


def test_several_pods_hash_to_the_same_id_in_any_order() -> None:
    a, b = report("a", "1"), report("b", "2")
    assert deduplication_id([a, b], 1) == deduplication_id([b, a], 1)
    assert len(deduplication_id([a, b], 1)) == 64


def test_the_id_changes_with_any_version_and_with_the_window() -> None:
    base = deduplication_id([report("a", "1"), report("b", "2")], 1)
    assert base != deduplication_id([report("a", "1"), report("b", "3")], 1)
    assert base != deduplication_id([report("a", "1"), report("b", "2")], 2)


def test_an_overlong_single_id_is_hashed() -> None:
    assert len(deduplication_id([report("u" * 120, "123456789")], 1)) == 64


def test_a_message_goes_to_the_cluster_group_with_the_id(sqs: SQSClient) -> None:
    stubber = Stubber(sqs)
    stubber.add_response(
        "send_message",
        {"MessageId": "m-1", "MD5OfMessageBody": "x"},
        {"QueueUrl": QUEUE, "MessageBody": "{}", "MessageGroupId": "ml-prod", "MessageDeduplicationId": "d-1"},
    )
    with stubber:
        assert QueueSender(sqs, QUEUE, "ml-prod").send("{}", "d-1") == "m-1"
    stubber.assert_no_pending_responses()


@pytest.mark.parametrize(
    ("code", "throttled", "rejected", "misconfigured"),
    [("RequestThrottled", True, False, False), ("ThrottlingException", True, False, False),
     ("InvalidMessageContents", False, True, False), ("AccessDenied", False, False, True),
     ("AWS.SimpleQueueService.NonExistentQueue", False, False, True), ("InternalError", False, False, False)],
)
def test_failures_say_whether_they_were_throttling_a_refusal_or_the_agents_configuration(
    sqs: SQSClient, code: str, throttled: bool, rejected: bool, misconfigured: bool
) -> None:
    stubber = Stubber(sqs)
    stubber.add_client_error("send_message", service_error_code=code, http_status_code=400)
    with stubber, pytest.raises(SendFailed) as caught:
        QueueSender(sqs, QUEUE, "ml-prod").send("{}", "d-1")
    failed = caught.value
    assert (failed.code, failed.throttled, failed.rejected, failed.misconfigured) == (
        code, throttled, rejected, misconfigured)


class Unreachable:
    def send_message(self, **kwargs: object) -> dict[str, str]:
        raise EndpointConnectionError(endpoint_url="http://sqs.invalid")


def test_an_unreachable_endpoint_is_a_retryable_failure() -> None:
    with pytest.raises(SendFailed) as caught:
        QueueSender(Unreachable(), QUEUE, "ml-prod").send("{}", "d-1")  # type: ignore[arg-type]
    assert caught.value.code == "EndpointConnectionError" and not caught.value.rejected


def test_backoff_grows_to_its_cap_with_jitter_inside_bounds() -> None:
    low = Backoff(initial=0.2, maximum=5.0, jitter=lambda: 0.0)
    high = Backoff(initial=0.2, maximum=5.0, jitter=lambda: 1.0)
    assert [low.delay(n) for n in (1, 2, 3)] == [0.1, 0.2, 0.4]
    assert [high.delay(n) for n in (1, 2, 3)] == [0.2, 0.4, 0.8]
    assert high.delay(30) == 5.0 and low.delay(30) == 2.5

"""The emulator's Lambda side against real queues: pollers, partial batch failures, redrive, schedules.

One embedded AWS for the module; the pending-pods queue gets a one-second visibility timeout, so a failed
document is retried within seconds (the other queues keep the stack's: a launch still in progress must not
be delivered again). The pipeline runtime drives the real handlers.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.domain.fleet import TAG_GANG
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.runtime import PipelineRuntime
from gpu_autoscaler.emulator.triggers import read_schedules
from gpu_autoscaler.wiring import RATE_SCHEDULES, schedule_name
from tests.conftest import ROOT, example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.emulator.lambdas import Invocation

DOCUMENT: dict[str, Any] = json.loads((ROOT / "events" / "pending-pods-document.json").read_text())


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    with EmbeddedAws(parse_config(example_config_data())) as embedded:
        embedded.clients.client("sqs").set_queue_attributes(
            QueueUrl=embedded.queue_url("pending-pods"), Attributes={"VisibilityTimeout": "1"}
        )
        yield embedded


@pytest.fixture(scope="module")
def runtime(aws: EmbeddedAws) -> Iterator[PipelineRuntime]:
    with PipelineRuntime(aws, poll_wait_seconds=1) as running:
        yield running


def _send_document(aws: EmbeddedAws, body: str) -> None:
    aws.clients.client("sqs").send_message(
        QueueUrl=aws.queue_url("pending-pods"), MessageBody=body, MessageGroupId=aws.config.cluster_name,
        MessageDeduplicationId=str(uuid.uuid4()),
    )


def _document(*, pods: slice) -> str:
    return json.dumps({**DOCUMENT, "pods": DOCUMENT["pods"][pods]})


def test_a_poison_message_lands_in_the_dlq_at_once_while_the_rest_flows(
    aws: EmbeddedAws, runtime: PipelineRuntime
) -> None:
    """A document that can never parse is dead-lettered by the packer itself, with its reason, so the cluster's
    FIFO group is not held back for maxReceiveCount deliveries; the documents around it are packed."""
    seen: list[Invocation] = []
    runtime.on_invocation(seen.append)
    poison = '{"schemaVersion": 1, "cluster": "ml-prod", "pods": "not a list"}'
    _send_document(aws, _document(pods=slice(0, 1)))
    _send_document(aws, poison)
    _send_document(aws, _document(pods=slice(2, 10)))

    assert runtime.wait_until(lambda: runtime.queue_depths()["pending-pods-dlq"][0] == 1, timeout=60)
    pending = runtime.pollers["pending-pods"]
    assert runtime.wait_until(lambda: sum(runtime.queue_depths()["pending-pods"]) == 0 and not pending.busy, 30)

    letters = runtime.dead_letters()
    assert [(d.queue, d.body) for d in letters] == [("pending-pods-dlq", poison)]
    packer = [i for i in seen if i.function == "packer"]
    assert sum(i.failures for i in packer) == 0  # nothing handed back: the poison was dead-lettered on first sight
    assert sum(i.records for i in packer) == 3 and pending.stats.deleted == 3
    # The rest flowed on: the gang's claim was launched by the fleet function, tagged with its gang.
    gang_name = DOCUMENT["pods"][2]["podGroup"]["name"]
    assert runtime.wait_until(lambda: any(
        i.tags.get(TAG_GANG, "").endswith(gang_name) for i in runtime.instances.instances().values()
    ), timeout=60), "\n".join(i.line() for i in seen)


def test_the_stack_schedules_are_stored_and_fired_with_their_input(aws: EmbeddedAws,
                                                                   runtime: PipelineRuntime) -> None:
    stored = {s.name: s for s in read_schedules(aws.clients, aws.names)}
    window = aws.config.scaling_windows[0]
    assert set(stored) == {schedule_name(window.name)} | {r.name for r in RATE_SCHEDULES}
    assert stored[schedule_name(window.name)].timezone == window.timezone
    invocation = runtime.scheduler.fire("prewarm-rate")
    assert invocation.function == "prewarm"
    assert invocation.error is None, invocation.error
    assert invocation.trigger == "schedule prewarm-rate"
    assert set(invocation.response) >= {"launched", "released"} or invocation.response


def test_rate_schedules_run_faster_by_the_speed_factor(aws: EmbeddedAws) -> None:
    fast = PipelineRuntime(aws, speed=60)
    times = fast.scheduler.next_times()
    slow = PipelineRuntime(aws).scheduler.next_times()
    for rate in RATE_SCHEDULES:
        if rate.name in times:
            compressed = times[rate.name]
            normal = slow[rate.name]
            assert compressed is not None and normal is not None
            assert compressed < normal

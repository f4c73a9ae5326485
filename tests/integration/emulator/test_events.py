"""Every sample in `events/` is in the shape its function receives, and parses with the models that read it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel, SqsModel

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.domain.interruption import STOPPED_STATES, NoticeKind, parse_notice
from gpu_autoscaler.event_patterns import INTERRUPTION_RULES, matches
from gpu_autoscaler.models.messages import DrainRequest, LaunchRequest, ScheduleTick
from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler.naming import FUNCTIONS, ResourceNames
from tests.conftest import example_config_data

EVENTS = Path(__file__).resolve().parents[3] / "events"
NAMES = ResourceNames("ml-prod")
TRIGGER_QUEUES = {
    "packer": NAMES.pending_pods_queue, "interruption": NAMES.interruption_queue,
    "fleet": NAMES.launch_queue, "drain": NAMES.drain_queue,
}
INTERRUPTIONS = {
    # interruption-<what>.json: (its raw EventBridge file, the rule that admits it)
    "spot-warning": ("spot-interruption-warning", "spot-interruption"),
    "rebalance": ("rebalance-recommendation", "rebalance"),
    "state-change": ("state-change", "state-change"),
    "reservation-warning": ("capacity-reservation-interruption-warning", "reservation-interruption"),
    "scheduled-change": ("health-scheduled-change", "scheduled-change"),
    "capacity-block-expiry": ("capacity-block-expiration-warning", "capacity-block-expiry"),
}


def load(name: str) -> Any:
    return json.loads((EVENTS / name).read_text())


def sample_files() -> list[str]:
    return sorted(p.name for p in EVENTS.glob("*.json"))


def sqs_files() -> list[str]:
    return [n for n in sample_files() if n.split("-")[0] in TRIGGER_QUEUES]


def test_every_function_has_a_sample_and_every_sample_is_known() -> None:
    files = sample_files()
    for function in FUNCTIONS:
        assert any(name.startswith(function + "-") for name in files), function
    known = {"pending-pods-document.json"}
    assert all(n.split("-")[0] in (*FUNCTIONS, "eventbridge") or n in known for n in files), files


@pytest.mark.parametrize("name", sqs_files())
def test_sqs_samples_are_lambda_sqs_events_from_their_trigger_queue(name: str) -> None:
    event = load(name)
    parsed = SqsModel.model_validate(event)
    queue = TRIGGER_QUEUES[name.split("-")[0]]
    for record, raw in zip(parsed.Records, event["Records"], strict=True):
        assert record.eventSourceARN == f"arn:aws:sqs:us-east-1:123456789012:{queue}"
        assert raw["md5OfBody"] == hashlib.md5(raw["body"].encode()).hexdigest()
        fifo = queue.endswith(".fifo")
        assert (record.attributes.MessageGroupId is not None) is fifo
        assert (record.attributes.MessageDeduplicationId is not None) is fifo


def test_packer_sample_carries_the_pending_pods_document() -> None:
    [record] = load("packer-pending-pods.json")["Records"]
    document = PendingPodsDocument.model_validate_json(record["body"])
    assert json.loads(record["body"]) == load("pending-pods-document.json")
    assert record["attributes"]["MessageGroupId"] == document.cluster == "ml-prod"
    pods = {pod.name: pod for pod in document.pods}
    assert pods["llm-serve-6c9d7f8b5-q2x7k"].resources.gpus == 1
    assert pods["jupyter-ana-0"].node_selector == {"karpenter.sh/nodepool": "gpu-shared"}
    gang = [pod for pod in document.pods if pod.gang == "training/train-42"]
    assert len(gang) == 8 == gang[0].pod_group.min_member  # type: ignore[union-attr]
    assert all(pod.do_not_disrupt for pod in gang)
    assert len({pod.uid for pod in document.pods}) == len(document.pods) == 10


@pytest.mark.parametrize("what", sorted(INTERRUPTIONS))
def test_interruption_samples_deliver_the_eventbridge_event_their_rule_admits(what: str) -> None:
    raw_name, rule = INTERRUPTIONS[what]
    [record] = load(f"interruption-{what}.json")["Records"]
    event = json.loads(record["body"])
    assert event == load(f"eventbridge-{raw_name}.json")
    assert [name for name, pattern in INTERRUPTION_RULES.items() if matches(pattern, event)] == [rule]
    notice = parse_notice(event)
    assert notice.kind is NoticeKind(rule)
    assert all(instance.startswith("i-") for instance in notice.instance_ids)
    assert bool(notice.instance_ids) != bool(notice.reservation_id)  # instances, or the reservation they run in


@pytest.mark.parametrize("name", [n for n in sample_files() if n.startswith("eventbridge-")])
def test_raw_eventbridge_samples_are_eventbridge_events(name: str) -> None:
    event = load(name)
    parsed = EventBridgeModel.model_validate(event)
    assert parsed.account == "123456789012" and parsed.region == "us-east-1"


@pytest.mark.parametrize("state", sorted(STOPPED_STATES | {"pending", "running"}))
def test_the_state_change_rule_admits_exactly_the_stopping_states(state: str) -> None:
    event = load("eventbridge-state-change.json")
    event["detail"]["state"] = state
    assert matches(INTERRUPTION_RULES["state-change"], event) is (state in STOPPED_STATES)


def test_launch_and_drain_samples_carry_their_messages() -> None:
    [launch] = load("fleet-launch-request.json")["Records"]
    request = LaunchRequest.model_validate_json(launch["body"])
    assert request.cluster == "ml-prod" and request.claim_ids and request.gang == "training/train-42"
    [drain] = load("drain-request.json")["Records"]
    order = DrainRequest.model_validate_json(drain["body"])
    spot = load("eventbridge-spot-interruption-warning.json")
    assert order.instance_id == spot["detail"]["instance-id"]
    assert order.involuntary and order.deadline > parse_notice(spot).time


def test_schedule_samples_are_ticks_naming_configured_windows() -> None:
    windows = {w.name for w in parse_config(example_config_data()).scaling_windows}
    window = ScheduleTick.model_validate(load("prewarm-window.json"))
    assert window.trigger == "window" and window.window in windows
    for name in ("prewarm-rate.json", "consolidate-rate.json"):
        tick = ScheduleTick.model_validate(load(name))
        assert tick.trigger == "rate" and tick.window is None and tick.scheduled_time is not None

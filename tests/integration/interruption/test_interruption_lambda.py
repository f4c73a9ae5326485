"""Each sample event in `events/`, put on moto's EventBridge bus, routed by the stack's rules to the interruption
queue and handled by the interruption Lambda; the drains it asks for run through the drain Lambda, the
replacements through the fleet Lambda, the cluster is the local Kubernetes API reached with an EKS token."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain import drain as drain_domain
from gpu_autoscaler.domain.drain import DRAIN_TAINT
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.messages import DrainRequest
from tests.conftest import ROOT
from tests.emf import metric_values
from tests.integration.interruption.conftest import (
    DO_NOT_DISRUPT,
    bind_pod,
    drain_queue,
    event_body,
    instance_state,
    invoke,
    join,
    launch_all,
    launch_node,
    receive,
)

if TYPE_CHECKING:
    from types import ModuleType

    import pytest
    from kubernetes import client

    from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
    from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes


def put_event(aws: EmbeddedAws, event: dict[str, Any]) -> None:
    """Onto the default bus, as AWS puts it; the stack's rules route it to the interruption queue."""
    answer = aws.clients.client("events").put_events(Entries=[{
        "Source": event["source"], "DetailType": event["detail-type"], "Detail": json.dumps(event["detail"]),
        "Resources": event["resources"],
    }])
    assert answer["FailedEntryCount"] == 0


def handle_interruptions(aws: EmbeddedAws, interruption: ModuleType) -> dict[str, Any]:
    messages = receive(aws, "interruption", wait=1)
    assert messages, "the rule routed nothing to the interruption queue"
    response = invoke(aws, interruption, "interruption", "interruption", messages)
    assert response == {"batchItemFailures": []}
    return response


def drain_requests(aws: EmbeddedAws) -> list[DrainRequest]:
    return [DrainRequest.model_validate_json(m["Body"]) for m in drain_queue(aws, "drain")]


def run_drain(aws: EmbeddedAws, drain: ModuleType, request: DrainRequest, timeout_seconds: float = 60.0) -> None:
    """One drain invocation; with `timeout_seconds` just over the handler's margin it never waits in place."""
    aws.clients.client("sqs").send_message(QueueUrl=aws.queue_url("drain"),
                                           MessageBody=request.model_dump_json(by_alias=True))
    response = invoke(aws, drain, "drain", "drain", receive(aws, "drain", wait=1), timeout_seconds)
    assert response == {"batchItemFailures": []}


def continued(aws: EmbeddedAws) -> DrainRequest:
    """The drain's own continuation, once its delay has passed."""
    messages = receive(aws, "drain", wait=3)
    assert len(messages) == 1
    aws.clients.client("sqs").delete_message(QueueUrl=aws.queue_url("drain"),
                                             ReceiptHandle=messages[0]["ReceiptHandle"])
    return DrainRequest.model_validate_json(messages[0]["Body"])


def node_of(cluster: KubernetesCluster, name: str | None) -> Any:
    return next((n for n in cluster.list_nodes() if n.name == name), None)


def test_spot_warning_replaces_first_then_drains_the_node_away(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, cluster: KubernetesCluster,
        core: client.CoreV1Api, fleet: ModuleType, interruption: ModuleType, drain: ModuleType) -> None:
    old = launch_node(aws, fleet, kube, store, "gpu-burst-spot-old")
    assert old.instance_id and old.node_name
    bind_pod(core, old.node_name, "infer-0")
    bind_pod(core, old.node_name, "train-0", annotations=DO_NOT_DISRUPT)

    # AWS takes the instance a few seconds from now (not two minutes: the test runs in real time), so the
    # drain's deadline has come at once: what is left is deleted, and the instance goes at the action time.
    action = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4)
    put_event(aws, event_body("spot-interruption-warning", old.instance_id,
                              **{"instance-action-time": action.strftime("%Y-%m-%dT%H:%M:%SZ")}))
    handle_interruptions(aws, interruption)

    node = node_of(cluster, old.node_name)
    assert node.unschedulable and DRAIN_TAINT in node.taints  # cordoned at once
    claim = store.get_claim(old.id)
    assert claim is not None and claim.state is ClaimState.DRAINING
    assert (old.instance_type, old.zone, "spot") in store.unavailable_offerings()
    launches = launch_all(aws, fleet)  # the replacement goes out before the drain has even run
    replacements = [store.get_claim(i) for r in launches for i in r.claim_ids]
    assert replacements and all(c is not None and c.state is ClaimState.LAUNCHED for c in replacements)
    pod_uids = {p.uid for p in cluster.list_pods(old.node_name) if p.owner_kind != "DaemonSet"}
    assert {u for c in replacements if c is not None for u in c.pods} == pod_uids

    (request,) = drain_requests(aws)
    assert request.involuntary and request.claim_id == old.id and request.node_name == old.node_name
    assert sorted(request.replacements) == sorted(c.id for c in replacements if c is not None)
    run_drain(aws, drain, request)

    assert node_of(cluster, old.node_name) is None
    assert [p.name for p in cluster.list_pods(old.node_name)] == []  # the do-not-disrupt pod was deleted too
    assert datetime.now(UTC) >= action  # not terminated before AWS would
    ended = store.get_claim(old.id)
    assert ended is not None and ended.state is ClaimState.TERMINATED
    assert instance_state(aws, old.instance_id) in ("shutting-down", "terminated")
    launched_at = max(t.at for c in replacements if c is not None for t in c.history if t.state is ClaimState.LAUNCHED)
    assert launched_at < ended.history[-1].at


def test_a_duplicated_notice_acts_once(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, core: client.CoreV1Api,
        fleet: ModuleType, interruption: ModuleType) -> None:
    old = launch_node(aws, fleet, kube, store, "gpu-burst-spot-dup")
    assert old.instance_id and old.node_name
    bind_pod(core, old.node_name, "dup-0")
    event = event_body("spot-interruption-warning", old.instance_id)
    put_event(aws, event)
    put_event(aws, event)  # AWS sent it twice: two events, two ids, same instance and kind
    messages = receive(aws, "interruption", wait=1)
    while len(messages) < 2:
        messages += receive(aws, "interruption", wait=1)
    response = invoke(aws, interruption, "interruption", "interruption", messages + messages[:1])
    assert response == {"batchItemFailures": []}  # the same message, redelivered within the batch, too
    assert len(drain_requests(aws)) == 1
    launches = launch_all(aws, fleet)
    assert len({i for r in launches for i in r.claim_ids}) == 1
    claims = [c for c in store.list_claims() if c.reason and old.instance_id in c.attributes.get("source", "")]
    assert len(claims) == 1


def test_an_instance_we_do_not_own_is_acknowledged_and_ignored(
        aws: EmbeddedAws, store: DynamoStateStore, interruption: ModuleType) -> None:
    before = store.list_claims()
    put_event(aws, event_body("spot-interruption-warning", "i-0123456789abcdef9"))
    handle_interruptions(aws, interruption)
    assert store.list_claims() == before
    assert drain_requests(aws) == [] and drain_queue(aws, "launch") == []


def test_rebalance_replaces_then_drains_once_the_replacement_is_ready(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, cluster: KubernetesCluster,
        core: client.CoreV1Api, fleet: ModuleType, interruption: ModuleType, drain: ModuleType,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain_domain, "REPLACEMENT_POLL", timedelta(seconds=1))  # look again soon, for the test
    old = launch_node(aws, fleet, kube, store, "gpu-burst-rebalanced")
    assert old.instance_id and old.node_name
    bind_pod(core, old.node_name, "rb-0")
    put_event(aws, event_body("rebalance-recommendation", old.instance_id))
    handle_interruptions(aws, interruption)
    assert not node_of(cluster, old.node_name).unschedulable  # replace first: untouched until then
    (request,) = drain_requests(aws)
    assert not request.involuntary and request.replacements and request.wait_until is not None
    run_drain(aws, drain, request, timeout_seconds=31)  # no replacement yet: the drain waits, re-enqueued
    waiting = continued(aws)
    assert waiting.attempt == 1 and not node_of(cluster, old.node_name).unschedulable

    for launch in launch_all(aws, fleet):
        for claim_id in launch.claim_ids:
            claim = store.get_claim(claim_id)
            assert claim is not None
            join(kube, store, claim)
    run_drain(aws, drain, waiting)
    assert node_of(cluster, old.node_name) is None
    ended = store.get_claim(old.id)
    assert ended is not None and ended.state is ClaimState.TERMINATED


def test_state_change_closes_the_claim(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, cluster: KubernetesCluster,
        core: client.CoreV1Api, fleet: ModuleType, interruption: ModuleType) -> None:
    old = launch_node(aws, fleet, kube, store, "gpu-burst-stopped")
    assert old.instance_id and old.node_name
    bind_pod(core, old.node_name, "st-0")
    put_event(aws, event_body("state-change", old.instance_id))
    handle_interruptions(aws, interruption)
    ended = store.get_claim(old.id)
    assert ended is not None and ended.state is ClaimState.TERMINATED and ended.reason == "instance terminated"
    assert node_of(cluster, old.node_name) is None and cluster.list_pods(old.node_name) == []
    assert drain_requests(aws) == [] and drain_queue(aws, "launch") == []


def test_scheduled_change_replaces_and_drains_before_the_start(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, core: client.CoreV1Api,
        fleet: ModuleType, interruption: ModuleType) -> None:
    old = launch_node(aws, fleet, kube, store, "gpu-burst-retiring", capacity_type="on-demand")
    assert old.instance_id and old.node_name
    bind_pod(core, old.node_name, "sc-0")
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(days=3)
    put_event(aws, event_body("health-scheduled-change", old.instance_id, startTime=format_datetime(start, True),
                              endTime=format_datetime(start, True)))
    handle_interruptions(aws, interruption)
    (request,) = drain_requests(aws)
    assert start - timedelta(minutes=1) < request.deadline < start
    assert request.replacements and request.involuntary  # the instance goes at the start, whatever runs on it
    assert len(launch_all(aws, fleet)) >= 1


def test_reservation_interruption_is_involuntary_with_its_termination_time(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, cluster: KubernetesCluster,
        core: client.CoreV1Api, fleet: ModuleType, interruption: ModuleType) -> None:
    old = launch_node(aws, fleet, kube, store, "gpu-burst-reserved", capacity_type="on-demand")
    assert old.instance_id and old.node_name
    bind_pod(core, old.node_name, "cr-0")
    ends = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=2)
    put_event(aws, event_body("capacity-reservation-interruption-warning", old.instance_id,
                              **{"instance-termination-time": ends.strftime("%Y-%m-%dT%H:%M:%SZ")}))
    handle_interruptions(aws, interruption)
    assert node_of(cluster, old.node_name).unschedulable
    (request,) = drain_requests(aws)
    assert request.involuntary and request.deadline == ends - timedelta(seconds=30)
    assert request.replacements and len(launch_all(aws, fleet)) >= 1


def test_a_capacity_block_ending_drains_its_nodes_before_ec2_terminates_them(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, cluster: KubernetesCluster,
        core: client.CoreV1Api, fleet: ModuleType, interruption: ModuleType) -> None:
    """The warning names the reservation, not the instance: the handler finds the node launched into it."""
    old = launch_node(aws, fleet, kube, store, "gpu-burst-block", capacity_type="on-demand")
    assert old.instance_id and old.node_name
    store.update_claim(old, capacity_type="reserved", reservation_id="cr-0b10c4e5a7d9f1357")  # a node in the block
    bind_pod(core, old.node_name, "cb-0")
    ends = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=40)
    event = json.loads((ROOT / "events" / "eventbridge-capacity-block-expiration-warning.json").read_text())
    event["detail"]["end-date"] = ends.strftime("%Y-%m-%dT%H:%M:%SZ")
    put_event(aws, event)
    handle_interruptions(aws, interruption)
    assert node_of(cluster, old.node_name).unschedulable
    (request,) = drain_requests(aws)
    assert request.instance_id == old.instance_id and request.involuntary
    assert request.deadline == ends - timedelta(minutes=30, seconds=30)
    assert request.replacements and len(launch_all(aws, fleet)) >= 1


def test_an_event_that_is_not_an_eventbridge_event_fails_alone(
        aws: EmbeddedAws, interruption: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    sqs = aws.clients.client("sqs")
    sqs.send_message(QueueUrl=aws.queue_url("interruption"), MessageBody="{not json")
    sqs.send_message(QueueUrl=aws.queue_url("interruption"), MessageBody=json.dumps(
        {"id": "x", "time": "2026-11-22T10:00:00Z", "detail-type": "EC2 Instance State-change Notification",
         "detail": {"instance-id": "i-0abc", "state": "running"}}))
    messages = receive(aws, "interruption", wait=1)
    while len(messages) < 2:
        messages += receive(aws, "interruption", wait=1)
    poison = next(m["MessageId"] for m in messages if m["Body"] == "{not json")
    capsys.readouterr()
    response = invoke(aws, interruption, "interruption", "interruption", messages)
    assert response == {"batchItemFailures": [{"itemIdentifier": poison}]}
    assert metric_values(capsys.readouterr().out, "RecordsFailed") == [1]
    drain_queue(aws, "interruption")


def test_a_notice_another_invocation_holds_fails_with_its_reason_logged(
        aws: EmbeddedAws, interruption: ModuleType, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An invocation that died mid-notice leaves its idempotency record in progress until its timeout: until
    then a redelivery fails, and if SQS gives up first the notice is dead-lettered — with this reason logged."""
    from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyAlreadyInProgressError

    from tests.conftest import log_to_stdout

    def held(**_: Any) -> Any:
        raise IdempotencyAlreadyInProgressError("Execution already in progress with idempotency key ...")

    monkeypatch.setattr(interruption, "act_once", lambda: held)
    log_to_stdout(interruption)
    put_event(aws, event_body("spot-interruption-warning", "i-0abc00000000held0"))
    messages = receive(aws, "interruption", wait=1)
    response = invoke(aws, interruption, "interruption", "interruption", messages)

    assert response == {"batchItemFailures": [{"itemIdentifier": messages[0]["MessageId"]}]}
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    reasons = [r for r in logged if r.get("messageId") == messages[0]["MessageId"] and r["level"] == "WARNING"]
    assert reasons and "in progress" in reasons[0]["message"]


def test_a_notice_that_fails_is_delivered_again_within_the_warning(
        aws: EmbeddedAws, interruption: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lambda keeps a record its handler reports failed in flight until the queue's visibility timeout ends: six
    times the function's timeout here, while a Spot warning gives two minutes. The handler has it back sooner
    (`batch_failures.RETRY_AFTER`, shortened here so the test need not wait ten seconds)."""
    from gpu_autoscaler import batch_failures
    from gpu_autoscaler.emulator.sqs_events import sqs_event
    from gpu_autoscaler.lambda_context import local_context

    def unreachable(**_: Any) -> Any:
        raise ConnectionError("the cluster's API server did not answer")

    sqs = aws.clients.client("sqs")
    visibility = sqs.get_queue_attributes(QueueUrl=aws.queue_url("interruption"),
                                          AttributeNames=["VisibilityTimeout"])["Attributes"]["VisibilityTimeout"]
    assert int(visibility) > 120  # what a failed record would wait without the handler: past the warning
    monkeypatch.setattr(batch_failures, "RETRY_AFTER", (1, 1, 1))
    monkeypatch.setattr(interruption, "act_once", lambda: unreachable)
    drain_queue(aws, "interruption")  # what tests before left
    put_event(aws, event_body("spot-interruption-warning", "i-0abc0000000retry0"))
    messages = receive(aws, "interruption", wait=1)  # as Lambda's poller receives: the queue's visibility timeout
    response = interruption.handler(sqs_event(messages, aws.queue_arn("interruption")),
                                    local_context("interruption"))

    assert response == {"batchItemFailures": [{"itemIdentifier": messages[0]["MessageId"]}]}
    again = receive(aws, "interruption", wait=5)
    assert [m["MessageId"] for m in again] == [messages[0]["MessageId"]]
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    drain_queue(aws, "interruption")

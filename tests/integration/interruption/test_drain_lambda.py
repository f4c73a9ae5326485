"""The drain Lambda on moto and the local Kubernetes API: PodDisruptionBudgets waited out across invocations,
do-not-disrupt pods respected by voluntary drains only, the sample event handled."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from kubernetes import client

from gpu_autoscaler.domain import drain as drain_domain
from gpu_autoscaler.domain.drain import DRAIN_TAINT
from gpu_autoscaler.lambda_context import local_context
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.messages import DrainRequest
from tests.conftest import ROOT
from tests.emf import metric_values
from tests.integration.interruption.conftest import (
    DO_NOT_DISRUPT,
    bind_pod,
    drain_queue,
    instance_state,
    invoke,
    launch_node,
    receive,
)

if TYPE_CHECKING:
    from types import ModuleType

    import pytest

    from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
    from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
    from gpu_autoscaler.models.claims import NodeClaim

SHORT = 31.0
"""An invocation with a second to spare after the handler's margin: it re-enqueues rather than wait in place."""


def request_for(claim: NodeClaim, **fields: object) -> DrainRequest:
    assert claim.node_name
    values: dict[str, object] = {"cluster": "ml-prod", "node_name": claim.node_name, "instance_id": claim.instance_id,
                                 "claim_id": claim.id, "reason": "consolidation: underutilized",
                                 "deadline": datetime.now(UTC) + timedelta(hours=1)}
    values.update(fields)
    return DrainRequest.model_validate(values)


def deliver(aws: EmbeddedAws, drain: ModuleType, request: DrainRequest | None = None,
            timeout_seconds: float = 60.0, wait: int = 1) -> DrainRequest | None:
    """Send `request` (or take the drain's own continuation, once visible) and invoke; the continuation sent."""
    sqs = aws.clients.client("sqs")
    if request is not None:
        sqs.send_message(QueueUrl=aws.queue_url("drain"), MessageBody=request.model_dump_json(by_alias=True))
    messages = receive(aws, "drain", wait=wait)
    assert len(messages) == 1
    assert invoke(aws, drain, "drain", "drain", messages, timeout_seconds) == {"batchItemFailures": []}
    pending = aws.clients.client("sqs").get_queue_attributes(
        QueueUrl=aws.queue_url("drain"), AttributeNames=["ApproximateNumberOfMessagesDelayed",
                                                         "ApproximateNumberOfMessages"])["Attributes"]
    queued = int(pending["ApproximateNumberOfMessagesDelayed"]) + int(pending["ApproximateNumberOfMessages"])
    return DrainRequest.model_validate_json(messages[0]["Body"]) if queued else None


def test_a_pdb_blocked_drain_resumes_across_invocations_and_finishes(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, cluster: KubernetesCluster,
        core: client.CoreV1Api, fleet: ModuleType, drain: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain_domain, "BACKOFF_BASE", timedelta(seconds=1))  # seconds, not minutes, for the test
    claim = launch_node(aws, fleet, kube, store, "gpu-burst-pdb")
    assert claim.node_name and claim.instance_id
    for name in ("api-0", "api-1"):
        bind_pod(core, claim.node_name, name, labels={"app": "api"})
    policy = client.PolicyV1Api(kube.client())
    policy.create_namespaced_pod_disruption_budget("default", client.V1PodDisruptionBudget.model_validate({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "api"},
        "spec": {"selector": {"matchLabels": {"app": "api"}}, "minAvailable": 2}}))

    assert deliver(aws, drain, request_for(claim), timeout_seconds=SHORT) is not None  # 429: re-enqueued
    node = next(n for n in cluster.list_nodes() if n.name == claim.node_name)
    assert node.unschedulable and DRAIN_TAINT in node.taints
    draining = store.get_claim(claim.id)
    assert draining is not None and draining.state is ClaimState.DRAINING
    assert deliver(aws, drain, timeout_seconds=SHORT, wait=3) is not None  # still refused: backing off
    assert sorted(p.name for p in cluster.list_pods(claim.node_name)) == ["api-0", "api-1"]
    # What `kubectl describe node` shows meanwhile: the budget's refusal, as Karpenter's FailedDraining says it.
    told = [e for e in core.list_namespaced_event("default").items
            if e.involved_object.kind == "Node" and e.involved_object.name == claim.node_name]
    assert {(e.reason, e.type) for e in told} == {("FailedDraining", "Warning")}
    assert any("default/api-0" in (e.message or "") and "disruption budget" in (e.message or "") for e in told)
    assert all((e.count or 0) >= 1 for e in told)

    policy.delete_namespaced_pod_disruption_budget("api", "default")  # the budget lets go
    invocations = 2
    while deliver(aws, drain, timeout_seconds=SHORT, wait=5) is not None:  # evicted, then found empty
        invocations += 1
        assert invocations < 6
    assert cluster.list_pods(claim.node_name) == []
    assert all(n.name != claim.node_name for n in cluster.list_nodes())
    ended = store.get_claim(claim.id)
    assert ended is not None and ended.state is ClaimState.TERMINATED
    assert instance_state(aws, claim.instance_id) in ("shutting-down", "terminated")


def test_do_not_disrupt_blocks_a_voluntary_drain_but_not_a_spot_one(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, cluster: KubernetesCluster,
        core: client.CoreV1Api, fleet: ModuleType, drain: ModuleType) -> None:
    claim = launch_node(aws, fleet, kube, store, "gpu-burst-dnd")
    assert claim.node_name
    bind_pod(core, claim.node_name, "notebook-0", annotations=DO_NOT_DISRUPT)

    assert deliver(aws, drain, request_for(claim)) is None  # abandoned: nothing re-enqueued
    node = next(n for n in cluster.list_nodes() if n.name == claim.node_name)
    assert not node.unschedulable and [p.name for p in cluster.list_pods(claim.node_name)] == ["notebook-0"]
    kept = store.get_claim(claim.id)
    assert kept is not None and kept.state is ClaimState.REGISTERED

    # At the deadline minus its grace period (30 s: already due) the do-not-disrupt pod is deleted.
    spot = request_for(claim, reason="spot interruption warning", involuntary=True,
                       deadline=datetime.now(UTC) + timedelta(seconds=5))
    assert deliver(aws, drain, spot) is None
    assert cluster.list_pods(claim.node_name) == []
    ended = store.get_claim(claim.id)
    assert ended is not None and ended.state is ClaimState.TERMINATED


def test_the_sample_drain_request_for_a_claim_we_do_not_have_is_acknowledged(
        aws: EmbeddedAws, drain: ModuleType) -> None:
    import json

    event = json.loads((ROOT / "events" / "drain-request.json").read_text())
    assert drain.handler(event, local_context("drain")) == {"batchItemFailures": []}
    assert drain_queue(aws, "drain") == []


def test_a_malformed_drain_request_fails_alone(aws: EmbeddedAws, drain: ModuleType,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    sqs = aws.clients.client("sqs")
    sqs.send_message(QueueUrl=aws.queue_url("drain"), MessageBody='{"cluster": "ml-prod"}')
    messages = receive(aws, "drain", wait=1)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No application metrics")
        response = invoke(aws, drain, "drain", "drain", messages)
    assert response == {"batchItemFailures": [{"itemIdentifier": messages[0]["MessageId"]}]}
    assert metric_values(capsys.readouterr().out, "RecordsFailed") == [1]
    drain_queue(aws, "drain")

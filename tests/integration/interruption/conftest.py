"""The interruption, drain and fleet Lambdas on moto and the local Kubernetes API, for the whole package.

The configuration points the Kubernetes endpoint at the local API server, so the handlers reach it exactly as
in AWS: the functions' small Kubernetes client with an EKS token presigned by (moto's) STS. Each test launches
its own nodes through the fleet handler (real tagged instances on moto), registers them with the simulated
kubelets and binds its pods to them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes, SimulatedInstance
from gpu_autoscaler.emulator.sqs_events import RECEIVE_ARGUMENTS, sqs_event
from gpu_autoscaler.lambda_context import local_context
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint
from tests import kube_reads
from tests.conftest import ROOT, example_config_data
from tests.integration.kubernetes.conftest import functions_client, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

GPU_TAINT = Taint(key="nvidia.com/gpu", value="true", effect="NoSchedule")
DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}


@pytest.fixture(scope="package")
def kube() -> Iterator[LocalKubernetes]:
    with LocalKubernetes(cluster_name="ml-prod", bookmark_interval=0.2) as local:
        yield local


@pytest.fixture(scope="package")
def config(kube: LocalKubernetes) -> Config:
    data = example_config_data()
    data["kubernetes"] = {"endpoint": kube.url}
    return parse_config(data)


@pytest.fixture(scope="package")
def aws(config: Config, kube: LocalKubernetes) -> Iterator[EmbeddedAws]:
    """The account as the stack leaves it; the cluster replays the functions' EKS tokens against its STS."""
    with EmbeddedAws(config) as embedded:
        kube.authenticator.sts_endpoint = embedded.endpoint_url
        yield embedded


def _handler(aws: EmbeddedAws, function: str) -> Iterator[ModuleType]:
    """The handler module imported as Lambda would, with the function's environment; kept warm."""
    name = f"{function}_handler_under_test"
    with pytest.MonkeyPatch.context() as patch:
        for key, value in aws.function_environment(function).items():
            patch.setenv(key, value)
        patch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
        spec = importlib.util.spec_from_file_location(name, Path(ROOT / "functions" / function / "handler.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
        sys.modules.pop(name, None)


@pytest.fixture(scope="package")
def fleet(aws: EmbeddedAws) -> Iterator[ModuleType]:
    yield from _handler(aws, "fleet")


@pytest.fixture(scope="package")
def interruption(aws: EmbeddedAws) -> Iterator[ModuleType]:
    yield from _handler(aws, "interruption")


@pytest.fixture(scope="package")
def drain(aws: EmbeddedAws) -> Iterator[ModuleType]:
    yield from _handler(aws, "drain")


@pytest.fixture(scope="package")
def store(aws: EmbeddedAws, config: Config) -> DynamoStateStore:
    return DynamoStateStore(aws.clients.client("dynamodb"), aws.resources.table_name, config.cluster_name,
                            clock=SystemClock())


@pytest.fixture(autouse=True)
def no_room_in_flight(store: DynamoStateStore) -> None:
    """Each test plans against its own claims: those an earlier test left in flight are ended first. A launched
    replacement whose pods were drained away has its room free again, and a later test's pods would go there."""
    for claim in store.list_claims([ClaimState.PENDING, ClaimState.LAUNCHED]):
        store.transition(claim, ClaimState.TERMINATED, "test: left in flight by an earlier test")


@pytest.fixture(scope="package")
def cluster(kube: LocalKubernetes) -> KubernetesCluster:
    return KubernetesCluster(functions_client(kube))


@pytest.fixture(scope="package")
def core(kube: LocalKubernetes) -> client.CoreV1Api:
    return client.CoreV1Api(kube.client())


# ---- queues ---------------------------------------------------------------------------------------------------

def receive(aws: EmbeddedAws, queue: str, wait: int = 0) -> list[dict[str, Any]]:
    answer = aws.clients.client("sqs").receive_message(QueueUrl=aws.queue_url(queue), MaxNumberOfMessages=10,
                                                       WaitTimeSeconds=wait, **RECEIVE_ARGUMENTS)
    return answer.get("Messages", [])


def drain_queue(aws: EmbeddedAws, queue: str) -> list[dict[str, Any]]:
    """Every message visible now, removed from the queue."""
    out: list[dict[str, Any]] = []
    while messages := receive(aws, queue):
        for message in messages:
            aws.clients.client("sqs").delete_message(QueueUrl=aws.queue_url(queue),
                                                     ReceiptHandle=message["ReceiptHandle"])
        out += messages
    return out


def invoke(aws: EmbeddedAws, module: ModuleType, function: str, queue: str, messages: list[dict[str, Any]],
           timeout_seconds: float = 60.0) -> dict[str, Any]:
    """As the event source mapping does: hand the batch over, delete what succeeded, release what failed. The
    handler runs in its function's environment (its role's credentials: its EKS token names that role)."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in aws.function_environment(function).items():
            patch.setenv(key, value)
        response: dict[str, Any] = module.handler(sqs_event(messages, aws.queue_arn(queue)),
                                                  local_context(function, timeout_seconds=timeout_seconds))
    failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
    sqs = aws.clients.client("sqs")
    for message in messages:
        if message["MessageId"] in failed:
            sqs.change_message_visibility(QueueUrl=aws.queue_url(queue), ReceiptHandle=message["ReceiptHandle"],
                                          VisibilityTimeout=0)
        else:
            sqs.delete_message(QueueUrl=aws.queue_url(queue), ReceiptHandle=message["ReceiptHandle"])
    return response


def launch_all(aws: EmbeddedAws, fleet: ModuleType) -> list[LaunchRequest]:
    """Run the fleet on every launch request waiting; the requests it acted on."""
    messages = drain_queue(aws, "launch")
    if messages:
        response = fleet.handler(sqs_event(messages, aws.queue_arn("launch")), local_context("fleet"))
        assert response == {"batchItemFailures": []}
    return [LaunchRequest.model_validate_json(m["Body"]) for m in messages]


# ---- nodes and pods -------------------------------------------------------------------------------------------

def join(kube: LocalKubernetes, store: DynamoStateStore, claim: NodeClaim) -> NodeClaim:
    """The claim's instance boots and its kubelet registers a Ready node; the claim is marked Registered, as
    the registration reconcile step would."""
    assert claim.instance_id and claim.instance_type and claim.zone
    instance = SimulatedInstance(
        instance_id=claim.instance_id, instance_type=claim.instance_type, zone=claim.zone,
        capacity=Resources.from_quantities({"cpu": "8", "memory": "32Gi", "pods": "58", "nvidia.com/gpu": "4"}),
        labels={"karpenter.sh/nodepool": claim.pool, "gpu-autoscaler/claim": claim.id}, taints=(GPU_TAINT,),
        capacity_type=str(claim.capacity_type))
    kube.add_instance(instance, boot_delay=timedelta(0))
    core = client.CoreV1Api(kube.client())
    wait_for(lambda: any(kube_reads.name(n) == instance.name for n in core.list_node().items), what="node joined")
    return store.transition(claim, ClaimState.REGISTERED, "node joined", node_name=instance.name)


def launch_node(aws: EmbeddedAws, fleet: ModuleType, kube: LocalKubernetes, store: DynamoStateStore,
                claim_id: str, *, capacity_type: str = "spot", pool: str = "gpu-burst") -> NodeClaim:
    """A claim launched by the fleet handler (a tagged instance on moto) whose node has joined."""
    claim = NodeClaim(cluster="ml-prod", id=claim_id, pool=pool, capacity_type=capacity_type,
                      zones=("us-east-1b", "us-east-1a", "us-east-1c"), instance_types=("g6.xlarge", "g5.xlarge"),
                      price_per_hour=0.4,
                      created_at=datetime.now(UTC) - timedelta(minutes=30))
    store.create_claim(claim)
    aws.clients.client("sqs").send_message(
        QueueUrl=aws.queue_url("launch"),
        MessageBody=LaunchRequest(cluster="ml-prod", claim_ids=[claim_id]).model_dump_json(by_alias=True))
    launch_all(aws, fleet)
    launched = store.get_claim(claim_id)
    assert launched is not None and launched.state is ClaimState.LAUNCHED, launched
    return join(kube, store, launched)


def bind_pod(core: client.CoreV1Api, node: str, name: str, *, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, gpus: int = 1) -> None:
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [{"name": "main", "image": "server:1", "resources": {
            "requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    body = {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "labels": labels or {"app": name}, "annotations": annotations or {}}}
    core.create_namespaced_pod("default", client.V1Pod.model_validate(body))
    wait_for(lambda: kube_reads.pod_status(core.read_namespaced_pod(name, "default")).phase == "Running",
             what=f"{name} running")


def instance_state(aws: EmbeddedAws, instance_id: str) -> str:
    reservations = aws.clients.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
    state: str = reservations[0]["Instances"][0]["State"]["Name"]
    return state


def event_body(name: str, instance_id: str, **detail: Any) -> dict[str, Any]:
    """A sample EventBridge event from `events/`, about our instance, happening now."""
    event: dict[str, Any] = json.loads((ROOT / "events" / f"eventbridge-{name}.json").read_text())
    text = json.dumps(event)
    for old in _instances_in(event):
        text = text.replace(old, instance_id)
    event = json.loads(text)
    event["time"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event["detail"].update(detail)
    return event


def _instances_in(event: dict[str, Any]) -> set[str]:
    found = {event["detail"].get("instance-id")} | {e.get("entityValue") for e in event["detail"].get(
        "affectedEntities", [])}
    return {i for i in found if isinstance(i, str) and i.startswith("i-")}

"""The consolidate Lambda on the embedded AWS (moto server) and the local Kubernetes API, through the real
`kubernetes` client with an EKS token: a half-empty node is replaced, and its drain waits until the
replacement — launched by the fleet on EC2 Fleet — has joined the cluster and is Ready.
"""

from __future__ import annotations

import json
import warnings
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client as k8s

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.adapters.aws.drain_queue import SqsDrainQueue
from gpu_autoscaler.adapters.aws.fleet import Ec2Compute
from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.adapters.aws.tick_leases import DynamoTickLeases
from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.cli.invoke import default_functions_dir, handler_path, run_handler
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.disruption_marks import DISRUPTION_ATTRIBUTE
from gpu_autoscaler.domain.user_data import ClusterBootstrap, node_setup, render_user_data
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes, SimulatedInstance
from gpu_autoscaler.emulator.machines import Gpu, Machine
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER
from gpu_autoscaler.models.leases import Lease
from gpu_autoscaler.models.messages import DrainRequest, LaunchRequest
from gpu_autoscaler.services.drain import DrainService
from gpu_autoscaler.services.fleet import FleetService, aws_fleet_service
from gpu_autoscaler.services.prewarm import InvalidTick
from gpu_autoscaler.settings import load_settings
from tests.conftest import ROOT, example_config_data
from tests.emf import metric_values
from tests.integration.kubernetes.conftest import functions_client

if TYPE_CHECKING:
    from collections.abc import Iterator

POOL = "gpu-burst"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def kube() -> Iterator[LocalKubernetes]:
    with LocalKubernetes(cluster_name="ml-prod", bookmark_interval=0.2) as local:
        yield local


@pytest.fixture(scope="module")
def config(kube: LocalKubernetes) -> Config:
    """The example configuration, its Kubernetes endpoint the local API, its burst pool consolidating at once."""
    data = example_config_data()
    data["kubernetes"] = {"endpoint": kube.url}
    for pool in data["nodePools"]:
        if pool["name"] == POOL:
            pool["disruption"] = {"consolidateAfter": "0s", "minNodeAge": "0s", "spotToSpot": True,
                                  "emptyKeepLeadTimes": 0, "budgets": [{"nodes": "100%"}]}
    data["timeouts"] = {**data.get("timeouts", {}), "consolidationValidation": "0s"}  # validated on the next tick
    return parse_config(data)


@pytest.fixture(scope="module")
def aws(config: Config, kube: LocalKubernetes) -> Iterator[EmbeddedAws]:
    """The account as the stack leaves it; the cluster replays the functions' EKS tokens against its STS."""
    with EmbeddedAws(config) as embedded:
        kube.authenticator.sts_endpoint = embedded.endpoint_url
        yield embedded


@pytest.fixture(scope="module")
def store(aws: EmbeddedAws, config: Config) -> DynamoStateStore:
    return DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, config.cluster_name, clock=SystemClock())


def invoke(aws: EmbeddedAws, event: Any) -> Any:
    path = handler_path(default_functions_dir(), "consolidate")
    return run_handler(path, "consolidate", event, aws.function_environment("consolidate"), region=aws.config.region)


def take(aws: EmbeddedAws, queue: str) -> list[dict[str, Any]]:
    sqs = aws.clients.client("sqs")
    out: list[dict[str, Any]] = []
    while True:
        batch = sqs.receive_message(QueueUrl=aws.queue_url(queue), MaxNumberOfMessages=10).get("Messages", [])
        if not batch:
            return out
        for message in batch:
            out.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=aws.queue_url(queue), ReceiptHandle=message["ReceiptHandle"])


def stored_claim(store: DynamoStateStore, claim_id: str) -> NodeClaim:
    """A claim the test knows the store holds (get_claim answers None for one it does not)."""
    claim = store.get_claim(claim_id)
    assert claim is not None, f"no claim {claim_id} in the store"
    return claim


def join(kube: LocalKubernetes, aws: EmbeddedAws, config: Config, instance_id: str, instance_type: str, zone: str,
         capacity_type: str) -> str:
    """The instance's kubelet registers its Node from the user data the fleet would send for it."""
    known = {t.name: t for t in Ec2CatalogSource.from_config(aws.clients, config).instance_types()}[instance_type]
    machine = Machine(instance_type, vcpus=known.vcpu, memory_mib=known.memory_mib, root_volume_gib=200,
                      gpu=Gpu(known.gpu_model or "", "NVIDIA", known.gpu_devices,
                              round(known.gpu_memory_mib / max(known.gpu_devices, 1))) if known.gpu_devices else None)
    setup = node_setup(config.pool(POOL), capacity_type, instance_type=known)  # type: ignore[arg-type]
    user_data = render_user_data(ClusterBootstrap.from_config(config), setup)
    instance = SimulatedInstance.from_user_data(instance_id, machine, zone, user_data, capacity_type=capacity_type)
    kube.add_instance(instance)
    kube.reconcile()
    return instance.name


def test_a_replacement_is_launched_and_ready_before_its_node_is_drained(
        aws: EmbeddedAws, kube: LocalKubernetes, config: Config, store: DynamoStateStore) -> None:
    # A g5.48xlarge (8 GPUs) of ours, left holding one 2-GPU pod — under half its GPUs, so underused by the default
    # `underutilizedBelow` (a real instance: the garbage collector closes a claim whose instance EC2 does not have).
    candidate = aws.clients.client("ec2").run_instances(
        ImageId=config.ami.x86_64, InstanceType="g5.48xlarge", MinCount=1, MaxCount=1,
        SubnetId=aws.zone_subnets["us-east-1a"],
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": config.cluster_name},
                                                                  {"Key": TAG_CLAIM, "Value": "nc-candidate"}]}],
    )["Instances"][0]["InstanceId"]
    node = join(kube, aws, config, candidate, "g5.48xlarge", "us-east-1a", "on-demand")
    core = k8s.CoreV1Api(kube.client())
    core.create_namespaced_pod("default", k8s.V1Pod.model_validate({
        "metadata": {"name": "train-0", "labels": {"app": "train"}},
        "spec": {"nodeName": node, "tolerations": [GPU_TOLERATION], "nodeSelector": {"karpenter.sh/nodepool": POOL},
                 "containers": [{
            "name": "main", "image": "trainer",
            "resources": {"requests": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "2"},
                          "limits": {"nvidia.com/gpu": "2"}}}]},
    }))
    kube.reconcile()
    now = datetime.now(UTC)
    store.create_claim(NodeClaim(
        cluster=config.cluster_name, id="nc-candidate", pool=POOL, capacity_type="on-demand", zones=("us-east-1a",),
        instance_types=("g5.48xlarge",), price_per_hour=16.288, state=ClaimState.REGISTERED,
        created_at=now - timedelta(hours=2), instance_id=candidate, instance_type="g5.48xlarge", zone="us-east-1a",
        launched_price_per_hour=16.288, node_name=node,
    ))

    tick = json.loads((ROOT / "events" / "consolidate-rate.json").read_text())
    proposed = invoke(aws, tick)
    assert [d["nodes"] for d in proposed["proposed"]] == [[node]] and proposed["decisions"] == []
    assert take(aws, "launch") == [] and take(aws, "drain") == []
    taints = kube.objects("nodes")[0]["spec"]["taints"]
    assert {"key": "gpu-autoscaler/disrupted", "value": "", "effect": "NoSchedule"} in taints  # no new pod lands
    summary = invoke(aws, tick)  # the next tick validates the decision and carries it out
    [decision] = summary["decisions"]
    assert (decision["reason"], decision["action"], decision["nodes"]) == ("Underutilized", "replace", [node])
    assert decision["savingPerHour"] > 0
    [replacement] = decision["replacements"]
    [launch] = [LaunchRequest.model_validate(b) for b in take(aws, "launch")]
    assert launch.claim_ids == [replacement["claim"]]
    [drain] = [DrainRequest.model_validate(b) for b in take(aws, "drain")]
    assert (drain.node_name, drain.claim_id, drain.involuntary) == (node, "nc-candidate", False)
    assert drain.replacement_claim_id == replacement["claim"]
    assert DISRUPTION_ATTRIBUTE in stored_claim(store, "nc-candidate").attributes

    # The drain looks, finds the replacement not initialized, and leaves the node alone.
    cluster = KubernetesCluster(functions_client(kube))
    fleet = FleetService(config, store, Ec2Compute(aws.clients.client("ec2"), config.cluster_name), clock=SystemClock())
    drainer = DrainService(config.cluster_name, store, cluster, fleet,
                           SqsDrainQueue(aws.clients.client("sqs"), aws.queue_url("drain")), clock=SystemClock(),
                           sleep=lambda _: None)
    assert drainer.drain(drain).status == "continued"
    assert not kube.objects("nodes")[0]["spec"].get("unschedulable")

    # The fleet launches the replacement on EC2 Fleet; its node joins; the next tick registers it.
    launcher = aws_fleet_service(load_settings(aws.function_environment("fleet")))
    assert [c.claim_id for c in launcher.launch(launch).launched] == [replacement["claim"]]
    launched = stored_claim(store, replacement["claim"])
    assert launched.state is ClaimState.LAUNCHED and launched.instance_id
    assert launched.instance_type and launched.zone  # what EC2 Fleet answered, recorded with the instance
    join(kube, aws, config, launched.instance_id, launched.instance_type, launched.zone, launched.capacity_type)
    second = invoke(aws, {"trigger": "rate"})
    assert second["reconcile"]["registered"] == [replacement["claim"]]
    assert second["decisions"] == []

    # Now the drain evicts, and the node goes.
    finished = drainer.drain(drain, budget=timedelta(seconds=30))  # as its delayed continuation would
    assert finished.evicted == ["default/train-0"] and finished.status == "finished"
    registered = next(s.at for s in stored_claim(store, replacement["claim"]).history
                      if s.state is ClaimState.REGISTERED)
    ended = stored_claim(store, "nc-candidate")
    draining = next(s.at for s in ended.history if s.state is ClaimState.DRAINING)
    assert ended.state is ClaimState.TERMINATED and registered <= draining
    assert node not in {n["metadata"]["name"] for n in kube.objects("nodes")}


def test_a_tick_that_is_not_a_schedule_tick_fails_with_the_reason(aws: EmbeddedAws,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No application metrics")
        with pytest.raises(InvalidTick, match="trigger"):
            invoke(aws, {"trigger": "sometimes"})
    assert metric_values(capsys.readouterr().err, "TicksRejected") == [1]


def test_a_tick_that_finds_another_holding_the_lease_skips_and_returns_normally(
        aws: EmbeddedAws, store: DynamoStateStore, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing but the lease keeps two ticks apart (the function reserves no concurrency): the one that finds it
    held touches nothing, counts that it skipped, and returns normally (an error would be retried)."""
    leases = DynamoTickLeases(aws.clients.client("dynamodb"), aws.table_name, aws.config.cluster_name)
    now = datetime.now(UTC)
    running = Lease(name="consolidate", holder="another-request", expires_at=now + timedelta(minutes=2))
    assert leases.take(running, now) is None
    before = store.list_claims()
    capsys.readouterr()
    try:
        summary = invoke(aws, {"trigger": "rate"})
    finally:
        assert leases.release(running)
    assert (summary["skipped"], summary["leaseHolder"]) == (True, "another-request")
    held_until = datetime.fromisoformat(summary["leaseExpiresAt"]) - running.expires_at
    assert timedelta(0) <= held_until < timedelta(seconds=1)  # stored to the second, rounded up
    assert store.list_claims() == before
    assert metric_values(capsys.readouterr().err, "TicksSkipped") == [1]

"""Pods per second the packer sustains through its queue: a backlog of pending-pods documents on the emulator's
FIFO queue, drained by the emulator's poller at the stack's batch size into the packer's Lambda handler.

Only the packer's trigger is driven (its `functions/` folder alone is handed to the host): the launch requests
it sends wait on the launch queue, so the figure is the packer's own work — DynamoDB reads and conditional
writes, the plan, the launch messages, the pods' Kubernetes Events — not the fleet's or a kubelet's competing
for the same two cores. The backlog is in place before the clock starts; the clock stops when the queue is
empty. With `--profile`, the poller runs in this thread under cProfile and the top of the profile is printed
(moto serves from its own threads, so its share shows as time inside botocore's calls).
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import json
import os
import pstats
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.handlers import default_functions_dir
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from gpu_autoscaler.emulator.lambdas import LambdaHost
from gpu_autoscaler.emulator.pollers import QueuePoller
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.wiring import consumer

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.config import Config

__all__ = ["PackerRun", "documents", "run"]

QUEUE = "pending-pods"


def _pod(index: int, created: str) -> dict[str, Any]:
    """A pending pod as the agent copies it: one GPU of the burst pool, tolerating its taint."""
    return {
        "uid": str(uuid.UUID(int=index + 1)), "namespace": "load", "name": f"load-{index}", "createdAt": created,
        "requests": {"cpu": "4", "memory": "24Gi", "nvidia.com/gpu": "1"},
        "nodeSelector": {L.NODE_POOL: "gpu-burst"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }


def documents(cluster: str, pods: int, per_document: int) -> Iterator[str]:
    """The backlog's message bodies: `pods` pods, `per_document` to a pending-pods document."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for start in range(0, pods, per_document):
        yield json.dumps({"schemaVersion": 1, "cluster": cluster, "sentAt": now,
                          "pods": [_pod(i, now) for i in range(start, min(pods, start + per_document))]})


class PackerRun:
    """What one drain of the backlog measured."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.started = 0.0
        self.cpu_started = 0.0
        self.per_document = 0
        self.cpu_seconds = 0.0
        """This process's CPU time over the drain: the packer, moto's server threads and the Kubernetes API all
        run in it, so on a shared machine it is the figure other processes' load does not inflate."""
        self.pods = 0
        self.messages = 0
        self.batches = 0
        self.failed_records = 0
        self.errors: Counter[str] = Counter()
        self.batch_ms: list[float] = []
        self.dead_letters = 0
        self.claims = 0
        self.launch_requests = 0
        self.profile: str = ""
        self.calls: dict[str, list[float]] = {}
        """`service.Operation` or `kube.<METHOD>` → [count, seconds]: where the packer's time goes."""


@contextlib.contextmanager
def _timing_calls(calls: dict[str, list[float]]) -> Iterator[None]:
    """Count and time every AWS and Kubernetes call made in this process while installed."""
    import botocore.client
    from kubernetes.client import api_client

    original_aws, original_kube = botocore.client.BaseClient._make_api_call, api_client.ApiClient.call_api  # type: ignore[attr-defined]

    def timed(name: str, proceed: Any) -> Any:
        began = time.perf_counter()
        try:
            return proceed()
        finally:
            entry = calls.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - began

    def aws(client: Any, operation: str, params: Any) -> Any:
        name = f"{client.meta.service_model.endpoint_prefix}.{operation}"
        return timed(name, lambda: original_aws(client, operation, params))

    def kube(api: Any, resource: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return timed(f"kube.{method} {resource.rsplit('/', 1)[-1]}",
                     lambda: original_kube(api, resource, method, *args, **kwargs))

    botocore.client.BaseClient._make_api_call = aws  # type: ignore[attr-defined]
    api_client.ApiClient.call_api = kube  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        botocore.client.BaseClient._make_api_call = original_aws  # type: ignore[attr-defined]
        api_client.ApiClient.call_api = original_kube  # type: ignore[method-assign]


def _queue_size(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


@contextlib.contextmanager
def _environment(config: Config, directory: Path) -> Iterator[tuple[EmbeddedAws, LambdaHost]]:
    """Embedded AWS and the local Kubernetes API (the pods' Events go there), a host with the packer alone."""
    functions = directory / "functions"
    functions.mkdir()
    (functions / "packer").symlink_to(default_functions_dir() / "packer")
    kube = LocalKubernetes(cluster_name=config.cluster_name, kubeconfig_dir=directory)
    kube.start()
    try:
        access = config.kubernetes.model_copy(update={"endpoint": kube.url, "certificate_authority": None})
        config = config.model_copy(update={"kubernetes": access})
        with EmbeddedAws(config) as aws, (directory / "functions.log").open("w") as log:
            kube.authenticator.sts_endpoint = aws.endpoint_url  # the packer's EKS token is replayed there
            yield aws, LambdaHost(aws, functions_dir=functions, log_stream=log)
    finally:
        kube.stop()


def _send(aws: EmbeddedAws, bodies: list[str]) -> None:
    sqs, url = aws.clients.client("sqs"), aws.queue_url(QUEUE)
    for body in bodies:  # as the agent sends them: one document per message, the cluster its group
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=aws.config.cluster_name,
                         MessageDeduplicationId=uuid.uuid4().hex)


def _drain(poller: QueuePoller, sqs: Any, url: str, result: PackerRun) -> None:
    """What Lambda's poller does with a backlog: receive a batch, invoke, settle; until the queue is empty."""
    while True:
        invocation = poller.poll_once()
        if invocation is None:
            if _queue_size(sqs, url) == 0:
                return
            time.sleep(0.05)  # failed records wait out their visibility timeout
            continue
        result.batches += 1
        result.batch_ms.append(invocation.duration_ms)
        if result.batches % 10 == 0:  # a long drain reports as it goes: a run cut short still says something
            seconds = time.monotonic() - result.started
            pods = result.batches * 10 * result.per_document
            cpu = time.process_time() - result.cpu_started
            print(f"    {result.batches} batches, {seconds:.0f} s, {pods / seconds:.1f} pods/s so far, this batch "
                  f"{invocation.duration_ms:.0f} ms, CPU {cpu:.0f} s, load average {os.getloadavg()[0]:.1f}",
                  flush=True)
        result.failed_records += invocation.failures
        if invocation.error:
            result.errors[invocation.error.split(":", 1)[0]] += 1


def run(config: Config, *, pods: int, per_document: int, profile: bool = False, top: int = 25) -> PackerRun:
    """Put the backlog on the queue, then let the poller feed it to the packer until the queue is empty."""
    result = PackerRun()
    bodies = list(documents(config.cluster_name, pods, per_document))
    result.pods, result.messages = pods, len(bodies)
    with tempfile.TemporaryDirectory(prefix="load-packer-") as directory, \
            _environment(config, Path(directory)) as (aws, host):
        _send(aws, bodies)
        sqs, url = aws.clients.client("sqs"), aws.queue_url(QUEUE)
        poller = QueuePoller(host, sqs, QUEUE, url, aws.queue_arn(QUEUE), consumer(QUEUE), wait_seconds=0)
        host.invoke("packer", {"Records": []})  # the cold start is not the throughput's
        profiler = cProfile.Profile() if profile else None
        began, cpu = time.monotonic(), time.process_time()
        result.started, result.cpu_started, result.per_document = began, cpu, per_document
        if profiler is not None:
            profiler.enable()
        with _timing_calls(result.calls):
            _drain(poller, sqs, url, result)
        if profiler is not None:
            profiler.disable()
        result.seconds, result.cpu_seconds = time.monotonic() - began, time.process_time() - cpu
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
            result.profile = out.getvalue()
        result.dead_letters = _queue_size(sqs, aws.queue_url(QUEUE + "-dlq"))
        result.launch_requests = _queue_size(sqs, aws.queue_url("launch"))
        store = DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, config.cluster_name)
        result.claims = len(store.list_claims())
    return result

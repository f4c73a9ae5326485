"""The fleet through its launch queue: one document of N pods packed, then the launch requests it made drained by
one poller into the fleet's handler (EC2 is moto behind the strict layer). The figure is the fleet's own work per
claim — reads, conditional writes, CreateFleet, tags — with nothing else competing for the process."""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.load.packer_queue import QUEUE, _queue_size, _timing_calls, documents
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.handlers import default_functions_dir
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from gpu_autoscaler.emulator.lambdas import LambdaHost
from gpu_autoscaler.emulator.pollers import QueuePoller
from gpu_autoscaler.wiring import consumer

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.config import Config

__all__ = ["FleetRun", "run"]


@dataclass
class FleetRun:
    pods: int
    packer_seconds: float = 0.0
    launch_requests: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    invocations: int = 0
    failed_records: int = 0
    instances: int = 0
    calls: dict[str, list[float]] = field(default_factory=dict)


@contextlib.contextmanager
def _host(config: Config, directory: Path) -> Iterator[tuple[EmbeddedAws, LambdaHost]]:
    functions = directory / "functions"
    functions.mkdir()
    for name in ("packer", "fleet"):
        (functions / name).symlink_to(default_functions_dir() / name)
    kube = LocalKubernetes(cluster_name=config.cluster_name, kubeconfig_dir=directory)
    kube.start()
    try:
        access = config.kubernetes.model_copy(update={"endpoint": kube.url, "certificate_authority": None})
        with EmbeddedAws(config.model_copy(update={"kubernetes": access})) as aws, \
                (directory / "functions.log").open("w") as log:
            kube.authenticator.sts_endpoint = aws.endpoint_url  # the functions' EKS tokens are replayed there
            yield aws, LambdaHost(aws, functions_dir=functions, log_stream=log)
    finally:
        kube.stop()


def _poller(aws: EmbeddedAws, host: LambdaHost, queue: str) -> QueuePoller:
    sqs = aws.clients.client("sqs")
    return QueuePoller(host, sqs, queue, aws.queue_url(queue), aws.queue_arn(queue), consumer(queue), wait_seconds=0)


def run(config: Config, pods: int) -> FleetRun:
    result = FleetRun(pods)
    with tempfile.TemporaryDirectory(prefix="load-fleet-") as directory, \
            _host(config, Path(directory)) as (aws, host):
        sqs = aws.clients.client("sqs")
        for body in documents(config.cluster_name, pods, pods):
            sqs.send_message(QueueUrl=aws.queue_url(QUEUE), MessageBody=body, MessageGroupId=config.cluster_name,
                             MessageDeduplicationId=uuid.uuid4().hex)
        packed = _poller(aws, host, QUEUE).poll_once()
        result.packer_seconds = packed.duration_ms / 1000 if packed else 0.0
        launches = aws.queue_url("launch")
        result.launch_requests = _queue_size(sqs, launches)
        fleet = _poller(aws, host, "launch")
        host.invoke("fleet", {"Records": []})  # the cold start is not the throughput's
        began, cpu = time.monotonic(), time.process_time()
        with _timing_calls(result.calls):
            while True:
                invocation = fleet.poll_once()
                if invocation is None:
                    if _queue_size(sqs, launches) == 0:
                        break
                    time.sleep(0.05)
                    continue
                result.invocations += 1
                result.failed_records += invocation.failures
        result.seconds, result.cpu_seconds = time.monotonic() - began, time.process_time() - cpu
        ec2 = aws.clients.client("ec2")
        result.instances = sum(len(r["Instances"]) for page in ec2.get_paginator("describe_instances").paginate()
                               for r in page["Reservations"])
    return result

"""`python -m benchmarks itn-cordon`: Spot interruption warning → node cordoned, with a cold start, on the emulator.

AWS gives two minutes between the warning and the end of a Spot instance; the design spends at most 5 s of it
before the node takes no new pods. Each run launches a node through the fleet function (moto behind the
emulator, the local Kubernetes API, untimed), puts the warning on the bus (the stack's rule routes it to the
interruption queue), then starts the interruption function as Lambda would after an idle period: a fresh
interpreter with only the function's folder and the layer on its path, no byte code kept. The clock runs from
that process's start to the moment the Kubernetes API shows the node unschedulable, so it holds the runtime's
start, the imports, the configuration read, the EKS token and the cordon itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.deploy import local_layer
from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.config import Config, load_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.handlers import handler_path, run_handler
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes, SimulatedInstance
from gpu_autoscaler.emulator.sqs_events import RECEIVE_ARGUMENTS, sqs_event
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint
from infra.layer import ROOT
from tests import kube_reads

TARGET_SECONDS = 5.0
CLUSTER = "ml-prod"

PROBE = """
import json, sys, time
started = time.perf_counter()
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import handler
from gpu_autoscaler.lambda_context import local_context
imported = time.perf_counter()
response = handler.handler(json.loads(open(sys.argv[3]).read()), local_context("interruption"))
print(json.dumps({"import_s": imported - started, "handler_s": time.perf_counter() - imported,
                  "cpu_s": time.process_time(), "response": response}))
"""


def _config(kube: LocalKubernetes) -> Config:
    data = json.loads(load_config(ROOT / "cdk.json").to_json())
    data["kubernetes"] = {"endpoint": kube.url}
    return Config.model_validate(data)


def _receive(aws: EmbeddedAws, queue: str, wait: int = 2) -> list[dict[str, Any]]:
    sqs = aws.clients.client("sqs")
    answer = sqs.receive_message(QueueUrl=aws.queue_url(queue), MaxNumberOfMessages=10, WaitTimeSeconds=wait,
                                 **RECEIVE_ARGUMENTS)
    messages: list[dict[str, Any]] = answer.get("Messages", [])
    for message in messages:
        sqs.delete_message(QueueUrl=aws.queue_url(queue), ReceiptHandle=message["ReceiptHandle"])
    return messages


def _launch_node(aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, claim_id: str) -> NodeClaim:
    """A Spot claim launched by the fleet function (warm, in this process) whose node has joined."""
    claim = NodeClaim(cluster=CLUSTER, id=claim_id, pool="gpu-burst", capacity_type="spot",
                      zones=("us-east-1a", "us-east-1b"), instance_types=("g6.xlarge", "g5.xlarge"),
                      price_per_hour=0.4, created_at=datetime.now(UTC) - timedelta(minutes=30))
    store.create_claim(claim)
    aws.clients.client("sqs").send_message(
        QueueUrl=aws.queue_url("launch"),
        MessageBody=LaunchRequest(cluster=CLUSTER, claim_ids=[claim_id]).model_dump_json(by_alias=True))
    event = sqs_event(_receive(aws, "launch"), aws.queue_arn("launch"))
    run_handler(handler_path(ROOT / "functions", "fleet"), "fleet", event, aws.function_environment("fleet"),
                region=aws.resources.region)
    launched = store.get_claim(claim_id)
    if launched is None or launched.state is not ClaimState.LAUNCHED or not launched.instance_id:
        raise SystemExit(f"the fleet did not launch {claim_id}: {launched}")
    assert launched.instance_type and launched.zone
    instance = SimulatedInstance(
        instance_id=launched.instance_id, instance_type=launched.instance_type, zone=launched.zone,
        capacity=Resources.from_quantities({"cpu": "4", "memory": "16Gi", "pods": "58", "nvidia.com/gpu": "1"}),
        labels={"karpenter.sh/nodepool": "gpu-burst", "gpu-autoscaler/claim": claim_id},
        taints=(Taint(key="nvidia.com/gpu", value="true", effect="NoSchedule"),), capacity_type="spot")
    kube.add_instance(instance, boot_delay=timedelta(0))
    core = client.CoreV1Api(kube.client())
    deadline = time.monotonic() + 30
    while not any(kube_reads.name(n) == instance.name for n in core.list_node().items):
        if time.monotonic() > deadline:
            raise SystemExit("the node never joined")
        time.sleep(0.05)
    return store.transition(launched, ClaimState.REGISTERED, "node joined", node_name=instance.name)


def _spot_warning(instance_id: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((ROOT / "events" / "eventbridge-spot-interruption-warning.json").read_text())
    return {"Source": event["source"], "DetailType": event["detail-type"],
            "Detail": json.dumps({**event["detail"], "instance-id": instance_id}),
            "Resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"]}


def one_run(aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, layer: Path, run: int,
            scratch: Path) -> dict[str, float]:
    claim = _launch_node(aws, kube, store, f"gpu-burst-itn-{run}")
    assert claim.instance_id and claim.node_name
    answer = aws.clients.client("events").put_events(Entries=[_spot_warning(claim.instance_id)])
    if answer["FailedEntryCount"]:
        raise SystemExit(f"put_events failed: {answer}")
    messages = _receive(aws, "interruption")
    if not messages:
        raise SystemExit("the rule routed nothing to the interruption queue")
    event_file = scratch / f"event-{run}.json"
    event_file.write_text(json.dumps(sqs_event(messages, aws.queue_arn("interruption"))))
    core = client.CoreV1Api(kube.client())
    env = {**aws.function_environment("interruption"), "AWS_LAMBDA_FUNCTION_NAME": "interruption"}
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", "-c", PROBE, str(ROOT / "functions" / "interruption"), str(layer),
         str(event_file)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cordoned = None
    while cordoned is None and (process.poll() is None or time.perf_counter() - started < 60):
        if kube_reads.cordoned(core.read_node(claim.node_name)):
            cordoned = time.perf_counter() - started
        elif process.poll() is not None:
            break
        time.sleep(0.02)
    out, err = process.communicate(timeout=60)
    if cordoned is None:
        raise SystemExit(f"the node was never cordoned:\n{err[-3000:]}")
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])  # seconds, and the handler's response
    if figures.pop("response") != {"batchItemFailures": []}:
        raise SystemExit(f"the interruption function failed the message:\n{err[-3000:]}")
    figures["cordon_s"] = cordoned
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks itn-cordon")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="itn-bench-") as scratch, \
            LocalKubernetes(cluster_name=CLUSTER, bookmark_interval=0.2) as kube:
        layer = local_layer(Path(scratch) / "layer")
        config = _config(kube)
        with EmbeddedAws(config) as aws:
            kube.authenticator.sts_endpoint = aws.endpoint_url  # the function's EKS token is replayed there
            store = DynamoStateStore(aws.clients.client("dynamodb"), aws.resources.table_name, CLUSTER,
                                     clock=SystemClock())
            runs = [one_run(aws, kube, store, layer, run, Path(scratch)) for run in range(args.runs)]
    print(f"{'run':<5}{'import (s)':>11}{'handler (s)':>13}{'process CPU (s)':>17}{'warning → cordoned (s)':>25}")
    for i, figures in enumerate(runs):
        print(f"{i:<5}{figures['import_s']:>11.2f}{figures['handler_s']:>13.2f}{figures['cpu_s']:>17.2f}"
              f"{figures['cordon_s']:>25.2f}")
    median = statistics.median(r["cordon_s"] for r in runs)
    verdict = "ok" if median <= TARGET_SECONDS else "OVER"
    print(f"median warning → cordoned, cold start included: {median:.2f} s (target {TARGET_SECONDS:.0f} s: {verdict})")
    return 0

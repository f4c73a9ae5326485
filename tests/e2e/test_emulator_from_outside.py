"""`gpu-autoscaler emulator` in its own process, driven as a user and AWS would: a plain boto3 client and the
Kubernetes client, with nothing but the endpoints the command prints.

The user creates GPU pods and sees an instance launch (tagged), a node join and the pods bind; AWS puts a Spot
interruption warning on the bus and the node is cordoned, drained and replaced; the user deletes the pods and
the capacity is given back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import boto3
import pytest
from kubernetes import client as k8s
from kubernetes import config as kube_config

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.emulator.demo_workload import NAMESPACE, demo_config, notebook_pod
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER, TAG_NODE_POOL
from tests import kube_reads
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT = 120.0
STEP_TIMEOUT = 60.0


def _wait(condition: Callable[[], Any], timeout: float = STEP_TIMEOUT, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("emulator")
    config_file = directory / "config.json"
    config = demo_config(parse_config(example_config_data()), datetime.now(UTC))
    config_file.write_text(config.to_json())
    endpoints_file = directory / "endpoints.json"
    console = (directory / "console.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-c", "from gpu_autoscaler.cli.main import app; app()", "emulator", "--port", "0",
         "--config", str(config_file), "--speed", "30", "--state-dir", str(directory),
         "--endpoints-file", str(endpoints_file)],
        stdout=console, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        _wait(lambda: endpoints_file.exists() or process.poll() is not None, STARTUP_TIMEOUT, "the endpoints file")
        assert process.poll() is None, (directory / "console.log").read_text()
        endpoints = json.loads(endpoints_file.read_text())
        yield {**endpoints, "process": process, "directory": directory}
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        console.close()


def _aws(endpoints: dict[str, Any], service: Literal["ec2", "events", "sqs"]) -> Any:
    """A plain boto3 client, configured only from what the command printed."""
    credentials = endpoints["credentials"]
    return boto3.client(
        service, endpoint_url=endpoints["awsEndpointUrl"], region_name=endpoints["region"],
        aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"], aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=credentials["AWS_SESSION_TOKEN"],
    )


def _core(endpoints: dict[str, Any]) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_config.new_client_from_config(config_file=endpoints["kubeconfig"]))


def _instances(ec2: Any, *states: str) -> list[dict[str, Any]]:
    found = []
    for reservation in ec2.describe_instances()["Reservations"]:
        found += [i for i in reservation["Instances"] if not states or i["State"]["Name"] in states]
    return found


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def test_the_endpoints_are_printed_and_work(emulator: dict[str, Any]) -> None:
    assert set(emulator["queues"]) >= {"pending-pods", "interruption", "launch", "drain", "pending-pods-dlq"}
    sqs = _aws(emulator, "sqs")
    urls = sqs.list_queues()["QueueUrls"]
    assert set(emulator["queues"].values()) <= set(urls)
    nodes = _core(emulator).list_node()
    assert nodes.items == []
    console = (emulator["directory"] / "console.log").read_text()
    assert emulator["awsEndpointUrl"] in console
    assert emulator["kubeconfig"] in console


def test_pods_launch_instances_nodes_join_and_pods_bind(emulator: dict[str, Any]) -> None:
    core = _core(emulator)
    ec2 = _aws(emulator, "ec2")
    core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": NAMESPACE}}))
    for index in range(3):  # time-sliced notebooks: the shared pool buys Spot
        core.create_namespaced_pod(NAMESPACE, k8s.V1Pod.model_validate(notebook_pod(index)))

    def bound() -> list[k8s.V1Pod]:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector="app=notebook").items
        return pods if pods and all(kube_reads.pod_spec(p).node_name for p in pods) else []

    pods = _wait(bound, what="the pods to be bound")
    launched = [i for i in _instances(ec2, "running") if _tags(i).get(TAG_CLAIM)]
    assert launched, "an instance was launched for the claim"
    tags = _tags(launched[0])
    assert tags[TAG_CLUSTER] == "ml-prod"
    assert tags[TAG_NODE_POOL]
    nodes = {kube_reads.name(n): n for n in core.list_node().items}
    claimed = {i["InstanceId"] for i in launched}
    for pod in pods:
        node = nodes[kube_reads.bound_node(pod)]
        assert kube_reads.instance_id(node) in claimed  # the node the kubelet registered runs on a claim's instance
        assert any(c.type == "Ready" and c.status == "True" for c in kube_reads.node_status(node).conditions or ())


def test_a_spot_warning_on_the_bus_drains_and_replaces_the_node(emulator: dict[str, Any]) -> None:
    core = _core(emulator)
    ec2 = _aws(emulator, "ec2")
    by_node = {kube_reads.pod_spec(p).node_name for p in core.list_namespaced_pod(NAMESPACE).items
               if kube_reads.pod_spec(p).node_name}
    nodes = kube_reads.instance_nodes(core.list_node().items)
    spot = [i for i in _instances(ec2, "running")
            if i.get("InstanceLifecycle") == "spot" and nodes.get(i["InstanceId"]) in by_node]
    if not spot:
        pytest.skip("the packer placed the pods on no Spot instance")
    victim = spot[0]["InstanceId"]
    before = {i["InstanceId"] for i in _instances(ec2)}
    _aws(emulator, "events").put_events(Entries=[{
        "Source": "aws.ec2", "DetailType": "EC2 Spot Instance Interruption Warning",
        # As EC2 sends it, with the time it takes the instance; 10 s ahead rather than two minutes (the drain waits
        # for it before terminating).
        "Detail": json.dumps({"instance-id": victim, "instance-action": "terminate", "instance-action-time": (
            datetime.now(UTC) + timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ")}),
        "Resources": [f"arn:aws:ec2:{emulator['region']}:123456789012:instance/{victim}"],
    }])

    def cordoned_or_gone() -> bool:
        node = next((n for n in core.list_node().items if kube_reads.name(n) == nodes[victim]), None)
        return node is None or kube_reads.cordoned(node)

    _wait(cordoned_or_gone, what=f"node {nodes[victim]} to be cordoned")
    _wait(lambda: any(i["InstanceId"] == victim for i in _instances(ec2, "terminated")),
          what=f"{victim} to be drained and terminated")
    _wait(lambda: {i["InstanceId"] for i in _instances(ec2, "running")} - before, what="a replacement instance")
    assert _aws(emulator, "sqs").get_queue_attributes(
        QueueUrl=emulator["queues"]["interruption-dlq"], AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_deleting_the_pods_gives_the_capacity_back(emulator: dict[str, Any]) -> None:
    if "consolidate" in emulator["functionsMissing"]:
        pytest.skip("the consolidate function is not written yet")
    core = _core(emulator)
    ec2 = _aws(emulator, "ec2")
    core.delete_collection_namespaced_pod(NAMESPACE)

    def only_warm_left() -> bool:
        running = _instances(ec2, "running", "pending")
        return all(_tags(i).get(TAG_NODE_POOL) == "gpu-burst" for i in running) and len(running) <= 4

    _wait(only_warm_left, what="the idle capacity to be terminated (window capacity may stay warm)")
    console = (emulator["directory"] / "console.log").read_text()
    assert "λ consolidate" in console
    assert "λ drain" in console


def test_the_process_stops_cleanly_on_ctrl_c(emulator: dict[str, Any]) -> None:
    process: subprocess.Popen[bytes] = emulator["process"]
    assert process.poll() is None, "still running until told to stop"
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0
    assert "stopping" in (emulator["directory"] / "console.log").read_text()

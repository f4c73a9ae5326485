"""A cold interruption function cordons before it builds what only the replacement and the drain need (issue 17).

Each boto3 client loads its service model (EC2's is the largest botocore ships), and a cold start pays for
every client the service builds before the node is cordoned. The cordon needs the configuration (SSM), the
claim (DynamoDB) and the Kubernetes API (an STS-presigned token; EKS only when the configuration has no CA);
the packer, the fleet and the drain queue come after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.domain.interruption import parse_notice
from gpu_autoscaler.services.interruption import aws_interruption_service
from gpu_autoscaler.settings import load_settings
from tests.integration.interruption.conftest import bind_pod, drain_queue, event_body, launch_node

if TYPE_CHECKING:
    from types import ModuleType

    import pytest
    from kubernetes import client

    from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
    from gpu_autoscaler.models.taints import Taint

BEFORE_THE_CORDON = {"ssm", "dynamodb", "sts", "eks"}


class RecordingClients(AwsClients):
    """The real clients, remembering which services were asked for, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[str] = []

    def client(self, service: str) -> Any:
        self.asked.append(service)
        return super().client(service)


def test_a_spot_warning_cordons_before_the_clients_of_the_replacement_and_the_drain_exist(
        aws: EmbeddedAws, kube: LocalKubernetes, store: DynamoStateStore, core: client.CoreV1Api,
        fleet: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    old = launch_node(aws, fleet, kube, store, "gpu-burst-spot-cordon-first")
    assert old.instance_id and old.node_name
    bind_pod(core, old.node_name, "cordon-first-0")
    for key, value in aws.function_environment("interruption").items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    clients = RecordingClients(settings.region, settings.endpoint_url)
    service = aws_interruption_service(settings, clients=clients)
    assert set(clients.asked) <= BEFORE_THE_CORDON, clients.asked

    at_cordon: list[str] = []
    real_cordon = service.cluster.cordon

    def cordon(node_name: str, taint: Taint) -> None:
        at_cordon.extend(clients.asked)
        real_cordon(node_name, taint)

    monkeypatch.setattr(service.cluster, "cordon", cordon)
    notice = parse_notice(event_body("spot-interruption-warning", old.instance_id))
    outcome = service.handle_instance(notice, old.instance_id)

    assert outcome.cordoned and outcome.action == "replace-and-drain" and outcome.replacements
    assert at_cordon and set(at_cordon) <= BEFORE_THE_CORDON, at_cordon
    assert {"ec2", "sqs"} <= set(clients.asked)  # the replacement and the drain request came after the cordon
    assert len(drain_queue(aws, "drain")) == 1 and drain_queue(aws, "launch")  # taken, not left to other tests

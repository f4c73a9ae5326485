"""The consolidate Lambda's reconcile step records a node's boot from what the Kubernetes API shows: the claim's
launch, the Node's Ready condition (`lastTransitionTime`, read through the real `kubernetes` client) and its
GPUs allocatable, into DynamoDB; pre-warm reads them back as the pool's lead time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.cli.invoke import default_functions_dir, handler_path, run_handler
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.boot_times import BOOT_ATTRIBUTE
from gpu_autoscaler.domain.user_data import ClusterBootstrap, node_setup, render_user_data
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes, SimulatedInstance
from gpu_autoscaler.emulator.machines import Gpu, Machine
from gpu_autoscaler.models.claims import ClaimState, NodeClaim, StateTransition
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

POOL = "gpu-burst"
INSTANCE = "i-0b007000000000001"


@pytest.fixture(scope="module")
def kube() -> Iterator[LocalKubernetes]:
    with LocalKubernetes(cluster_name="ml-prod", bookmark_interval=0.2) as local:
        yield local


@pytest.fixture(scope="module")
def config(kube: LocalKubernetes) -> Config:
    data: dict[str, Any] = example_config_data()
    data["kubernetes"] = {"endpoint": kube.url}
    return parse_config(data)


@pytest.fixture(scope="module")
def aws(config: Config, kube: LocalKubernetes) -> Iterator[EmbeddedAws]:
    """The account as the stack leaves it; the cluster replays the functions' EKS tokens against its STS."""
    with EmbeddedAws(config) as embedded:
        kube.authenticator.sts_endpoint = embedded.endpoint_url
        yield embedded


def test_a_joined_nodes_boot_is_recorded_once_in_the_table(aws: EmbeddedAws, kube: LocalKubernetes,
                                                            config: Config) -> None:
    store = DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, config.cluster_name, clock=SystemClock())
    launched = datetime.now(UTC) - timedelta(minutes=3)
    store.create_claim(NodeClaim(
        cluster=config.cluster_name, id="nc-boot", pool=POOL, capacity_type="spot", zones=("us-east-1a",),
        instance_types=("g5.xlarge",), price_per_hour=0.5, state=ClaimState.LAUNCHED, created_at=launched,
        history=(StateTransition(state=ClaimState.LAUNCHED, at=launched, reason="launched"),),
        instance_id=INSTANCE, instance_type="g5.xlarge", zone="us-east-1a",
    ))
    types = {t.name: t for t in Ec2CatalogSource.from_config(aws.clients, config).instance_types()}
    # The node registers from the user data the fleet renders for this type and pool, as the kubelet would.
    bootstrap = ClusterBootstrap(cluster_name=config.cluster_name, endpoint="https://EXAMPLE.eks.amazonaws.com",
                                 family="AL2023", certificate_authority="LS0tLS1CRUdJTg==",
                                 service_cidr="10.100.0.0/16")
    user_data = render_user_data(bootstrap, node_setup(config.pool(POOL), "spot", instance_type=types["g5.xlarge"],
                                                       claim_id="nc-boot", overhead=config.overhead))
    machine = Machine("g5.xlarge", vcpus=4, memory_mib=16384, gpu=Gpu("A10G", "NVIDIA", 1, 22888), max_enis=4,
                      ipv4_per_eni=15, root_volume_gib=100)
    kube.add_instance(SimulatedInstance.from_user_data(INSTANCE, machine, "us-east-1a", user_data,
                                                       capacity_type="spot"))
    kube.reconcile()

    path = handler_path(default_functions_dir(), "consolidate")
    summary = run_handler(path, "consolidate", {"trigger": "rate"}, aws.function_environment("consolidate"),
                          region=config.region)
    assert summary["reconcile"]["registered"] == ["nc-boot"]
    [boot] = summary["reconcile"]["boots"]
    assert (boot["claim"], boot["instanceType"]) == ("nc-boot", "g5.xlarge")
    assert 170 <= boot["readySeconds"] <= boot["gpusSeconds"] <= 240  # the node joined ~3 minutes after launch
    [sample] = store.boot_times(POOL, launched - timedelta(minutes=1))
    assert (sample.claim_id, sample.instance_id, sample.capacity_type) == ("nc-boot", INSTANCE, "spot")
    claim = store.get_claim("nc-boot")
    assert claim is not None and claim.attributes[BOOT_ATTRIBUTE] == f"{sample.to_gpus.total_seconds():.0f}"

    again = run_handler(path, "consolidate", {"trigger": "rate"}, aws.function_environment("consolidate"),
                        region=config.region)
    assert again["reconcile"]["boots"] == []
    assert len(store.boot_times(POOL, launched - timedelta(minutes=1))) == 1

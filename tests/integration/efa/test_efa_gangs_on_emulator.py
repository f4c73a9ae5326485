"""An EFA pool's gang on the emulator, through the strict layer: EFA templates per network-card count, the
pool's placement group, and the security group check (issue 14 defect 6); and what its nodes then offer, as the
emulator's kubelet and EFA device plugin make them from what EC2 launched, against what the packer planned."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.adapters.aws.instance_types import instance_type_from_api
from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.clock import FixedClock, SystemClock
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.packing.fit import allocatable
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.instances import LaunchedInstance
from gpu_autoscaler.emulator.kube_objects import NODES
from gpu_autoscaler.emulator.kubernetes_api import KubeletNodeSide, LocalKubernetes
from gpu_autoscaler.emulator.machines import describe_machine
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.labels import INSTANCE_TYPE
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.models.resources import EFA, HUGEPAGES_2MI, MEMORY, Resources
from gpu_autoscaler.services.fleet import aws_fleet_service
from gpu_autoscaler.settings import load_settings
from tests.conftest import example_config_data
from tests.integration.fleet.helpers import new_claim

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any


@pytest.fixture(scope="module")
def config() -> Config:
    data = example_config_data()
    pool = next(p for p in data["nodePools"] if p["name"] == "gpu-reserved")
    pool["efa"] = True
    return parse_config(data)


@pytest.fixture(scope="module")
def aws(config: Config) -> Iterator[EmbeddedAws]:
    with EmbeddedAws(config) as embedded:
        yield embedded


def claim_store(aws: EmbeddedAws, config: Config) -> DynamoStateStore:
    return DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, config.cluster_name, clock=SystemClock())


def launch(aws: EmbeddedAws, config: Config, prefix: str) -> list[ClaimState]:
    store = claim_store(aws, config)
    ids = [f"{prefix}{i}" for i in range(2)]
    for claim_id in ids:
        new_claim(store, claim_id, pool="gpu-reserved", capacity_type="on-demand", gang=f"training/{prefix}",
                  instance_types=("p4d.24xlarge", "p5.48xlarge"), zones=("us-east-1a",), price_per_hour=32.77)
    service = aws_fleet_service(load_settings(aws.function_environment("fleet")))
    service.launch(LaunchRequest(cluster=config.cluster_name, claim_ids=ids, gang=f"training/{prefix}"))
    states = []
    for claim_id in ids:
        claim = store.get_claim(claim_id)
        assert claim is not None
        states.append(claim.state)
    return states


def test_an_efa_gang_launches_through_the_strict_layer(aws: EmbeddedAws, config: Config) -> None:
    templates = aws.resources.launch_templates
    assert {"on-demand/efa4", "on-demand/efa32"} <= set(templates)
    ec2 = aws.clients.client("ec2")
    [version] = ec2.describe_launch_template_versions(LaunchTemplateId=templates["on-demand/efa4"])[
        "LaunchTemplateVersions"]
    interfaces = version["LaunchTemplateData"]["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
        (0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")]
    assert set(aws.resources.placement_groups) == {f"gpu-reserved/{z}" for z in config.zones}
    assert launch(aws, config, "efa-gang") == [ClaimState.LAUNCHED, ClaimState.LAUNCHED]


def booted_nodes(aws: EmbeddedAws, config: Config, prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """Launch a gang of two and boot its instances on the emulator's cluster, from nothing but what EC2 says of
    them (KubeletNodeSide): (instance id, the Node as served once its device plugins have run)."""
    assert launch(aws, config, prefix) == [ClaimState.LAUNCHED, ClaimState.LAUNCHED]
    store = claim_store(aws, config)
    ec2 = aws.clients.client("ec2")
    clock = FixedClock(datetime(2026, 11, 29, 12, 0, tzinfo=UTC))
    out = []
    with LocalKubernetes(clock=clock, run_controllers=False) as kube:
        nodes = KubeletNodeSide(kube, ec2)
        for claim_id in (f"{prefix}0", f"{prefix}1"):
            claim = store.get_claim(claim_id)
            assert claim is not None and claim.instance_id is not None
            [described] = ec2.describe_instances(InstanceIds=[claim.instance_id])["Reservations"][0]["Instances"]
            nodes.boot(LaunchedInstance.from_description(described))
        for _ in range(3):
            kube.reconcile()
            clock.advance(timedelta(seconds=30))
        for instance_id, name in kube.kubelets.instances().items():
            out.append((instance_id, kube.api.get(NODES, "", name)))
    return out


def test_an_efa_gangs_nodes_offer_what_the_packer_planned(aws: EmbeddedAws, config: Config) -> None:
    """The instances have the EFAs their template attached (DescribeInstances), their kubelets the huge pages the
    AMI pre-allocates with an EFA attached, and the memory left once those are taken: at least the plan."""
    ec2 = aws.clients.client("ec2")
    pool = config.pool("gpu-reserved")
    daemonsets = Resources.from_quantities(config.overhead.daemonsets)
    for instance_id, node in booted_nodes(aws, config, "efa-nodes"):
        machine, described = describe_machine(ec2, instance_id)
        [raw] = ec2.describe_instance_types(InstanceTypes=[described["InstanceType"]])["InstanceTypes"]
        planned = allocatable(instance_type_from_api(raw, {}), pool, config.overhead) + daemonsets
        assert machine.efa_devices == planned[EFA] > 0
        offered = Resources.from_quantities(node["status"]["allocatable"])
        assert offered[HUGEPAGES_2MI] >= planned[HUGEPAGES_2MI] > 0
        assert offered[MEMORY] >= planned[MEMORY]


def test_with_the_shipped_plugin_values_an_efa_gangs_nodes_advertise_the_efas_planned(
        aws: EmbeddedAws, config: Config) -> None:
    """The nodes carry the pool's `nvidia.com/gpu` taint and the gang's `gpu-autoscaler/gang` taint; the EFA device
    plugin installed with agent/deploy/efa-device-plugin/values.yaml runs there all the same, so the pods that
    ask for `vpc.amazonaws.com/efa` find it (and the nodes initialize: domain/initialization.py waits for it)."""
    ec2 = aws.clients.client("ec2")
    pool = config.pool("gpu-reserved")
    for _, node in booted_nodes(aws, config, "efa-plugin"):
        [raw] = ec2.describe_instance_types(InstanceTypes=[node["metadata"]["labels"][INSTANCE_TYPE]])[
            "InstanceTypes"]
        planned = allocatable(instance_type_from_api(raw, {}), pool, config.overhead)
        assert {t["key"] for t in node["spec"]["taints"]} == {"nvidia.com/gpu", "gpu-autoscaler/gang"}
        assert Resources.from_quantities(node["status"]["allocatable"])[EFA] == planned[EFA] > 0


def test_without_the_self_rule_the_pool_says_why_it_cannot_launch(aws: EmbeddedAws, config: Config) -> None:
    ec2 = aws.clients.client("ec2")
    for group in aws.security_group_ids.values():
        ec2.revoke_security_group_ingress(GroupId=group, IpPermissions=[
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}])
    assert launch(aws, config, "efa-closed") == [ClaimState.TERMINATED, ClaimState.TERMINATED]

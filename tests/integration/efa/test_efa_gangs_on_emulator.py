"""An EFA pool's gang on the emulator, through the strict layer: EFA templates per network-card count, the
pool's placement group, and the security group check (issue 14 defect 6)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.services.fleet import aws_fleet_service
from gpu_autoscaler.settings import load_settings
from tests.conftest import example_config_data
from tests.integration.fleet.helpers import new_claim

if TYPE_CHECKING:
    from collections.abc import Iterator


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


def launch(aws: EmbeddedAws, config: Config, prefix: str) -> list[ClaimState]:
    store = DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, config.cluster_name,
                             clock=SystemClock())
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


def test_without_the_self_rule_the_pool_says_why_it_cannot_launch(aws: EmbeddedAws, config: Config) -> None:
    ec2 = aws.clients.client("ec2")
    for group in aws.security_group_ids.values():
        ec2.revoke_security_group_ingress(GroupId=group, IpPermissions=[
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}])
    assert launch(aws, config, "efa-closed") == [ClaimState.TERMINATED, ClaimState.TERMINATED]

"""What the packer plans on a node is what the node offers: kubelet reservations, on the emulator.

The packer's side is the project's own: the instance type as its catalog adapter reads EC2's
DescribeInstanceTypes, `allocatable()` for the pool, and the user data the fleet request carries for it.
The node's side is the emulator's: the machine EC2 (moto) launched, and the simulated kubelet that
computes allocatable from that machine and the user data alone, with the EKS AMIs' defaults for anything
the user data leaves out.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from moto import mock_aws

from gpu_autoscaler.adapters.aws.instance_types import instance_type_from_api
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.fleet import Attempt, LaunchContext, build_request
from gpu_autoscaler.domain.launch_templates import ebs_api, pool_block_device_mappings
from gpu_autoscaler.domain.packing.fit import allocatable
from gpu_autoscaler.emulator.kubelet import SimulatedInstance
from gpu_autoscaler.emulator.machines import describe_machine
from gpu_autoscaler.models.claims import NodeClaim
from gpu_autoscaler.models.resources import EPHEMERAL_STORAGE, Resources
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.emulator.machines import Machine
    from gpu_autoscaler.models.catalog import InstanceType

CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode()
TYPES = ("g4dn.xlarge", "g5.12xlarge", "g5.48xlarge", "p4d.24xlarge")
COMPARED = ("cpu", "memory", "pods")


@pytest.fixture(scope="module")
def ec2_facts() -> Iterator[dict[str, tuple[InstanceType, Machine]]]:
    """Per type: the packer's view (catalog adapter) and the launched machine's (EC2 DescribeInstances)."""
    with mock_aws():
        ec2: Any = boto3.client("ec2", region_name="us-east-1")
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        facts: dict[str, tuple[InstanceType, Machine]] = {}
        for raw in ec2.describe_instance_types(InstanceTypes=list(TYPES))["InstanceTypes"]:
            name = raw["InstanceType"]
            instance_id = ec2.run_instances(ImageId=image, InstanceType=name, MinCount=1,
                                            MaxCount=1)["Instances"][0]["InstanceId"]
            machine, _ = describe_machine(ec2, instance_id)
            facts[name] = (instance_type_from_api(raw, {}), machine)
        yield facts


def config_for(family: str, overhead: dict[str, Any] | None = None) -> Config:
    data = example_config_data()
    data["ami"]["family"] = family
    data["kubernetes"].update({"certificateAuthority": CA, "serviceCidr": "10.100.0.0/16"})
    if overhead is not None:
        data["overhead"] = overhead
    return parse_config(data)


def launched_user_data(config: Config, pool_name: str, instance_type: InstanceType) -> str:
    """The user data the fleet request launches a node of this type with (the real request builder)."""
    pool = config.pool(pool_name)
    claim = NodeClaim(cluster=config.cluster_name, id="claim-1", pool=pool.name, capacity_type="on-demand",
                      zones=("us-east-1a",), instance_types=(instance_type.name,), price_per_hour=1.0,
                      created_at=datetime(2026, 11, 24, tzinfo=UTC))
    context = LaunchContext.from_config(config, "lt-0123456789abcdef0", instance_types=[instance_type])
    request = build_request([claim], pool, Attempt(1, "on-demand", ((instance_type.name, "us-east-1a"),)), context)
    [launch] = request.launch_configs
    return launch.user_data


def node_allocatable(config: Config, pool_name: str, name: str,
                     facts: dict[str, tuple[InstanceType, Machine]]) -> tuple[Resources, Resources]:
    """(what the node's kubelet reports, what the packer plans room for plus the daemonsets it counted)."""
    instance_type, machine = facts[name]
    user_data = launched_user_data(config, pool_name, instance_type)
    node = SimulatedInstance.from_user_data("i-0aaa", machine, "us-east-1a", user_data)
    reported = node.allocatable
    assert reported is not None
    daemonsets = Resources.from_quantities(config.overhead.daemonsets)
    planned = allocatable(instance_type, config.pool(pool_name), config.overhead) + daemonsets
    return (Resources({k: reported.get(k, 0) for k in COMPARED}),
            Resources({k: planned.get(k, 0) for k in COMPARED}))


@pytest.mark.parametrize("family", ["AL2023", "Bottlerocket"])
@pytest.mark.parametrize("name", TYPES)
def test_the_node_offers_what_the_packer_planned(
        family: str, name: str, ec2_facts: dict[str, tuple[InstanceType, Machine]]) -> None:
    """The default overhead: the Node's allocatable is the packer's room for pods plus the daemonsets'
    requests (those are pods the node runs, not kubelet reservations)."""
    reported, planned = node_allocatable(config_for(family), "gpu-burst", name, ec2_facts)
    assert reported == planned


@pytest.mark.parametrize("family", ["AL2023", "Bottlerocket"])
def test_a_configured_overhead_reaches_the_node_too(
        family: str, ec2_facts: dict[str, tuple[InstanceType, Machine]]) -> None:
    overhead = {"daemonsets": {"cpu": "500m", "memory": "1Gi"},
                "kubeReserved": {"cpu": "250m", "memory": "2Gi"},
                "systemReserved": {"cpu": "100m", "memory": "512Mi"}}
    reported, planned = node_allocatable(config_for(family, overhead), "gpu-burst", "p4d.24xlarge", ec2_facts)
    assert reported == planned


@pytest.mark.parametrize("family", ["AL2023", "Bottlerocket"])
@pytest.mark.parametrize("volume", ["20Gi", "100Gi", "1000Gi", "16Ti"])
def test_the_node_has_the_ephemeral_storage_the_packer_planned(family: str, volume: str) -> None:
    """The node launched with the pool's volumes (what the fleet request maps for it) offers at least the
    ephemeral-storage the packer planned: the emulated kubelet counts the filesystem its OS made on the volume."""
    data = config_for(family).model_dump(by_alias=True, exclude_none=True)
    for pool_data in data["nodePools"]:
        pool_data["ephemeralStorage"] = volume
    config = parse_config(data)
    pool = config.pool("gpu-burst")
    with mock_aws():
        ec2: Any = boto3.client("ec2", region_name="us-east-1")
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        raw = ec2.describe_instance_types(InstanceTypes=["g5.12xlarge"])["InstanceTypes"][0]
        instance_id = ec2.run_instances(
            ImageId=image, InstanceType="g5.12xlarge", MinCount=1, MaxCount=1,
            BlockDeviceMappings=ebs_api(pool_block_device_mappings(config, pool)))["Instances"][0]["InstanceId"]
        machine, _ = describe_machine(ec2, instance_id)
    instance_type = instance_type_from_api(raw, {})
    node = SimulatedInstance.from_user_data("i-0aaa", machine, "us-east-1a",
                                            launched_user_data(config, pool.name, instance_type))
    assert node.allocatable is not None
    planned = allocatable(instance_type, pool, config.overhead)[EPHEMERAL_STORAGE]
    assert 0 < planned <= node.allocatable[EPHEMERAL_STORAGE]


@pytest.mark.parametrize("family", ["AL2023", "Bottlerocket"])
def test_no_volume_size_gets_more_ephemeral_storage_planned_than_its_filesystem_holds(family: str) -> None:
    """From EC2's smallest volumes to gp3's 16 TiB (every GiB to 2 TiB, the ext4 journal's and XFS log's steps
    among them), the planned capacity never exceeds what the emulated kubelet reports for the volume."""
    from gpu_autoscaler.domain.packing.filesystem import filesystem_bytes
    from gpu_autoscaler.emulator.filesystems import kubelet_filesystem_bytes

    for gib in [*range(1, 2049), *range(2048, 16 * 1024 + 1, 64)]:
        volume = gib * 2**30
        assert filesystem_bytes(volume) <= kubelet_filesystem_bytes(family, volume), gib

"""`gpu-autoscaler snapshot` on the embedded moto: the builder instance, the pulls sent through SSM Run Command,
the data-volume snapshot, and the clean-up, checked in what moto recorded.

Not testable here: moto has no SSM inventory (the agent-online wait is handed in) and runs no command (each
invocation is recorded as Success), so no image is pulled; a failing pull is played by a client whose
GetCommandInvocation answers Failed."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.aws.data_volume_snapshot import (
    BUILDER_TAG,
    DATA_DEVICE,
    SnapshotError,
    SnapshotRequest,
    build_data_volume_snapshot,
    pull_command,
)
from gpu_autoscaler.config import parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.config import Config

PUBLIC = "nvcr.io/nvidia/pytorch:24.10-py3"
PRIVATE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/team/train:v7"


def bottlerocket_config() -> dict[str, Any]:
    data = example_config_data()
    data["ami"] = {"family": "Bottlerocket", "version": "1.50.0", "x86_64": "ami-0123456789abcdef0"}
    return data


@pytest.fixture(scope="module")
def config() -> Config:
    return parse_config(bottlerocket_config())


@pytest.fixture(scope="module")
def aws(config: Config) -> Iterator[EmbeddedAws]:
    with EmbeddedAws(config) as embedded:
        yield embedded


def make_request(aws: EmbeddedAws, config: Config, **changes: Any) -> SnapshotRequest:
    values: dict[str, Any] = {
        "cluster": config.cluster_name, "images": (PUBLIC, PRIVATE), "ami": config.ami.x86_64,
        "subnet_id": aws.zone_subnets["us-east-1a"], "security_group_ids": tuple(aws.security_group_ids.values()),
        "volume_gib": 150, "soci": True,
    }
    values.update(changes)
    return SnapshotRequest(**values)


def instance(aws: EmbeddedAws, instance_id: str) -> dict[str, Any]:
    [reservation] = aws.clients.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
    found: dict[str, Any] = reservation["Instances"][0]
    return found


def test_the_snapshot_is_of_the_builders_data_volume_after_every_pull(aws: EmbeddedAws, config: Config) -> None:
    result = build_data_volume_snapshot(aws.clients, make_request(aws, config), sleep=lambda _: None,
                                        agent_online=lambda _: True, progress=lambda _: None)
    ec2, ssm = aws.clients.client("ec2"), aws.clients.client("ssm")
    builder = instance(aws, result.instance_id)
    assert builder["State"]["Name"] == "terminated"
    assert {t["Key"]: t["Value"] for t in builder["Tags"]}[BUILDER_TAG] == config.cluster_name
    assert {t["Key"] for t in builder["Tags"]} >= {"gpu-autoscaler/cluster", BUILDER_TAG}  # ours, but no node
    user_data = ec2.describe_instance_attribute(InstanceId=result.instance_id, Attribute="userData")
    settings = base64.b64decode(user_data["UserData"]["Value"]).decode()
    assert "[settings.host-containers.admin]\nenabled = true" in settings and 'snapshotter = "soci"' in settings
    [snapshot] = ec2.describe_snapshots(SnapshotIds=[result.snapshot_id])["Snapshots"]
    assert snapshot["State"] == "completed" and snapshot["VolumeSize"] == 150
    commands = {c["CommandId"]: c for c in ssm.list_commands()["Commands"]}
    pulls = [commands[c]["Parameters"]["commands"][0] for c in result.commands]
    assert pulls[0] == pull_command(PUBLIC, soci=True)
    assert pulls[0].startswith("apiclient exec admin sheltie ctr --address /run/containerd/containerd.sock "
                               "--namespace k8s.io images pull --label io.cri-containerd.image=managed "
                               "--snapshotter soci")
    assert "--user AWS:" in pulls[1] and pulls[1].endswith(PRIVATE)  # an ECR token of the image's region
    assert result.block_device_mapping() == {"deviceName": DATA_DEVICE, "ebs": {
        "volumeSize": "150Gi", "volumeType": "gp3", "snapshotId": result.snapshot_id, "encrypted": True,
        "deleteOnTermination": True}}


class FailingPulls:
    """The clients of the embedded AWS, but SSM's GetCommandInvocation answers Failed (what moto cannot play)."""

    def __init__(self, aws: EmbeddedAws) -> None:
        self.aws = aws

    def client(self, service: str) -> Any:
        real = self.aws.clients.client(service)
        if service != "ssm":
            return real

        class Ssm:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def get_command_invocation(self, **kwargs: Any) -> dict[str, Any]:
                return {"Status": "Failed", "StandardErrorContent": "ctr: failed to resolve reference: not found"}

        return Ssm()

    def for_region(self, region: str) -> Any:
        return self.aws.clients.for_region(region)


def test_a_failed_pull_stops_the_build_and_the_builder_is_terminated(aws: EmbeddedAws, config: Config) -> None:
    launched: list[str] = []
    with pytest.raises(SnapshotError, match="pulling nvcr.io/nvidia/pytorch:24.10-py3 ended Failed: ctr: failed"):
        build_data_volume_snapshot(FailingPulls(aws), make_request(aws, config),  # type: ignore[arg-type]
                                   sleep=lambda _: None, agent_online=lambda _: True, progress=launched.append)
    instance_id = launched[0].split()[1]
    assert instance(aws, instance_id)["State"]["Name"] == "terminated"


def test_an_image_that_is_not_bottlerocket_is_refused_before_any_launch(aws: EmbeddedAws, config: Config) -> None:
    ec2 = aws.clients.client("ec2")
    al2023 = ec2.register_image(Name="amazon-eks-node-al2023-x86_64-nvidia-1.31-v20261101", RootDeviceName="/dev/xvda",
                                BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 20}}])["ImageId"]
    before = len(ec2.describe_instances()["Reservations"])
    with pytest.raises(SnapshotError, match="is not a Bottlerocket AMI"):
        build_data_volume_snapshot(aws.clients, make_request(aws, config, ami=al2023), progress=lambda _: None)
    with pytest.raises(SnapshotError, match="ami-0aaaaaaaaaaaaaaa0"):
        build_data_volume_snapshot(aws.clients, make_request(aws, config, ami="ami-0aaaaaaaaaaaaaaa0"),
                                   progress=lambda _: None)
    assert len(ec2.describe_instances()["Reservations"]) == before


def test_an_agent_that_never_comes_online_times_out(aws: EmbeddedAws, config: Config) -> None:
    ticks = iter(range(0, 10_000, 5))
    with pytest.raises(SnapshotError, match="timed out after 60 s waiting for the SSM agent"):
        build_data_volume_snapshot(aws.clients, make_request(aws, config, timeout=60.0), sleep=lambda _: None,
                                   clock=lambda: float(next(ticks)), agent_online=lambda _: False,
                                   progress=lambda _: None)


def test_the_builder_launches_in_an_account_that_puts_tags_in_instance_metadata(aws: EmbeddedAws,
                                                                                config: Config) -> None:
    """Its tag keys hold a `/`: with the account-level default `InstanceMetadataTags=enabled` EC2 would refuse the
    launch (strict layer) unless the builder turns tags in metadata off itself."""
    ec2 = aws.clients.client("ec2")
    ec2.modify_instance_metadata_defaults(InstanceMetadataTags="enabled")
    try:
        result = build_data_volume_snapshot(aws.clients, make_request(aws, config), sleep=lambda _: None,
                                            agent_online=lambda _: True, progress=lambda _: None)
    finally:
        ec2.modify_instance_metadata_defaults(InstanceMetadataTags="no-preference")
    assert instance(aws, result.instance_id)["MetadataOptions"]["InstanceMetadataTags"] == "disabled"

"""`gpu-autoscaler snapshot --image IMG ...`: a Bottlerocket data-volume EBS snapshot holding those images.

Give its snapshot id to a pool's `blockDeviceMappings` (the entry is printed), and the pool's nodes boot with
the images on disk. The procedure is `adapters.aws.data_volume_snapshot`'s. With `--aws` it runs in the
configuration's region with the default credentials (the builder instance needs an instance profile with
AmazonSSMManagedInstanceCore: `--instance-profile`). Without it, it runs on the embedded moto: every call is
made and checked, but moto runs no SSM agent, so no image is pulled and the snapshot is of an empty volume.
"""

from __future__ import annotations

import json
from pathlib import Path  # noqa: TC003 (Typer reads the annotations at run time)
from typing import TYPE_CHECKING, Annotated

import typer

from gpu_autoscaler.adapters.aws.data_volume_snapshot import (
    SnapshotError,
    SnapshotRequest,
    build_data_volume_snapshot,
    images_of,
)
from gpu_autoscaler.cli.common import Output, OutputOption, choose_output, emit
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import ConfigError, load_config
from gpu_autoscaler.models.images import parse_image_reference

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.adapters.aws.data_volume_snapshot import SnapshotResult
    from gpu_autoscaler.config import Config

__all__ = ["snapshot_command"]


@app.command("snapshot")
def snapshot_command(
    image: Annotated[
        list[str] | None, typer.Option("--image", help="an image to put on the volume; repeatable")
    ] = None,
    images_file: Annotated[
        Path | None, typer.Option("--images-file", help="a file of image references, one a line", exists=True,
                                  dir_okay=False)
    ] = None,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON file holding the configuration object (default: cdk.json)")
    ] = None,
    aws: Annotated[bool, typer.Option("--aws", help="real AWS with the default credentials")] = False,
    ami: Annotated[str | None, typer.Option("--ami", help="Bottlerocket AMI (default: the configuration's)")] = None,
    subnet: Annotated[str | None, typer.Option("--subnet", help="subnet (default: the configuration's first)")] = None,
    instance_type: Annotated[str, typer.Option("--instance-type", help="the builder's type")] = "m6i.2xlarge",
    volume_size: Annotated[int, typer.Option("--volume-size", help="data volume, GiB", min=20, max=16384)] = 100,
    instance_profile: Annotated[
        str | None, typer.Option("--instance-profile", help="instance profile with AmazonSSMManagedInstanceCore")
    ] = None,
    soci: Annotated[bool, typer.Option("--soci", help="the pool uses the SOCI snapshotter (`soci: true`)")] = False,
    keep_instance: Annotated[bool, typer.Option("--keep-instance", help="leave the builder to look at")] = False,
    output: OutputOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="deprecated: -o json", hidden=True)] = False,
) -> None:
    """Build a Bottlerocket data-volume snapshot with IMAGES pulled onto it, for a pool's blockDeviceMappings."""
    try:
        config = load_config(config_file)
        images = tuple(image or ()) + (images_of(images_file.read_text().splitlines()) if images_file else ())
        for reference in images:
            parse_image_reference(reference)
    except (ConfigError, ValueError) as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    if not images:
        raise typer.BadParameter("give at least one --image or an --images-file", param_hint="--image")
    chosen_ami = ami or (config.ami.x86_64 if config.ami.family == "Bottlerocket" else None)
    if chosen_ami is None:
        raise typer.BadParameter("the data-volume layout is Bottlerocket's and ami.family is AL2023: give a "
                                 "Bottlerocket AMI", param_hint="--ami")
    if aws and not instance_profile:
        raise typer.BadParameter("the builder needs an instance profile for SSM Run Command",
                                 param_hint="--instance-profile")
    chosen = choose_output(output, "json" if as_json else None, flag="--json")
    say: Callable[[str], None] = ((lambda _: None) if chosen is not Output.table
                                  else (lambda text: typer.echo(text, err=True)))

    def request(subnet_id: str, groups: tuple[str, ...]) -> SnapshotRequest:
        return SnapshotRequest(cluster=config.cluster_name, images=images, ami=chosen_ami, subnet_id=subnet_id,
                               security_group_ids=groups, instance_type=instance_type, volume_gib=volume_size,
                               instance_profile=instance_profile, soci=soci, keep_instance=keep_instance)

    try:
        if aws:
            result = _on_aws(config, request(subnet or _first_subnet(config), tuple(config.network.security_groups)),
                             say)
        else:
            result = _on_emulator(config, subnet, request, say)
    except SnapshotError as error:
        typer.echo(f"snapshot failed: {error}", err=True)
        raise typer.Exit(1) from None
    _report(result, images, emulated=not aws, output=chosen)


def _first_subnet(config: Config) -> str:
    return config.network.subnets[config.zones[0]]


def _on_aws(config: Config, request: SnapshotRequest, say: Callable[[str], None]) -> SnapshotResult:
    from gpu_autoscaler.adapters.aws.clients import AwsClients

    return build_data_volume_snapshot(AwsClients(config.region), request, progress=say)


def _on_emulator(config: Config, subnet: str | None, request: Callable[[str, tuple[str, ...]], SnapshotRequest],
                 say: Callable[[str], None]) -> SnapshotResult:
    from gpu_autoscaler.emulator.aws import EmbeddedAws

    with EmbeddedAws(config) as embedded:
        clients: AwsClients = embedded.clients
        subnet_id = embedded.subnet_ids.get(subnet or _first_subnet(config), subnet or "")
        groups = tuple(embedded.security_group_ids.values())
        say(f"on the embedded AWS at {embedded.endpoint_url}: moto runs no SSM agent, so nothing is pulled")
        # moto has no SSM inventory (DescribeInstanceInformation): the agent is taken as online at once.
        return build_data_volume_snapshot(clients, request(subnet_id, groups), sleep=lambda _: None,
                                          agent_online=lambda _: True, progress=say)


def _report(result: SnapshotResult, images: tuple[str, ...], *, emulated: bool, output: Output) -> None:
    mapping = result.block_device_mapping()

    def table() -> None:
        typer.echo(f"snapshot {result.snapshot_id} holds {len(images)} image(s)"
                   + (" (emulated: the volume is empty)" if emulated else ""))
        typer.echo("add to the pool's blockDeviceMappings:")
        typer.echo(json.dumps(mapping, indent=2))

    emit({"snapshotId": result.snapshot_id, "instanceId": result.instance_id, "images": list(images),
          "emulated": emulated, "blockDeviceMapping": mapping}, output, table)

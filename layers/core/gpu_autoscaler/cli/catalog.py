"""`gpu-autoscaler catalog`: every GPU offering of a region, with its price and shape, smallest first.

Without `--aws` or `--endpoint-url` it runs on moto in-process: EC2's instance types and zone offerings
come from moto's bundled copy of the real API data, prices from the bundled snapshots (moto has no
Pricing API and only a placeholder spot price), so the emulator's catalog covers the regions the on-demand
snapshot covers (`PriceSnapshot.on_demand_regions`, us-east-1 today). `--endpoint-url` points at a running
emulator; `--aws` uses the default credentials against real AWS. The region: `--region`, else AWS_REGION,
else AWS_DEFAULT_REGION, else the configuration's, else us-east-1.
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager, nullcontext
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import boto3
import typer
from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.adapters.aws.pricing import PriceSnapshot, PricesUnavailable
from gpu_autoscaler.cli.common import (
    EXIT_INPUT,
    OutputOption,
    aws_session,
    choose_output,
    configure_logging,
    default_region,
    emit,
    fail,
)
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import ConfigError, load_config

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog

__all__ = ["JSON_KEYS", "catalog_command", "filter_rows", "offering_rows"]

JSON_KEYS = (
    "instanceType", "zone", "capacityType", "pricePerHour", "gpus", "gpuModel", "gpuMemoryMiB", "vcpu",
    "memoryMiB", "maxPods",
)


class Format(StrEnum):
    """`--format`: the deprecated spelling of `-o/--output`."""

    json = "json"
    table = "table"


class CapacityType(StrEnum):
    spot = "spot"
    on_demand = "on-demand"
    reserved = "reserved"


def offering_rows(catalog: Catalog) -> list[dict[str, Any]]:
    """One row per GPU offering, smallest first: by GPUs, GPU memory, vCPU, then price, type, zone, capacity."""
    rows: list[dict[str, Any]] = []
    for offering in catalog.offerings(gpu_only=True):
        t = catalog.instance_type(offering.instance_type)
        rows.append({
            "instanceType": t.name,
            "zone": offering.zone,
            "capacityType": offering.capacity_type,
            "pricePerHour": round(offering.price_per_hour, 10),
            "gpus": int(t.gpus) if t.gpus.is_integer() else t.gpus,
            "gpuModel": t.gpu_model,
            "gpuMemoryMiB": t.gpu_memory_mib,
            "vcpu": t.vcpu,
            "memoryMiB": t.memory_mib,
            "maxPods": t.max_pods,
        })
    order = {"reserved": 0, "spot": 1, "on-demand": 2}
    rows.sort(key=lambda r: (r["gpus"], r["gpuMemoryMiB"], r["vcpu"], r["memoryMiB"], r["instanceType"], r["zone"],
                             order[r["capacityType"]], r["pricePerHour"]))
    return rows


def filter_rows(
    rows: list[dict[str, Any]], *, gpu: str | None = None, family: str | None = None,
    capacity_type: str | None = None, zone: str | None = None,
) -> list[dict[str, Any]]:
    """Rows matching every filter given: GPU model (case-insensitive, `h100`), family (`g6`), capacity type, zone."""
    return [
        r for r in rows
        if (gpu is None or r["gpuModel"].lower() == gpu.lower())
        and (family is None or r["instanceType"].split(".")[0] == family.lower())
        and (capacity_type is None or r["capacityType"] == capacity_type)
        and (zone is None or r["zone"] == zone)
    ]


def _load_config(path: Path | None) -> Config | None:
    """`--config FILE`, else the `cdk.json` of the working directory if there is one, else none."""
    if path is None and not Path("cdk.json").exists():
        return None
    return load_config(path)


def _backend(
    aws: bool, endpoint_url: str | None, region: str
) -> tuple[AbstractContextManager[Any], boto3.session.Session | None]:
    if aws:
        return nullcontext(), aws_session(region)
    if endpoint_url:
        if "AWS_ACCESS_KEY_ID" in os.environ:
            return nullcontext(), None
        # An emulator accepts any credentials; a machine without an AWS account has none.
        return nullcontext(), boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        from moto import mock_aws
    except ImportError:
        raise typer.BadParameter(
            "running without --aws needs moto (pip install 'gpu-autoscaler[dev]'), or give --endpoint-url"
        ) from None
    return mock_aws(), None


def _print_table(rows: list[dict[str, Any]], region: str, price_source: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"GPU offerings in {region}", caption=f"on-demand prices: {price_source}")
    headers = [
        ("instance type", "instanceType"), ("zone", "zone"), ("capacity", "capacityType"),
        ("USD/h", "pricePerHour"), ("GPUs", "gpus"), ("GPU model", "gpuModel"), ("GPU MiB", "gpuMemoryMiB"),
        ("vCPU", "vcpu"), ("memory MiB", "memoryMiB"), ("max pods", "maxPods"),
    ]
    numeric = {"pricePerHour", "gpus", "gpuMemoryMiB", "vcpu", "memoryMiB", "maxPods"}
    for title, key in headers:
        table.add_column(title, justify="right" if key in numeric else "left")
    for row in rows:
        table.add_row(*(
            f"{row[key]:.4f}" if key == "pricePerHour" else f"{row[key]:g}" if key == "gpus" else str(row[key])
            for _, key in headers
        ))
    Console(width=160).print(table)


@app.command("catalog")
def catalog_command(
    region: Annotated[
        str | None, typer.Option("--region", help="AWS region (default: AWS_REGION, AWS_DEFAULT_REGION, the "
                                 "configuration's, us-east-1); the emulator covers us-east-1")
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU model, e.g. h100, l4")] = None,
    family: Annotated[str | None, typer.Option("--family", help="instance family, e.g. g6")] = None,
    capacity_type: Annotated[CapacityType | None, typer.Option("--capacity-type", help="spot, on-demand or "
                                                               "reserved")] = None,
    zone: Annotated[str | None, typer.Option("--zone", help="availability zone, e.g. us-east-1a")] = None,
    output: OutputOption = None,
    legacy_format: Annotated[Format | None, typer.Option("--format", hidden=True)] = None,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON file holding the configuration object")
    ] = None,
    aws: Annotated[bool, typer.Option("--aws", help="real AWS with the default credentials")] = False,
    endpoint_url: Annotated[str | None, typer.Option("--endpoint-url", help="an emulator's AWS endpoint")] = None,
) -> None:
    """Every GPU offering of a region, smallest first: type, zone, capacity type, USD/h, GPUs, shape."""
    if aws and endpoint_url:
        raise typer.BadParameter("give --aws or --endpoint-url, not both")
    chosen_output = choose_output(output, legacy_format.value if legacy_format else None)
    try:
        config = _load_config(config_file)
    except ConfigError as error:
        raise fail(str(error), EXIT_INPUT) from None
    chosen_region = default_region(region, config.region if config else None)
    if not aws and not endpoint_url:
        covered = PriceSnapshot.load().on_demand_regions
        if chosen_region not in covered:
            raise fail(f"the emulator's catalog covers {', '.join(covered)} (the regions of its bundled price "
                       f"snapshot), not {chosen_region}; give --aws for another region", EXIT_INPUT)
    # Price-source notes are for operators of a deployment; on the emulator the sources are in the table's caption.
    configure_logging(logging.WARNING if aws else logging.ERROR)
    context, session = _backend(aws, endpoint_url, chosen_region)
    with context:
        clients = AwsClients(chosen_region, endpoint_url, session=session)
        source = Ec2CatalogSource.from_config(clients, config)
        try:
            catalog = source.catalog()
        except PricesUnavailable as error:
            raise fail(str(error)) from None
        except (BotoCoreError, ClientError) as error:
            raise fail(f"{chosen_region}: {error}") from None
    rows = filter_rows(offering_rows(catalog), gpu=gpu, family=family,
                       capacity_type=capacity_type.value if capacity_type else None, zone=zone)
    emit(rows, chosen_output, lambda: _print_table(rows, chosen_region, source.on_demand_source))

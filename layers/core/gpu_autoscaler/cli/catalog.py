"""`gpu-autoscaler catalog`: every GPU offering of a region, with its price and shape.

Without `--aws` or `--endpoint-url` it runs on moto in-process: EC2's instance types and zone offerings
come from moto's bundled copy of the real API data, prices from the bundled snapshots (moto has no
Pricing API and only a placeholder spot price). `--endpoint-url` points at a running emulator;
`--aws` uses the default credentials against real AWS.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import boto3
import typer

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.adapters.aws.pricing import PricesUnavailable
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import ConfigError, load_config

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog

__all__ = ["JSON_KEYS", "catalog_command", "offering_rows"]

JSON_KEYS = (
    "instanceType", "zone", "capacityType", "pricePerHour", "gpus", "gpuModel", "gpuMemoryMiB", "vcpu",
    "memoryMiB", "maxPods",
)
DEFAULT_REGION = "us-east-1"


class Format(StrEnum):
    json = "json"
    table = "table"


def offering_rows(catalog: Catalog) -> list[dict[str, Any]]:
    """One row per GPU offering, ordered by instance type, zone and capacity type."""
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
    rows.sort(key=lambda r: (r["instanceType"], r["zone"], order[r["capacityType"]], r["pricePerHour"]))
    return rows


def _load_config(path: Path | None) -> Config | None:
    """`--config FILE`, else the `cdk.json` of the working directory if there is one, else none."""
    if path is None and not Path("cdk.json").exists():
        return None
    return load_config(path)


def _backend(aws: bool, endpoint_url: str | None) -> tuple[AbstractContextManager[Any], boto3.session.Session | None]:
    if aws:
        return nullcontext(), None
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
        str | None, typer.Option("--region", help="AWS region (default: the configuration's, or us-east-1)")
    ] = None,
    output: Annotated[Format, typer.Option("--format", help="json or table")] = Format.table,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON file holding the configuration object")
    ] = None,
    aws: Annotated[bool, typer.Option("--aws", help="real AWS with the default credentials")] = False,
    endpoint_url: Annotated[str | None, typer.Option("--endpoint-url", help="an emulator's AWS endpoint")] = None,
) -> None:
    """Every GPU offering of a region: instance type, zone, capacity type, USD/h, GPUs and shape."""
    if aws and endpoint_url:
        raise typer.BadParameter("give --aws or --endpoint-url, not both")
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        config = _load_config(config_file)
    except ConfigError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    chosen_region = region or (config.region if config else DEFAULT_REGION)
    context, session = _backend(aws, endpoint_url)
    with context:
        clients = AwsClients(chosen_region, endpoint_url, session=session)
        source = Ec2CatalogSource.from_config(clients, config)
        try:
            catalog = source.catalog()
        except PricesUnavailable as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(1) from None
    rows = offering_rows(catalog)
    if output is Format.json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        _print_table(rows, chosen_region, source.on_demand_source)

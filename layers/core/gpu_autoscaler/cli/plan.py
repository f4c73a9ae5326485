"""`gpu-autoscaler plan --pods FILE`: the packing decision as a dry run, with no AWS account.

The catalog is the configuration's region as the Lambdas would see it, read through the same
`Ec2CatalogSource` on moto in-process: instance types and zones from moto's bundled copy of the EC2 API
data, prices from the bundled snapshots. Nothing is stored or launched; no claim is in flight, nothing is
marked unavailable.
"""

from __future__ import annotations

import gc
import json
import logging
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path  # noqa: TC003 (Typer reads the annotations at run time)
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError

from gpu_autoscaler.cli.common import (
    EXIT_INPUT,
    EXIT_PARTIAL,
    Output,
    OutputOption,
    choose_output,
    configure_logging,
    describe_validation,
    emit,
    fail,
    note,
)
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.config import ConfigError, load_config
from gpu_autoscaler.domain.packing.solver import Solver
from gpu_autoscaler.models.pods import PendingPodsDocument

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.domain.packing.results import Plan

__all__ = ["offline_catalog", "plan_command", "read_pods"]


class Format(StrEnum):
    """`--format`: the deprecated spelling of `-o/--output`."""

    json = "json"
    table = "table"


def offline_catalog(config: Config) -> Catalog:
    """The configuration's region and zones, from moto's EC2 data and the bundled price snapshots (kept
    on disk between runs: see `catalog_cache`)."""
    from gpu_autoscaler.cli.catalog_cache import cached_catalog

    def build() -> Catalog:
        from moto import mock_aws

        from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
        from gpu_autoscaler.adapters.aws.clients import AwsClients

        with mock_aws():
            source = Ec2CatalogSource.from_config(AwsClients(config.region), config, use_pricing_api=False)
            return source.catalog()

    return cached_catalog(config, build)


def read_pods(path: Path, config: Config) -> PendingPodsDocument:
    """A pending-pods document; a bare JSON list of pods is accepted as the document's `pods`.

    The bytes go to pydantic's own JSON parser in one call (half the time of `json.loads` and then
    validating the Python objects, on 10,000 pods). A bare list is wrapped as the text of a document, so
    its errors name `pods[i]` as a document's do. Not JSON: a `ValidationError` of type `json_invalid`.
    """
    raw = path.read_bytes()
    if raw.lstrip()[:1] == b"[":
        head = json.dumps({"schemaVersion": 1, "cluster": config.cluster_name, "sentAt": "1970-01-01T00:00:00Z"})
        raw = head[:-1].encode() + b', "pods": ' + raw + b"}"
    return PendingPodsDocument.model_validate_json(raw)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a document is read and planned, back as it was after.

    Ten thousand pods and their plan are new objects that all live until the command ends, so each of the
    collector's passes meanwhile finds nothing to free, yet the full ones walk every object the imports made:
    a sixth of the command's time on 10,000 pods. Reference counting still frees everything else.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _print_table(plan: Plan, document: PendingPodsDocument) -> None:
    from rich.console import Console
    from rich.table import Table

    names = {p.uid: p.key for p in document.pods}
    console = Console(width=160)
    claims = Table(title=f"plan: {len(plan.claims)} new node claims, {plan.total_price_per_hour:.4f} USD/h")
    for title in ("claim", "pool", "capacity", "zones", "instance types (cheapest first)", "USD/h", "pods"):
        claims.add_column(title, justify="right" if title == "USD/h" else "left")
    for claim in plan.claims:
        types = ", ".join(claim.instance_types[:3]) + (f" +{len(claim.instance_types) - 3}"
                                                       if len(claim.instance_types) > 3 else "")
        pods = ", ".join(names.get(u, u) for u in claim.pods[:2]) + (f" +{len(claim.pods) - 2}"
                                                                     if len(claim.pods) > 2 else "")
        claims.add_row(claim.id + (f"\ngang {claim.gang}" if claim.gang else ""), claim.pool, claim.capacity_type,
                       ", ".join(claim.zones), types, f"{claim.price_per_hour:.4f}", pods)
    console.print(claims)
    if plan.unschedulable:
        table = Table(title=f"{len(plan.unschedulable)} pods cannot be placed")
        table.add_column("pod")
        table.add_column("reason")
        for item in plan.unschedulable:
            table.add_row(item.name, item.reason)
        console.print(table)


@app.command("plan")
def plan_command(
    pods: Annotated[Path, typer.Option("--pods", help="pending-pods document (JSON)", exists=True, dir_okay=False)],
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON file holding the configuration object (default: cdk.json)")
    ] = None,
    output: OutputOption = None,
    legacy_format: Annotated[Format | None, typer.Option("--format", hidden=True)] = None,
) -> None:
    """The packing decision for a pending-pods document, as a dry run: new claims and unschedulable pods.
    Exits 3 when a pod cannot be placed."""
    chosen_output = choose_output(output, legacy_format.value if legacy_format else None)
    configure_logging(logging.ERROR)
    try:
        config = load_config(config_file)
    except ConfigError as error:
        raise fail(str(error), EXIT_INPUT) from None
    catalog = offline_catalog(config)  # before the collector pauses: a first build runs moto
    with _collector_paused():
        _plan_and_print(pods, config, catalog, chosen_output)


def _plan_and_print(pods: Path, config: Config, catalog: Catalog, chosen_output: Output) -> None:
    try:
        document = read_pods(pods, config)
    except ValidationError as error:
        invalid = [e for e in error.errors() if e["type"] == "json_invalid"]
        if invalid:
            raise fail(f"{pods}: not valid JSON ({invalid[0].get('ctx', {}).get('error', invalid[0]['msg'])})",
                       EXIT_INPUT) from None
        *first, last = describe_validation(error)
        for line in first:
            typer.echo(f"error: {pods}: not a pending-pods document: {line}", err=True)
        raise fail(f"{pods}: not a pending-pods document: {last}", EXIT_INPUT) from None
    if document.cluster != config.cluster_name:
        note(f"note: the document is for cluster '{document.cluster}', the configuration for "
             f"'{config.cluster_name}'; planning with the configuration")
    plan = Solver(config, catalog, SystemClock()).solve(document.pods)
    emit(plan.to_json(), chosen_output, lambda: _print_table(plan, document))
    if plan.unschedulable:
        raise typer.Exit(EXIT_PARTIAL)

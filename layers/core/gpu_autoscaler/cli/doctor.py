"""`gpu-autoscaler doctor`: preflight checks of an account against the configuration, before and after `cdk deploy`.

One line per check, pass / warn / fail, with the fix (`gpu_autoscaler.cli.doctor_checks`, `doctor_access`). Without
`--aws` it checks a fresh embedded AWS provisioned as the stack would find an account (all should pass, except what
the emulator cannot answer, which warns and says so, and a reservation the configuration names by id alone, which a
fresh account does not hold); `--endpoint-url` checks a running emulator; `--aws` the account of the default
credentials. Exit code 3 when a check fails, 2 when the configuration is invalid.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path  # noqa: TC003 (Typer reads the annotations at run time)
from typing import TYPE_CHECKING, Annotated

import typer
from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.adapters.aws.pricing import PricesUnavailable
from gpu_autoscaler.cli.common import (
    EXIT_INPUT,
    EXIT_PARTIAL,
    Output,
    OutputOption,
    aws_session,
    configure_logging,
    emit,
    fail,
)
from gpu_autoscaler.cli.doctor_checks import run_checks
from gpu_autoscaler.cli.doctor_context import Check, DoctorContext
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import ConfigError, load_config
from gpu_autoscaler.naming import ResourceNames

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog

__all__ = ["doctor_command"]

_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}


@contextlib.contextmanager
def _context(config: Config, aws: bool, endpoint_url: str | None) -> Iterator[tuple[DoctorContext, str]]:
    profile = ResourceNames(config.cluster_name).instance_profile(config.region)
    if aws:
        clients = AwsClients(config.region, session=aws_session(config.region))
        yield DoctorContext(config, clients, _catalog(clients, config, pricing=True), instance_profile=profile), \
            f"AWS {config.region}"
        return
    from gpu_autoscaler.emulator.aws import EmbeddedAws

    with contextlib.ExitStack() as stack:
        embedded = EmbeddedAws.attach(config, endpoint_url) if endpoint_url else stack.enter_context(
            EmbeddedAws(config))
        resources = embedded.resources
        ctx = DoctorContext(config, embedded.clients, _catalog(embedded.clients, config, pricing=False),
                            subnet_ids=resources.subnet_ids, security_group_ids=resources.security_group_ids,
                            instance_profile=profile)
        yield ctx, f"the emulator at {embedded.endpoint_url}"


def _catalog(clients: AwsClients, config: Config, *, pricing: bool) -> Catalog | None:
    try:
        return Ec2CatalogSource.from_config(clients, config, use_pricing_api=pricing).catalog()
    except (PricesUnavailable, BotoCoreError, ClientError) as error:
        logging.getLogger(__name__).error("catalog: %s", error)
        return None


def _print(results: list[Check], where: str) -> None:
    typer.echo(f"gpu-autoscaler doctor — {where}")
    for check in results:
        line = f"{_MARK[check.status]}  {check.name}: {check.detail}"
        if check.fix and check.status != "pass":
            line += f"\n      fix: {check.fix}"
        typer.echo(line)
    counts = {s: sum(c.status == s for c in results) for s in ("pass", "warn", "fail")}
    typer.echo(f"{counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed")


@app.command("doctor")
def doctor_command(
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON file holding the configuration object (default: cdk.json)")
    ] = None,
    aws: Annotated[bool, typer.Option("--aws", help="the account of the default credentials")] = False,
    endpoint_url: Annotated[
        str | None, typer.Option("--endpoint-url", help="a running emulator's AWS endpoint")
    ] = None,
    output: OutputOption = None,
) -> None:
    """Preflight: configuration, offerings, vCPU quotas, Spot role, subnets, AMIs, node role, access entries, the
    cluster's API endpoint and authentication mode, EFA security groups, capacity reservations, the
    default EBS key. Exits 3 when a check fails."""
    if aws and endpoint_url:
        raise typer.BadParameter("give --aws or --endpoint-url, not both")
    configure_logging(logging.ERROR)
    try:
        config = load_config(config_file)
    except ConfigError as error:
        typer.echo(f"FAIL  configuration: {error}", err=True)
        raise typer.Exit(EXIT_INPUT) from None
    try:
        with _context(config, aws, endpoint_url) as (ctx, where):
            results = [Check("configuration", "pass", f"valid: cluster {config.cluster_name}, {config.region}, "
                             f"{len(config.node_pools)} pools"), *run_checks(ctx)]
    except (BotoCoreError, ClientError, LookupError) as error:
        raise fail(str(error)) from None
    emit([c.as_json() for c in results], output or Output.table, lambda: _print(results, where))
    if any(c.status == "fail" for c in results):
        raise typer.Exit(EXIT_PARTIAL)

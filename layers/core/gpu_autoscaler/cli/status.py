"""`gpu-autoscaler status`: what the autoscaler is doing now, per pool, and `status --cost`: who it is spending for.

Reads the deployment's table, EC2 and the queues (a running emulator with `--endpoint-url`, or a deployment with
`--aws`) and, where reachable, the Kubernetes API (`--kubeconfig`, which `gpu-autoscaler emulator` prints; with
`--aws` the configured endpoint with an EKS token, as the functions reach it). Reads only. The numbers are computed
in `gpu_autoscaler.cli.status_report`.
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path  # noqa: TC003 (Typer reads the annotations at run time)
from typing import TYPE_CHECKING, Annotated, Any

import typer
from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.cli.account import read_account
from gpu_autoscaler.cli.common import (
    EXIT_INPUT,
    Output,
    OutputOption,
    aws_session,
    configure_logging,
    emit,
    fail,
    note,
)
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.cli.status_report import cost_report, status_report
from gpu_autoscaler.config import ConfigError, load_config
from gpu_autoscaler.errors import GpuAutoscalerError

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.emulator.resources import StackResources
    from gpu_autoscaler.ports import ClusterAPI

__all__ = ["status_command"]


class CostBy(StrEnum):
    namespace = "namespace"
    label = "label"


def _connect(config: Config, aws: bool, endpoint_url: str | None) -> tuple[AwsClients, StackResources]:
    from gpu_autoscaler.emulator.resources import discover

    if aws:
        clients = AwsClients(config.region, session=aws_session(config.region))
        return clients, discover(clients, config)
    from gpu_autoscaler.emulator.aws import EmbeddedAws

    assert endpoint_url is not None
    attached = EmbeddedAws.attach(config, endpoint_url)
    return attached.clients, attached.resources


def _cluster(config: Config, clients: AwsClients, aws: bool, kubeconfig: Path | None) -> ClusterAPI | None:
    from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster

    if kubeconfig is not None:
        from kubernetes import config as kube_config

        return KubernetesCluster(kube_config.new_client_from_config(config_file=str(kubeconfig)))
    if aws:
        return KubernetesCluster.for_eks(config, clients)
    return None


def _print_status(report: dict[str, Any], where: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"gpu-autoscaler status — {where}, {report['usdPerHour']:.2f} USD/h")
    for title in ("pool", "claims", "nodes", "GPUs phys/slots/alloc", "USD/h", "warm (why)", "in flight (age)",
                  "interruptions/consolidations 1h"):
        table.add_column(title, justify="right" if title in ("nodes", "USD/h") else "left", overflow="fold")
    for pool, row in report["pools"].items():
        gpus = row["gpus"]
        table.add_row(
            pool, ", ".join(f"{n} {s}" for s, n in sorted(row["claims"].items())) or "-",
            "-" if row["nodes"] is None else str(row["nodes"]),
            "-" if gpus is None else f"{gpus['physical']}/{gpus['slots']}/{gpus['allocated']}",
            f"{row['usdPerHour']:.2f}", ", ".join(f"{w['claim']} ({w['why']})" for w in row["warm"]) or "-",
            ", ".join(f"{c['claim']} {c['state']} {c['ageSeconds']:.0f}s" for c in row["inFlight"]) or "-",
            f"{row['interruptionsLastHour']}/{row['consolidationsLastHour']}",
        )
    console = Console(width=max(Console().width, 120))
    console.print(table)
    pending = report["pendingGpuPods"]
    console.print("pending GPU pods: " + ("unknown (no Kubernetes API: give --kubeconfig)" if pending is None else
                  f"{pending['count']}" + (f", oldest {pending['oldestSeconds']:.0f} s" if pending["count"] else "")))
    console.print("instances: " + (", ".join(f"{n} {s}" for s, n in sorted(report["instances"].items())) or "none"))
    console.print("dead letters: " + ", ".join(f"{q} {n}" for q, n in report["deadLetters"].items()))


def _print_cost(report: dict[str, Any], where: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cost by {report['by']} — {where}, {report['totalUsdPerHour']:.2f} USD/h")
    for title in ("team", "USD/h", "USD/day"):
        table.add_column(title, justify="left" if title == "team" else "right")
    for row in report["teams"]:
        table.add_row(row["team"], f"{row['usdPerHour']:.4f}", f"{row['usdPerDay']:.2f}")
    table.add_row("[dim]idle (requested by no pod)[/]", f"{report['idle']['usdPerHour']:.4f}",
                  f"{report['idle']['usdPerDay']:.2f}")
    Console().print(table)
    if report["nodesWithoutPrice"]:
        note(f"note: no live claim prices {', '.join(report['nodesWithoutPrice'])} (not ours): left out")


def _once(config: Config, aws: bool, endpoint_url: str | None, kubeconfig: Path | None, cost: bool,
          by: CostBy, key: str | None) -> dict[str, Any]:
    clients, resources = _connect(config, aws, endpoint_url)
    snapshot = read_account(clients, resources)
    cluster = _cluster(config, clients, aws, kubeconfig)
    nodes = pods = None
    if cluster is not None:
        try:
            nodes, pods = cluster.list_nodes(), cluster.list_pods()
        except GpuAutoscalerError as error:
            note(f"note: Kubernetes API not reachable ({error}); showing what AWS holds")
    if cost:
        if nodes is None or pods is None:
            raise fail("--cost needs the Kubernetes API (pods and their requests): give --kubeconfig, or --aws")
        return cost_report(snapshot.claims, nodes, pods, by=by.value, key=key)
    return status_report(snapshot, nodes, pods, datetime.now(UTC))


@app.command("status")
def status_command(
    endpoint_url: Annotated[
        str | None, typer.Option("--endpoint-url", help="a running emulator's AWS endpoint")
    ] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="the cluster's kubeconfig (the emulator prints its own)",
                                  exists=True, dir_okay=False)
    ] = None,
    aws: Annotated[bool, typer.Option("--aws", help="the deployment on AWS, default credentials")] = False,
    cost: Annotated[bool, typer.Option("--cost", help="USD per hour and day by team, idle apart")] = False,
    by: Annotated[CostBy, typer.Option("--by", help="with --cost: namespace, or label (give its KEY)")] = (
        CostBy.namespace),
    key: Annotated[str | None, typer.Argument(help="with --by label: the pod label naming the team")] = None,
    watch: Annotated[
        float | None, typer.Option("--watch", "-w", min=1, help="refresh every N seconds until Ctrl-C")
    ] = None,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON file holding the configuration object (default: cdk.json)")
    ] = None,
    output: OutputOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="same as -o json")] = False,
) -> None:
    """What it is doing now per pool (claims, GPUs, USD/h, warm capacity, claims in flight, pending pods,
    interruptions, dead letters); with --cost, USD by namespace or label."""
    if aws == bool(endpoint_url):
        raise fail("give --endpoint-url URL (a running emulator; `gpu-autoscaler emulator` prints it) or --aws",
                   EXIT_INPUT)
    if by is CostBy.label and not key:
        raise fail("--by label needs the label KEY, e.g. `status --cost --by label team`", EXIT_INPUT)
    chosen = output or (Output.json if as_json else Output.table)
    configure_logging(logging.ERROR)
    try:
        config = load_config(config_file)
    except ConfigError as error:
        raise fail(str(error), EXIT_INPUT) from None
    where = f"AWS {config.region}" if aws else f"emulator {endpoint_url}"
    while True:
        try:
            report = _once(config, aws, endpoint_url, kubeconfig, cost, by, key)
        except (BotoCoreError, ClientError, LookupError) as error:
            raise fail(str(error)) from None
        if watch and chosen is Output.table:
            typer.echo("\033[2J\033[H", nl=False)  # clear the terminal between refreshes
        emit(report, chosen, functools.partial(_print_cost if cost else _print_status, report, where))
        if not watch:
            return
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return

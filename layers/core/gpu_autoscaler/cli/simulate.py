"""`gpu-autoscaler simulate --trace FILE --out DIR`: replay a job trace through the same decision code.

No AWS account: the catalog is the configuration's region as `plan` reads it (moto's EC2 data and the bundled
price snapshots). Writes `report.json` and the plots (`gpus.png`, `cost.png`, `waits.png`) into DIR and
prints the comparison table. See `gpu_autoscaler.simulation` for the model.
"""

from __future__ import annotations

import logging
import sys
from enum import StrEnum
from pathlib import Path  # noqa: TC003 (Typer reads the annotations at run time)
from typing import TYPE_CHECKING, Annotated

import typer

from gpu_autoscaler.cli.common import Output, OutputOption, emit, note
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import ConfigError, load_config
from gpu_autoscaler.simulation.policies import KNOWN_POLICIES, OPTIONAL_POLICIES, POLICY_NAMES, default_policies
from gpu_autoscaler.simulation.settings import BootTimesError, SimulationSettings, read_boot_times
from gpu_autoscaler.simulation.trace import TraceError, read_trace

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.simulation.report import SimulationReport
    from gpu_autoscaler.simulation.trace import Trace

__all__ = ["simulate_command"]


class TraceFormat(StrEnum):
    alibaba = "alibaba-v2023"
    csv = "csv"


@app.command("simulate")
def simulate_command(
    trace: Annotated[Path, typer.Option("--trace", help="trace file", exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option("--out", help="directory for report.json and the plots", file_okay=False)],
    trace_format: Annotated[TraceFormat, typer.Option(
        "--format", help="trace format: alibaba-v2023, or csv (columns: see the README)")] = TraceFormat.alibaba,
    output: OutputOption = None,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON file holding the configuration object (default: cdk.json)")
    ] = None,
    policy: Annotated[
        list[str] | None, typer.Option("--policy", help=f"repeatable; default: {', '.join(POLICY_NAMES)}, and "
                                                          f"{', '.join(OPTIONAL_POLICIES)} where a pool time-slices "
                                                          "GPUs and a pod asks for part of one")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="seeds Spot interruptions and capacity errors")] = 0,
    boot_seconds: Annotated[float, typer.Option("--boot-seconds", help="launch to Ready, seconds", min=0)] = 300.0,
    boot_times: Annotated[
        Path | None, typer.Option("--boot-times", help="JSON list of measured boot samples (the state store's "
                                  "shape): each launch draws its type's boot from them", exists=True, dir_okay=False)
    ] = None,
    capacity_error_rate: Annotated[
        float, typer.Option("--insufficient-capacity-rate", help="chance per override per CreateFleet", min=0, max=1)
    ] = 0.02,
    fixed_type: Annotated[
        str | None, typer.Option("--fixed-instance-type", help="fixed-node-group's type (default: fits most pods)")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="replay only the first N GPU pods", min=1)] = None,
    from_day: Annotated[float | None, typer.Option("--from-day", help="only pods arriving from this trace day",
                                                   min=0)] = None,
    to_day: Annotated[float | None, typer.Option("--to-day", help="only pods arriving before this trace day",
                                                 min=0)] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="processes (default: one per core)", min=1)] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="write the PNG plots")] = True,
) -> None:
    """Replay a GPU job trace under each policy through the packer, fleet, interruption, consolidation and
    pre-warm code the Lambdas run; report cost, waits and allocation against a clairvoyant lower bound."""
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("gpu_autoscaler").setLevel(logging.ERROR)
    unknown = [p for p in policy or () if p not in KNOWN_POLICIES]
    if unknown:
        raise typer.BadParameter(f"unknown policy {', '.join(unknown)}; known: {', '.join(KNOWN_POLICIES)}",
                                 param_hint="--policy")
    try:
        config = load_config(config_file)
        replay = read_trace(trace, trace_format.value)
        measured = read_boot_times(boot_times) if boot_times is not None else {}
    except (ConfigError, TraceError, BootTimesError) as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    if from_day is not None or to_day is not None:
        replay = replay.between((from_day or 0.0) * 86400, to_day * 86400 if to_day is not None else float("inf"))
    if limit is not None:
        replay = replay.head(limit)
    if not replay.pods:
        typer.echo(f"{trace}: no GPU pods to replay", err=True)
        raise typer.Exit(2)
    chosen = list(dict.fromkeys(policy or default_policies(config, replay.pods)))
    settings = SimulationSettings(seed=seed, boot_seconds=boot_seconds, insufficient_capacity_rate=capacity_error_rate,
                                  fixed_instance_type=fixed_type, boot_times=measured)
    out.mkdir(parents=True, exist_ok=True)
    report = _run(replay, config, chosen, settings, workers)
    path = out / "report.json"
    report.write(path)
    written = [path]
    if plots:
        from gpu_autoscaler.simulation.plots import write_plots

        written += write_plots(report, out)
    from rich.console import Console

    console = Console(width=140)
    emit(report.to_json(), output or Output.table, lambda: report.print_table(console))
    note(f"wrote {', '.join(str(p) for p in written)} ({report.seconds:.1f} s)")


def _run(replay: Trace, config: Config, policies: list[str], settings: SimulationSettings,
         workers: int | None) -> SimulationReport:
    """The simulation under a Rich progress bar: one line for the catalog, one per policy (simulated time)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from gpu_autoscaler.simulation.run import simulate, simulation_catalog

    with Progress(TextColumn("{task.description:<20}"), BarColumn(), TextColumn("{task.percentage:>3.0f} %"),
                  TimeElapsedColumn(), transient=True) as progress:
        catalog_task = progress.add_task("catalog", total=1)
        catalog = simulation_catalog(config)
        progress.update(catalog_task, completed=1)
        tasks = {name: progress.add_task(name, total=1.0) for name in policies}
        return simulate(replay, config, policies=policies, settings=settings, catalog=catalog,
                        progress=lambda name, fraction: progress.update(tasks[name], completed=fraction),
                        workers=workers)

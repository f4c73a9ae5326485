"""`gpu-autoscaler demo [-o json|yaml]`: the end-to-end story on the emulator, narrated, in under a minute.

Starts the emulator (moto, the local Kubernetes API, the functions, the agent) with the demo's tuning of the
configuration, tells the story (`gpu_autoscaler.emulator.demo`) as a timeline, and ends with a summary
table. With `-o json` (or the deprecated `--json`) the same comes out as one JSON document whose `summary`
holds `podsPlaced`, `instancesLaunched`, `interruptionsHandled`, `interruptionEvents`, `physicalGpus`, `speed`
and `deadLetters`, among others.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path  # noqa: TC003 (Typer reads the annotations at run time)
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpu_autoscaler.cli.common import EXIT_INPUT, Output, OutputOption, choose_output, emit, fail
from gpu_autoscaler.cli.emulator import file_logging
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import ConfigError, load_config

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.emulator.demo import DemoResult, TimelineEntry

__all__ = ["demo_command", "run_demo"]

_STYLES = {"story": "bold", "lambda": "cyan", "ec2": "yellow", "node": "green", "pods": "magenta",
           "missing": "bold red"}


def run_demo(
    base: Config, *, log_dir: Path, on_entry: Any = None, speed: float | None = None, step_timeout: float = 20.0,
) -> DemoResult:
    """Start an emulator for the demo configuration, tell the story, stop; the result holds everything seen."""
    # The emulator (moto, the Kubernetes side) loads only when the demo runs, not with every command.
    from gpu_autoscaler.emulator.demo import DemoStory
    from gpu_autoscaler.emulator.demo_workload import DEMO_SPEED, DEMO_VISIBILITY_TIMEOUT, demo_config
    from gpu_autoscaler.emulator.session import EmulatorSession

    config = demo_config(base, datetime.now(UTC))
    with file_logging(log_dir / "functions.log") as log_stream:
        session = EmulatorSession(
            config, port=0, speed=speed or DEMO_SPEED, state_dir=log_dir, log_stream=log_stream,
            agent_resync_seconds=5.0, poll_wait_seconds=1, visibility_timeout=DEMO_VISIBILITY_TIMEOUT,
        )
        with session:
            assert session.catalog is not None
            story = DemoStory(session, session.catalog, on_entry=on_entry, step_timeout=step_timeout)
            return story.run()


@app.command("demo")
def demo_command(
    output: OutputOption = None,
    legacy_json: Annotated[bool, typer.Option("--json", hidden=True)] = False,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON file holding the configuration object (default: cdk.json)")
    ] = None,
    log_dir: Annotated[
        Path | None, typer.Option("--log-dir", help="keep the function log and kubeconfig here (default: temp)")
    ] = None,
) -> None:
    """The end-to-end story on the embedded emulator: burst, Spot interruption, pre-warm, consolidation."""
    chosen = choose_output(output, "json" if legacy_json else None, flag="--json")
    as_json = chosen is not Output.table
    try:
        base = load_config(config_file)
    except ConfigError as error:
        raise fail(str(error), EXIT_INPUT) from None
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    with contextlib.ExitStack() as stack:
        directory = log_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-autoscaler-demo-")))
        directory.mkdir(parents=True, exist_ok=True)
        if not as_json:
            console.print(f"[bold]gpu-autoscaler demo[/] — cluster {base.cluster_name}, {base.region}, on the embedded "
                          "emulator; starting it…")
        result = run_demo(base, log_dir=directory, on_entry=None if as_json else _printer(console))
    emit(result.as_json(), chosen, lambda: _print_summary(console, result))


def _printer(console: Console) -> Any:
    def show(entry: TimelineEntry) -> None:
        style = _STYLES.get(entry.kind, "")
        text = entry.text.replace("[", r"\[")
        console.print(f"[dim]{entry.seconds:6.1f}s[/] [{style}]{text}[/]" if style else f"{entry.seconds:6.1f}s {text}")

    return show


def _print_summary(console: Console, result: DemoResult) -> None:
    s = result.summary
    table = Table(title="Summary", show_header=True, header_style="bold")
    table.add_column("measure")
    table.add_column("value", overflow="fold")
    table.add_row("pods placed", f"{s['podsPlaced']} of {s['podsCreated']} created")
    ttc = s["timeToCapacitySeconds"]
    speed = s.get("speed", 1)
    table.add_row("time to capacity", (f"{ttc:.1f} s (burst created → every pod bound; emulator time: node boots "
                                       f"run {speed:g}× faster than on EC2)") if ttc is not None else "not reached")
    table.add_row("instances launched", f"{s['instancesLaunched']} ({s['instancesRunning']} running at the end): "
                  + ", ".join(f"{n}× {t}" for t, n in sorted(s["instanceTypes"].items())))
    usd = s["usdPerHour"]
    series = " → ".join(f"{p['usdPerHour']:.2f}@{p['t']:.0f}s" for p in usd["samples"][:12])
    table.add_row("USD/h over time", f"peak {usd['peak']:.2f}, end {usd['end']:.2f}; {series}")
    alloc = s["gpuAllocation"]
    physical = s.get("physicalGpus", {})
    table.add_row("GPUs", f"{physical.get('launched', '?')} physical GPUs launched; peak "
                  f"{alloc['peakGpus']} GPU slots advertised (time-sliced GPUs count once per replica)")
    table.add_row("GPU allocation", f"peak {alloc['peakAllocated']} of {alloc['peakGpus']} slots allocated; "
                  f"mean {alloc['meanAllocation']:.0%} while nodes were up")
    spot = s["spotWarning"]
    spot_text = (f"{spot.get('instance')}: cordoned {spot.get('cordoned')}, terminated {spot.get('terminated')}"
                 + (f" after {spot['seconds']:.1f} s" if "seconds" in spot else "")) if spot else "not run"
    kinds = ", ".join(f"{n}× {kind}" for kind, n in s.get("interruptionEvents", {}).items()) or "none"
    table.add_row("interruption events", f"{kinds}; {s['interruptionsHandled']} handled by the interruption "
                  f"function (Spot warning {spot_text})")
    calls = ", ".join(f"{f} {v['invocations']}×/{v['records']} rec/{v['failures']} failed"
                      for f, v in s["invocations"].items())
    table.add_row("function invocations", calls)
    letters = s["deadLetters"]
    table.add_row("dead-letter queues", "empty" if not letters else
                  f"{letters} message(s): " + "; ".join(f"{d['queue']}: {d['body'][:80]}"
                                                       for d in s["deadLetterMessages"]))
    if s["functionsMissing"]:
        table.add_row("[red]not written yet[/]", ", ".join(s["functionsMissing"]))
    table.add_row("duration", f"{s['durationSeconds']:.1f} s")
    console.print(table)

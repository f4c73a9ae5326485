"""The `gpu-autoscaler` command line: one module per command, registered here.

The root takes the flags every command shares (`--verbose`, `--quiet`, `--version`); each command takes
`-o/--output json|yaml|table` (`gpu_autoscaler.cli.common`). `--install-completion` sets up shell completion.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpu_autoscaler.cli.common import Verbosity, set_verbosity

app = typer.Typer(
    name="gpu-autoscaler",
    help="Serverless capacity manager for Kubernetes GPU nodes on AWS. "
    "Every command runs on the embedded emulator unless given --aws.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80},
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("gpu-autoscaler")
    except PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gpu-autoscaler {_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="show logs (the handlers', the emulator's)")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="only the result and errors")] = False,
    version: Annotated[
        bool, typer.Option("--version", help="print the version and exit", callback=_print_version, is_eager=True)
    ] = False,
) -> None:
    if verbose and quiet:
        raise typer.BadParameter("give --verbose or --quiet, not both")
    set_verbosity(Verbosity.verbose if verbose else Verbosity.quiet if quiet else Verbosity.normal)


# Each command module registers itself on `app` when imported: one entry per command. A run imports
# only the module of the command it names (the others pull in boto3, moto, the simulator: seconds of
# imports `plan` does not need); help, completion and anything else import them all.
COMMANDS = ("catalog", "demo", "doctor", "emulator", "invoke", "plan", "simulate", "snapshot", "status")


def _register(argv: list[str]) -> None:
    import importlib

    named = next((a for a in argv[1:] if not a.startswith("-")), None)
    wanted = [named] if named in COMMANDS and not any(a.startswith("--install-completion")
                                                      or a.startswith("--show-completion") for a in argv) else COMMANDS
    for name in wanted:
        importlib.import_module(f"gpu_autoscaler.cli.{name}")


_register(sys.argv if Path(sys.argv[0]).name == "gpu-autoscaler" else [])

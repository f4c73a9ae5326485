"""The `gpu-autoscaler` command line: one module per command, registered here.

The root takes the flags every command shares (`--verbose`, `--quiet`, `--version`); each command takes
`-o/--output json|yaml|table` (`gpu_autoscaler.cli.common`). `--install-completion` sets up shell completion.
"""

from __future__ import annotations

import atexit
import gc
import os
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


def _as_command(argv: list[str]) -> bool:
    """Whether this process is the `gpu-autoscaler` command (not a test or a program importing the app)."""
    return bool(argv) and Path(argv[0]).name == "gpu-autoscaler"


def _prepare_the_command(argv: list[str]) -> None:
    """Import the named command's modules with the collector off, then freeze them; freeze again at exit;
    OpenBLAS on one thread, pydantic's plugins off.

    A command's process is short-lived and what it imports lives until it ends: the modules, their
    classes, the validators pydantic builds for the configuration's models. Collecting while they are
    imported (some eighty young-generation passes for `plan`: 20-35 ms) frees next to nothing, and each
    later full pass would walk them all again; frozen, they are left out of collections. At exit, what
    the command built (10,000 pods, their plan) is frozen too: the interpreter's shutdown runs full
    collections over every object before the operating system takes the memory back whole (~60 ms of
    `plan` on 10,000 pods). Reference counting still frees frozen objects; only cyclic garbage is kept
    (made while importing: a bounded amount, once) or left unfinalized at exit (as Python never promises
    to finalize it; the commands close their files with `with`, and the standard streams are flushed as
    always).

    OpenBLAS (numpy's linear algebra) is held to one thread unless the user says otherwise: loaded with
    numpy, its worker threads spin for 50-110 ms of CPU waiting for work no command gives them (the packer's
    matrix products are small, integer ones never reach BLAS): up to a sixth of `plan`'s CPU on 10,000 pods,
    and a core taken from it on a busy machine. OpenBLAS reads the variable once, when numpy loads it. Likewise
    pydantic's plugins are off unless PYDANTIC_DISABLE_PLUGINS says otherwise: looking for them reads the
    metadata of every installed distribution when the first model is built (~5 ms), and no command uses one.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        _register(argv)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
    atexit.register(gc.freeze)


if _as_command(sys.argv):
    _prepare_the_command(sys.argv)
else:
    _register([])

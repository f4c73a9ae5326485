"""The `gpu-autoscaler` command line: one module per command, registered here."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gpu-autoscaler",
    help="Serverless capacity manager for Kubernetes GPU nodes on AWS. "
    "Every command runs on the embedded emulator unless given --aws.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    # A callback keeps `app` a group of subcommands even while only one command is registered.
    pass


# Each command module registers itself on `app` when imported: one line per command.
# isort: off
from gpu_autoscaler.cli import catalog  # noqa: E402, F401
from gpu_autoscaler.cli import demo  # noqa: E402, F401
from gpu_autoscaler.cli import emulator  # noqa: E402, F401
from gpu_autoscaler.cli import invoke  # noqa: E402, F401
from gpu_autoscaler.cli import plan  # noqa: E402, F401
from gpu_autoscaler.cli import simulate  # noqa: E402, F401
from gpu_autoscaler.cli import snapshot  # noqa: E402, F401
# isort: on

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

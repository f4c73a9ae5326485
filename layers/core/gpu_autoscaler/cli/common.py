"""What every command shares: `-o/--output`, the verbosity flags, one-line errors, the default region, sessions.

A command prints its result on stdout in the chosen format and everything else (notes, logs, errors) on stderr,
so `gpu-autoscaler plan ... -o json | jq` always parses. Errors are one line, `error: ...`, never a traceback.

Exit codes (a script can rely on them; the README lists them):
0 done; 1 the command failed (AWS refused, the handler raised, the emulator could not start);
2 bad input (configuration, pods document, event file, options); 3 done, but not everything succeeded
(`plan`: a pod cannot be placed; `invoke`: records failed; `doctor`: a check failed).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic_core import to_json

if TYPE_CHECKING:
    from collections.abc import Callable

    import boto3

from gpu_autoscaler.models.validation import describe_validation

__all__ = [
    "EXIT_FAILED",
    "EXIT_INPUT",
    "EXIT_PARTIAL",
    "Output",
    "OutputOption",
    "Verbosity",
    "aws_session",
    "choose_output",
    "configure_logging",
    "default_region",
    "describe_validation",
    "emit",
    "fail",
    "note",
    "verbosity",
]

EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_PARTIAL = 3
FALLBACK_REGION = "us-east-1"


class Output(StrEnum):
    json = "json"
    yaml = "yaml"
    table = "table"


OutputOption = Annotated[
    Output | None, typer.Option("--output", "-o", help="json, yaml or table (default: table)", show_default=False)
]


class Verbosity(StrEnum):
    quiet = "quiet"
    normal = "normal"
    verbose = "verbose"


@dataclass
class _State:
    verbosity: Verbosity = Verbosity.normal


_state = _State()


def set_verbosity(level: Verbosity) -> None:
    _state.verbosity = level


def verbosity() -> Verbosity:
    return _state.verbosity


def configure_logging(normal: int = logging.WARNING) -> None:
    """Logs on stderr: `normal` by default, errors only with --quiet, INFO with --verbose."""
    level = {Verbosity.quiet: logging.ERROR, Verbosity.normal: normal, Verbosity.verbose: logging.INFO}[verbosity()]
    root = logging.getLogger()
    if not root.handlers:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        root.addHandler(console)
    root.setLevel(level)
    for handler in root.handlers:  # a library logger set to INFO (Powertools') propagates past the root's level
        if type(handler) is logging.StreamHandler:  # the console's, not a test harness's capture
            handler.setLevel(level)
    for name in ("werkzeug", "botocore", "urllib3", "moto"):
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


def note(message: str) -> None:
    """A line for the person at the terminal (stderr); silent with --quiet."""
    if verbosity() is not Verbosity.quiet:
        typer.echo(message, err=True)


def fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    """Print `error: message` on stderr and return the Exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def choose_output(output: Output | None, legacy: str | None = None, *, flag: str = "--format") -> Output:
    """`-o/--output`, else a deprecated alias's value (`--format json`, `--json`), else a table.

    The aliases stay because scripts use them (DESIGN.md's command-line contract); each use prints a note.
    """
    if output is not None:
        return output
    if legacy is not None:
        note(f"note: {flag} is deprecated; use -o/--output {legacy}")
        return Output(legacy)
    return Output.table


def emit(data: Any, output: Output, table: Callable[[], None]) -> None:
    """The result on stdout: JSON (indented), YAML, or the command's table.

    JSON is written by pydantic-core's serializer: the standard library's encoder runs in pure Python once
    asked to indent (52 ms of `plan`'s 10,000-pod answer, 7 ms here), and text stays as written (UTF-8). Its
    bytes go to stdout as they are: as text they would be decoded, searched for colour codes (JSON escapes
    control characters, so it has none) and encoded again, three copies of a 2 MB answer (~2 ms)."""
    if output is Output.json:
        typer.echo(to_json(data, indent=2, fallback=str))
    elif output is Output.yaml:
        import yaml

        # Through the same serializer as JSON, so a time reads the same under either (RFC 3339, not `str()`).
        typer.echo(yaml.safe_dump(json.loads(to_json(data, fallback=str)), sort_keys=False).rstrip())
    else:
        table()


def default_region(explicit: str | None, configured: str | None = None) -> str:
    """`--region`, else AWS_REGION, else AWS_DEFAULT_REGION (as the AWS CLI and SDKs read them), else the
    configuration's, else us-east-1."""
    return (explicit or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or configured
            or FALLBACK_REGION)


def aws_session(region: str | None = None) -> boto3.session.Session:
    """The default credential chain (AWS_PROFILE included), or a one-line error naming what is wrong."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        session = boto3.session.Session(region_name=region)
        if session.get_credentials() is None:
            raise fail("no AWS credentials found (set AWS_PROFILE, run `aws configure` or `aws sso login`)")
    except BotoCoreError as error:  # ProfileNotFound, a broken config file, an expired SSO token…
        raise fail(f"AWS credentials: {error}") from None
    return session



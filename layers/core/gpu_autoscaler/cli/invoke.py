"""`gpu-autoscaler invoke FUNCTION EVENT.json`: one handler, one event, in this process, as Lambda would run it.

The handler module is imported from `functions/<FUNCTION>/handler.py` after the function's environment
is set, so whatever it reads at cold start (settings, clients, Powertools) points where a deployed
function's would: at a fresh embedded AWS (default), a running emulator (`--endpoint-url`), or a real
deployment (`--aws`, resources found by the naming convention). Every invocation is a cold start.
The response goes to stdout as JSON; the handler's own output (logs, metrics) goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from contextlib import ExitStack
from pathlib import Path  # noqa: TC003 (typer reads the annotations at runtime)
from typing import TYPE_CHECKING, Annotated, Any

import typer
from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import ConfigError, load_config
from gpu_autoscaler.emulator.aws import EmbeddedAws, EmulatorError
from gpu_autoscaler.emulator.handlers import (
    DEFAULT_TIMEOUT,
    HandlerLoadError,
    default_functions_dir,
    handler_path,
    run_handler,
)
from gpu_autoscaler.emulator.resources import FUNCTION_TIMEOUTS, ResourcesNotFound, discover
from gpu_autoscaler.naming import FUNCTIONS, ResourceNames

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.config import Config

__all__ = ["HandlerLoadError", "default_functions_dir", "handler_path", "invoke_command", "run_handler"]


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _read_event(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise _fail(f"{path}: no such event file", 2) from None
    except json.JSONDecodeError as error:
        raise _fail(f"{path}: not valid JSON ({error})", 2) from None


@contextlib.contextmanager
def _target(config: Config, function: str, aws: bool, endpoint_url: str | None) -> Iterator[tuple[dict[str, str], str]]:
    """The function environment and a description of where it points."""
    if aws:
        resources = discover(AwsClients(config.region), config)
        yield resources.function_environment(function), f"AWS {config.region}"
    elif endpoint_url:
        attached = EmbeddedAws.attach(config, endpoint_url)
        yield attached.function_environment(function), f"the emulator at {attached.endpoint_url}"
    else:
        with EmbeddedAws(config) as embedded:
            yield embedded.function_environment(function), f"a fresh embedded AWS at {embedded.endpoint_url}"


@app.command("invoke")
def invoke_command(
    function: Annotated[str, typer.Argument(help=f"the function to run: {', '.join(FUNCTIONS)}")],
    event_file: Annotated[Path, typer.Argument(help="JSON event, e.g. events/packer-pending-pods.json")],
    endpoint_url: Annotated[
        str | None, typer.Option("--endpoint-url", help="a running emulator's AWS endpoint")
    ] = None,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON file holding the configuration object")
    ] = None,
    aws: Annotated[bool, typer.Option("--aws", help="real AWS with the default credentials")] = False,
    functions_dir: Annotated[
        Path | None, typer.Option("--functions-dir", help="directory holding <function>/handler.py")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="seconds the Lambda context counts down (default: the stack's)")
    ] = None,
    show_traceback: Annotated[
        bool, typer.Option("--traceback", help="print the handler's traceback on error")
    ] = False,
) -> None:
    """Run one handler on one event locally and print its response as JSON."""
    if aws and endpoint_url:
        raise typer.BadParameter("give --aws or --endpoint-url, not both")
    try:
        path = handler_path(functions_dir or default_functions_dir(), function)
        config = load_config(config_file)
    except (HandlerLoadError, ConfigError) as error:
        raise _fail(str(error), 2) from None
    event = _read_event(event_file)
    with ExitStack() as stack:
        try:
            environment, where = stack.enter_context(_target(config, function, aws, endpoint_url))
        except (EmulatorError, ResourcesNotFound, BotoCoreError, ClientError) as error:
            raise _fail(str(error)) from None
        typer.echo(f"invoking {ResourceNames(config.cluster_name).function(function)} on {where}", err=True)
        try:
            seconds = timeout if timeout is not None else float(FUNCTION_TIMEOUTS.get(function, DEFAULT_TIMEOUT))
            response = run_handler(path, function, event, environment, region=config.region, timeout_seconds=seconds)
        except HandlerLoadError as error:
            raise _fail(str(error)) from None
        except Exception as error:  # the handler's failure is the result to report, whatever its type
            if show_traceback:
                traceback.print_exc(file=sys.stderr)
            raise _fail(f"{function} handler raised {type(error).__name__}: {error}") from None
    typer.echo(json.dumps(response, indent=2, default=str))

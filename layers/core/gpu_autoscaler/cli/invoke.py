"""`gpu-autoscaler invoke FUNCTION EVENT.json`: one handler, one event, in this process, as Lambda would run it.

The handler module is imported from `functions/<FUNCTION>/handler.py` after the function's environment
is set, so whatever it reads at cold start (settings, clients, Powertools) points where a deployed
function's would: at a fresh embedded AWS (default), a running emulator (`--endpoint-url`), or a real
deployment (`--aws`, resources found by the naming convention). Every invocation is a cold start.
The response goes to stdout as JSON; the handler's own output (logs, metrics) goes to stderr.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import sys
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import boto3
import typer
from botocore.exceptions import BotoCoreError, ClientError

import gpu_autoscaler
from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import ConfigError, load_config
from gpu_autoscaler.emulator.aws import EmbeddedAws, EmulatorError
from gpu_autoscaler.emulator.resources import FUNCTION_TIMEOUTS, ResourcesNotFound, discover
from gpu_autoscaler.lambda_context import local_context
from gpu_autoscaler.naming import FUNCTIONS, ResourceNames

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from gpu_autoscaler.config import Config

__all__ = ["HandlerLoadError", "default_functions_dir", "handler_path", "invoke_command", "run_handler"]


DEFAULT_TIMEOUT = 60.0


class HandlerLoadError(RuntimeError):
    """The handler file is missing, does not import, or has no `handler` callable."""


def default_functions_dir() -> Path:
    """The project's `functions/` next to `layers/core/`, else `./functions`."""
    project = Path(gpu_autoscaler.__file__).resolve().parents[3] / "functions"
    return project if project.is_dir() else Path.cwd() / "functions"


def handler_path(functions_dir: Path, function: str) -> Path:
    path = functions_dir / function / "handler.py"
    if not path.is_file():
        present = sorted(p.parent.name for p in functions_dir.glob("*/handler.py"))
        raise HandlerLoadError(
            f"no handler {path} (functions present: {', '.join(present) or 'none'}; "
            f"the stack defines: {', '.join(FUNCTIONS)})"
        )
    return path


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """Set the function's variables for the call, then put back exactly what was there."""
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


@contextlib.contextmanager
def _cold_start() -> Iterator[None]:
    """Undo what a handler's import leaves behind in this process, so the next invocation starts cold.

    boto3's default session and Powertools' parameter providers cache clients made from the environment of
    the time; Powertools' Logger marks its logging.Logger configured and attaches a handler holding the
    stream of the time.
    """
    from aws_lambda_powertools.utilities import parameters

    logging_state = _LoggingState()
    boto3.DEFAULT_SESSION = None
    parameters.clear_caches()
    try:
        yield
    finally:
        boto3.DEFAULT_SESSION = None
        parameters.clear_caches()
        logging_state.restore()


class _LoggingState:
    """The loggers, their handlers and attributes, and the root handlers' filters, as they were."""

    def __init__(self) -> None:
        manager = logging.root.manager
        self.names = set(manager.loggerDict)
        self.loggers = {id(lg): (list(lg.handlers), set(vars(lg)), lg.parent) for lg in self._loggers()}
        self.root_filters = {id(h): list(h.filters) for h in logging.root.handlers}

    @staticmethod
    def _loggers() -> list[logging.Logger]:
        others = [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
        return [logging.getLogger(), *others]

    def restore(self) -> None:
        for logger in self._loggers():
            handlers, attributes, parent = self.loggers.get(id(logger), ([], set(), None))
            for handler in [h for h in logger.handlers if h not in handlers]:
                logger.removeHandler(handler)
            if id(logger) in self.loggers:
                for attribute in set(vars(logger)) - attributes:
                    delattr(logger, attribute)
                logger.parent = parent
        for name in set(logging.root.manager.loggerDict) - self.names:
            del logging.root.manager.loggerDict[name]
        for handler in logging.root.handlers:
            if id(handler) in self.root_filters:
                handler.filters[:] = self.root_filters[id(handler)]


def _load_handler(path: Path, function: str) -> Callable[[Any, Any], Any]:
    module_name = f"_gpu_autoscaler_function_{function.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise HandlerLoadError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    # Lambda puts the function's directory on the path: a handler may import its siblings.
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    handler = getattr(module, "handler", None)
    if not callable(handler):
        raise HandlerLoadError(f"{path} has no callable 'handler'")
    return handler


def run_handler(
    path: Path,
    function: str,
    event: Any,
    environment: dict[str, str],
    *,
    region: str,
    timeout_seconds: float = DEFAULT_TIMEOUT,
) -> Any:
    """Import `path` with `environment` set and call its `handler(event, context)`; the handler's exceptions propagate.

    The handler's stdout (Powertools logs and metrics) is sent to stderr, leaving stdout to the response.
    """
    function_name = environment.get("AWS_LAMBDA_FUNCTION_NAME", function)
    modules_before = set(sys.modules)
    try:
        with _environment(environment), _cold_start(), contextlib.redirect_stdout(sys.stderr):
            handler = _load_handler(path, function)
            context = local_context(function_name, region=region, timeout_seconds=timeout_seconds)
            return handler(event, context)
    finally:
        _forget_function_modules(path.parent, modules_before)


def _forget_function_modules(directory: Path, modules_before: set[str]) -> None:
    """Drop the handler and the siblings it imported, so two functions' `helper.py` never meet."""
    root = directory.resolve()
    for name in set(sys.modules) - modules_before:
        file = getattr(sys.modules[name], "__file__", None)
        if name.startswith("_gpu_autoscaler_function_") or (file and Path(file).resolve().is_relative_to(root)):
            del sys.modules[name]


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
    except HandlerLoadError as error:
        raise _fail(str(error), 2) from None
    except ConfigError as error:
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

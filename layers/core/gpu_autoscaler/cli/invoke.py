"""`gpu-autoscaler invoke FUNCTION EVENT.json`: one handler, one event, in this process, as Lambda would run it.

The handler module is imported from `functions/<FUNCTION>/handler.py` after the function's environment
is set, so whatever it reads at cold start (settings, clients, Powertools) points where a deployed
function's would: at a fresh embedded AWS (default), a running emulator (`--endpoint-url`), or a real
deployment (`--aws`, resources found by the naming convention). Every invocation is a cold start.

The response goes to stdout (JSON, or `-o yaml`); stderr gets a summary of what the handler changed (claims,
instances, queue messages, read before and after) and, with `--verbose`, the handler's own logs and metrics.
Exit code 3 when the response reports failed records (`batchItemFailures`), 1 when the handler raised.

On a fresh embedded AWS nothing is ours yet, so an interruption sample names an instance the function does
not know and is ignored; `--launch-first` runs the packer on the sample pending pods and the fleet function
on what it queued, then points the event's instance ids at the instances that launched.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import sys
import traceback
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path  # noqa: TC003 (typer reads the annotations at runtime)
from typing import TYPE_CHECKING, Annotated, Any

import typer
from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.cli.account import AccountSnapshot, read_account, what_changed
from gpu_autoscaler.cli.common import (
    EXIT_INPUT,
    EXIT_PARTIAL,
    Output,
    OutputOption,
    Verbosity,
    aws_session,
    configure_logging,
    emit,
    fail,
    note,
    verbosity,
)
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
from gpu_autoscaler.emulator.resources import FUNCTION_TIMEOUTS, ResourcesNotFound, StackResources, discover
from gpu_autoscaler.naming import FUNCTIONS, ResourceNames

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from gpu_autoscaler.config import Config

__all__ = ["HandlerLoadError", "default_functions_dir", "handler_path", "invoke_command", "run_handler"]

LAUNCH_FIRST_WAIT_SECONDS = 180.0
"""How long `--launch-first` waits for the sample's nodes to register (seconds of a minute or less on a quiet
machine; the emulator boots nodes in 1.5 s at 30× speed, but shares the CPU with whatever else runs)."""
_INSTANCE_ID = re.compile(r"\bi-[0-9a-f]{8,17}\b")


def _read_event(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise fail(f"{path}: no such event file", EXIT_INPUT) from None
    except json.JSONDecodeError as error:
        raise fail(f"{path}: not valid JSON ({error})", EXIT_INPUT) from None


@contextlib.contextmanager
def _target(config: Config, aws: bool, endpoint_url: str | None) -> Iterator[_Target]:
    """Clients, the deployment's resources and functions' environment, and a description of where they are."""
    if aws:
        clients = AwsClients(config.region, session=aws_session(config.region))
        resources = discover(clients, config)
        yield _Target(clients, resources, resources.function_environment, f"AWS {config.region}")
    elif endpoint_url:
        attached = EmbeddedAws.attach(config, endpoint_url)
        yield _Target(attached.clients, attached.resources, attached.function_environment,
                      f"the emulator at {attached.endpoint_url}")
    else:
        with EmbeddedAws(config) as embedded:
            yield _Target(embedded.clients, embedded.resources, embedded.function_environment,
                          f"a fresh embedded AWS at {embedded.endpoint_url}")


@dataclass(frozen=True)
class _Target:
    clients: AwsClients
    resources: StackResources
    environment: Callable[[str], dict[str, str]]
    where: str


@contextlib.contextmanager
def _handler_output() -> Iterator[io.StringIO]:
    """The handler's logs and metrics: on stderr with --verbose, kept aside (shown on failure) otherwise."""
    kept = io.StringIO()
    if verbosity() is Verbosity.verbose:
        yield kept
        return
    with contextlib.redirect_stderr(kept):
        yield kept


def _run(function: str, event: Any, functions_dir: Path, target: _Target, config: Config,
         timeout: float | None) -> Any:
    path = handler_path(functions_dir, function)
    seconds = timeout if timeout is not None else float(FUNCTION_TIMEOUTS.get(function, DEFAULT_TIMEOUT))
    return run_handler(path, function, event, target.environment(function), region=config.region,
                       timeout_seconds=seconds)


def _launch_first(config: Config, functions_dir: Path, stack: ExitStack) -> tuple[_Target, list[str]]:
    """A running emulator (AWS, a Kubernetes API, kubelets, the functions driven from their queues) that has
    launched the capacity for the sample pending pods; the ids of its instances, Spot first (the samples'
    warnings are about Spot capacity)."""
    import time

    from gpu_autoscaler.emulator.session import EmulatorSession

    sample = functions_dir.parent / "events" / "packer-pending-pods.json"
    if not sample.is_file():
        raise fail(f"--launch-first needs the sample {sample}")
    session = EmulatorSession(config, speed=30.0, agent=False, functions_dir=functions_dir, poll_wait_seconds=1,
                              log_stream=io.StringIO())
    stack.enter_context(session)
    aws = session.aws
    for record in json.loads(sample.read_text())["Records"]:
        aws.clients.client("sqs").send_message(QueueUrl=aws.queue_url("pending-pods"), MessageBody=record["body"],
                                               MessageGroupId=config.cluster_name,
                                               MessageDeduplicationId=record["messageId"])
    target = _Target(aws.clients, aws.resources, aws.function_environment,
                     f"the emulator at {aws.endpoint_url} (Kubernetes API {session.kube.url})")
    deadline = time.monotonic() + LAUNCH_FIRST_WAIT_SECONDS
    while True:
        claims = read_account(target.clients, target.resources).claims
        if claims and all(c.state == "Registered" for c in claims if c.state != "Terminated"):
            break
        if time.monotonic() >= deadline:
            states = Counter(c.state for c in claims)
            raise EmulatorError(
                f"--launch-first: the sample pods' capacity did not register within {LAUNCH_FIRST_WAIT_SECONDS:g} s "
                f"(claims: {', '.join(f'{n}× {state}' for state, n in sorted(states.items())) or 'none yet'}); "
                "the machine may be busy: try again")
        time.sleep(0.5)
    instances = read_account(target.clients, target.resources).instances
    running = sorted((i for i in instances if i.state == "running"), key=lambda i: i.capacity_type != "spot")
    return target, [i.instance_id for i in running]


def _point_at(event: Any, instance_ids: list[str]) -> tuple[Any, dict[str, str]]:
    """The event with each distinct instance id it names replaced by one of ours (in order of appearance)."""
    text = json.dumps(event)
    named = list(dict.fromkeys(_INSTANCE_ID.findall(text)))
    mapping = dict(zip(named, instance_ids, strict=False))
    for old, new in mapping.items():
        text = text.replace(old, new)
    return json.loads(text), mapping


def _summary(function: str, response: Any, before: AccountSnapshot, after: AccountSnapshot) -> list[str]:
    failures = response.get("batchItemFailures") if isinstance(response, dict) else None
    head = f"{function}: done" if not failures else f"{function}: {len(failures)} record(s) failed: " + ", ".join(
        str(f.get("itemIdentifier")) for f in failures)
    return [head, *(f"  {line}" for line in what_changed(before, after))]


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
    launch_first: Annotated[
        bool, typer.Option("--launch-first", help="launch the sample pods' capacity first and point the event's "
                           "instance ids at it (emulator only)")
    ] = False,
    functions_dir: Annotated[
        Path | None, typer.Option("--functions-dir", help="directory holding <function>/handler.py")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="seconds the Lambda context counts down (default: the stack's)")
    ] = None,
    show_traceback: Annotated[
        bool, typer.Option("--traceback", help="print the handler's traceback on error")
    ] = False,
    output: OutputOption = None,
) -> None:
    """Run one handler on one event locally; print what it changed and its response."""
    if aws and endpoint_url:
        raise typer.BadParameter("give --aws or --endpoint-url, not both")
    if launch_first and (aws or endpoint_url):
        raise typer.BadParameter("--launch-first starts its own emulator: not with --aws or --endpoint-url")
    configure_logging(logging.ERROR)
    directory = functions_dir or default_functions_dir()
    try:
        handler_path(directory, function)
        config = load_config(config_file)
    except (HandlerLoadError, ConfigError) as error:
        raise fail(str(error), EXIT_INPUT) from None
    event = _read_event(event_file)
    with ExitStack() as stack:
        try:
            if launch_first:
                note("--launch-first: starting the emulator and launching the sample pods' capacity…")
                with _handler_output():
                    target, ours = _launch_first(config, directory, stack)
                event, mapping = _point_at(event, ours)
                for old, new in mapping.items():
                    note(f"launched first; the event's {old} is now {new}")
            else:
                target = stack.enter_context(_target(config, aws, endpoint_url))
            before = read_account(target.clients, target.resources)
        except (EmulatorError, ResourcesNotFound, BotoCoreError, ClientError) as error:
            raise fail(str(error)) from None
        note(f"invoking {ResourceNames(config.cluster_name).function(function)} on {target.where}")
        try:
            with _handler_output():
                response = _run(function, event, directory, target, config, timeout)
        except HandlerLoadError as error:
            raise fail(str(error)) from None
        except Exception as error:  # the handler's failure is the result to report, whatever its type
            if show_traceback:
                traceback.print_exc(file=sys.stderr)
            raise fail(f"{function} handler raised {type(error).__name__}: {error}"
                       + ("" if show_traceback else " (--traceback for where, --verbose for its logs)")) from None
        after = read_account(target.clients, target.resources)
    for line in _summary(function, response, before, after):
        note(line)
    # A handler's response has no table: `-o table` prints it as JSON, as no `-o` does.
    emit(response, Output.json if output in (None, Output.table) else output, lambda: None)
    if isinstance(response, dict) and response.get("batchItemFailures"):
        raise typer.Exit(EXIT_PARTIAL)

"""`gpu-autoscaler emulator`: the whole pipeline running locally until Ctrl-C.

Prints every endpoint (AWS endpoint and credentials, queue URLs, Kubernetes API and kubeconfig), then one
line per function invocation. The handlers' own logs and the emulator's diagnostics go to
`<state dir>/functions.log`, so the console stays readable.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import tempfile
import threading
from pathlib import Path  # noqa: TC003 (Typer reads the annotations at run time)
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from gpu_autoscaler.cli.common import Output, OutputOption, emit
from gpu_autoscaler.cli.main import app
from gpu_autoscaler.config import ConfigError, load_config
from gpu_autoscaler.emulator.aws import EmulatorError
from gpu_autoscaler.emulator.instances import BOOT_DELAY_SECONDS

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType

__all__ = ["emulator_command", "file_logging", "print_endpoints"]


@contextlib.contextmanager
def file_logging(path: Path) -> Iterator[TextIO]:
    """Everything that is not the console's — loggers, warnings, moto's request errors — into one file."""
    stream = path.open("a", buffering=1)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    saved_level, saved_handlers = root.level, list(root.handlers)
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        yield stream
    finally:
        logging.captureWarnings(False)
        root.handlers = saved_handlers
        root.setLevel(saved_level)
        stream.close()


def print_endpoints(endpoints: dict[str, Any], out: TextIO, log_path: Path | None = None) -> None:
    credentials = " ".join(f"{k}={v}" for k, v in endpoints["credentials"].items())
    lines = [
        f"AWS endpoint       {endpoints['awsEndpointUrl']}  (region {endpoints['region']})",
        f"  environment      AWS_ENDPOINT_URL={endpoints['awsEndpointUrl']} AWS_DEFAULT_REGION={endpoints['region']} "
        f"{credentials}",
        *(f"  queue {name:<17}{url}" for name, url in endpoints["queues"].items()),
        f"  table            {endpoints['table']}",
        f"  configuration    {endpoints['configParameter']}",
        f"  launch template  {endpoints['launchTemplateId']}",
        f"  subnets          {', '.join(f'{z}={s}' for z, s in endpoints['subnets'].items())}",
        f"Kubernetes API     {endpoints['kubernetesUrl']}",
        f"  kubeconfig       {endpoints['kubeconfig']}   (export KUBECONFIG={endpoints['kubeconfig']})",
        f"functions          {', '.join(endpoints['functions']) or 'none'}",
    ]
    if endpoints["functionsMissing"]:
        lines.append(f"  not written yet  {', '.join(endpoints['functionsMissing'])} (their triggers are not driven)")
    lines += [f"  schedule {name:<24} next {when}" for name, when in endpoints["schedules"].items()]
    lines.append(f"speed              ×{endpoints['speed']:g} (rate schedules; nodes join "
                 f"{endpoints['bootDelaySeconds']:.1f} s after launch)")
    lines.append(f"agent              {'watching the Kubernetes API' if endpoints['agent'] else 'off'}")
    if log_path is not None:
        lines.append(f"function logs      {log_path}")
    out.write("\n".join(lines) + "\n")
    out.flush()


@app.command("emulator")
def emulator_command(
    port: Annotated[int, typer.Option("--port", help="AWS endpoint port (0: a free one)")] = 5000,
    kube_port: Annotated[int, typer.Option("--kube-port", help="Kubernetes API port (0: a free one)")] = 0,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON file holding the configuration object (default: cdk.json)")
    ] = None,
    speed: Annotated[
        float, typer.Option("--speed", min=0.01, help="compress time: rate schedules and node boots run X× faster")
    ] = 1.0,
    boot_delay: Annotated[
        float, typer.Option("--boot-delay", min=0, help="seconds from launch to the Node registering, before --speed")
    ] = BOOT_DELAY_SECONDS,
    visibility_timeout: Annotated[
        int | None, typer.Option("--visibility-timeout", help="override the queues' (seconds): quicker retries")
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="where the kubeconfig and function log go (default: temp)")
    ] = None,
    endpoints_file: Annotated[
        Path | None, typer.Option("--endpoints-file", help="also write the endpoints as JSON here")
    ] = None,
    agent: Annotated[bool, typer.Option("--agent/--no-agent", help="run the in-cluster agent")] = True,
    output: OutputOption = None,
) -> None:
    """Run the whole pipeline locally (moto, the functions, a Kubernetes API with kubelets) until Ctrl-C.
    With -o json|yaml the endpoints are one document on stdout and the running commentary goes to stderr."""
    from gpu_autoscaler.emulator.session import EmulatorSession  # the Kubernetes side loads only when used

    try:
        config = load_config(config_file)
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    document = output not in (None, Output.table)
    console = sys.stderr if document else sys.stdout
    with contextlib.ExitStack() as stack:
        directory = state_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-autoscaler-")))
        directory.mkdir(parents=True, exist_ok=True)
        log_path = directory / "functions.log"
        log_stream = stack.enter_context(file_logging(log_path))
        session = EmulatorSession(
            config, port=port, kube_port=kube_port, speed=speed, boot_delay=boot_delay,
            visibility_timeout=visibility_timeout, state_dir=directory, log_stream=log_stream, agent=agent,
        )
        console.write(f"gpu-autoscaler emulator: cluster {config.cluster_name}, {config.region}; starting…\n")
        console.flush()
        try:
            stack.enter_context(session)
        except (EmulatorError, OSError) as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(1) from None
        session.pipeline.on_invocation(lambda invocation: _echo(console, invocation.line()))
        session.pipeline.instances.listeners.append(
            lambda instance, previous: _echo(
                console, f"         EC2 {instance.instance_id} {instance.instance_type} {instance.zone} "
                f"{instance.capacity_type}: {previous or 'new'} → {instance.state}"
            )
        )
        endpoints = session.endpoints()
        if document and output is not None:
            emit({**endpoints, "functionLog": str(log_path)}, output, lambda: None)
        else:
            print_endpoints(endpoints, console, log_path)
        if endpoints_file is not None:
            endpoints_file.write_text(json.dumps({**endpoints, "functionLog": str(log_path)}, indent=2))
        console.write("ready; Ctrl-C to stop\n")
        console.flush()
        _wait_for_signal()
        console.write("stopping…\n")
        console.flush()


def _echo(console: TextIO, line: str) -> None:
    console.write(line + "\n")
    console.flush()


def _wait_for_signal() -> None:
    stopped = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stopped.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

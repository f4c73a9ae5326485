"""Loading a function's handler in this process, with its environment, as Lambda would run it.

`invoke` runs one handler once (every call a cold start); the emulator keeps each function's module loaded
between invocations (a warm execution environment) and sets its environment around each call. Both load
the handler the same way: `functions/<name>/handler.py` imported with the function's directory on the
path, after the function's variables are set, so whatever it reads at cold start points where a deployed
function's would.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3

import gpu_autoscaler
from gpu_autoscaler.lambda_context import local_context
from gpu_autoscaler.naming import FUNCTIONS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = [
    "DEFAULT_TIMEOUT",
    "HandlerLoadError",
    "cold_start",
    "default_functions_dir",
    "environment",
    "forget_function_modules",
    "handler_module_name",
    "handler_path",
    "load_handler",
    "run_handler",
]


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
def environment(variables: dict[str, str]) -> Iterator[None]:
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
def cold_start() -> Iterator[None]:
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


def handler_module_name(function: str) -> str:
    """The module table's name for a function's handler (one per environment: `function` may carry its number)."""
    return f"_gpu_autoscaler_function_{function.replace('-', '_')}"


def load_handler(path: Path, function: str) -> Callable[[Any, Any], Any]:
    module_name = handler_module_name(function)
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
    variables: dict[str, str],
    *,
    region: str,
    timeout_seconds: float = DEFAULT_TIMEOUT,
) -> Any:
    """Import `path` with `environment` set and call its `handler(event, context)`; the handler's exceptions propagate.

    The handler's stdout (Powertools logs and metrics) is sent to stderr, leaving stdout to the response.
    """
    function_name = variables.get("AWS_LAMBDA_FUNCTION_NAME", function)
    modules_before = set(sys.modules)
    try:
        with environment(variables), cold_start(), contextlib.redirect_stdout(sys.stderr):
            handler = load_handler(path, function)
            context = local_context(function_name, region=region, timeout_seconds=timeout_seconds)
            return handler(event, context)
    finally:
        forget_function_modules(path.parent, modules_before, function)


def forget_function_modules(directory: Path, modules_before: set[str], function: str) -> None:
    """Drop the function's handler and the siblings it imported, so two functions' `helper.py` never meet.

    Only its own: the emulator's host may load other functions' handlers in other threads meanwhile (`invoke
    --launch-first` runs one handler beside a whole emulator), each dropping its own, so a module new since
    `modules_before` may be another's, or gone again by the time it is looked at."""
    root = directory.resolve()
    own = handler_module_name(function)
    for name in set(sys.modules) - modules_before:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None) if module is not None else None
        if name == own or (file and Path(file).resolve().is_relative_to(root)):
            sys.modules.pop(name, None)

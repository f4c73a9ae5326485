"""The functions' execution environments in the emulator: each handler loaded once, invoked as Lambda would.

Lambda keeps an execution environment warm between invocations: the module-level service (clients,
catalog, solver caches) is built at the first invocation and reused. The host does the same: an
environment is `functions/<name>/handler.py` imported once, with the function's variables set, and each
invocation runs in it with those variables again and a fresh Lambda context counting down from the
function's timeout.

An environment runs one invocation at a time (module-level state such as Powertools' batch processor is
not shared between concurrent calls in Lambda either). A function gets up to `concurrency(function)`
environments — its pollers' maximum, else two, capped for a 2-core machine — each a
separate import of the handler. Variables and stdout are per thread (`isolation.scope`), so functions run
side by side: a drain waiting for a replacement node does not hold up the fleet function launching it.

What a handler prints (Powertools' JSON logs, EMF metrics) goes to the host's log stream, a file the
emulator names, so the console keeps one line per invocation.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

import boto3

from gpu_autoscaler.emulator.handlers import (
    HandlerLoadError,
    default_functions_dir,
    forget_function_modules,
    load_handler,
)
from gpu_autoscaler.emulator.isolation import forget_foreign_logger, scope
from gpu_autoscaler.lambda_context import local_context
from gpu_autoscaler.naming import FUNCTIONS, log_service
from gpu_autoscaler.wiring import FIFO_QUEUE, FUNCTION_WIRING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from gpu_autoscaler.emulator.aws import EmbeddedAws

__all__ = ["MAX_ENVIRONMENTS", "Invocation", "LambdaHost", "concurrency"]

MAX_ENVIRONMENTS = 3
"""Most environments one function gets here: enough for work to overlap, few enough for two CPU cores."""
DEFAULT_CONCURRENCY = 2
"""A function with no concurrency setting: Lambda would scale it out; two show the overlap."""


def concurrency(function: str) -> int:
    """Environments (so concurrent invocations) the emulator gives a function: one for the FIFO queue's consumer,
    as Lambda runs one batch per message group and the cluster's documents are one group."""
    wiring = FUNCTION_WIRING[function]
    if wiring.queue == FIFO_QUEUE:
        return 1
    limit = wiring.max_concurrency or DEFAULT_CONCURRENCY
    return max(1, min(limit, MAX_ENVIRONMENTS))

EMULATOR_ENVIRONMENT = {"POWERTOOLS_TRACE_DISABLED": "true"}
"""No X-Ray daemon runs here: the tracer would only log that it cannot find a segment."""


@dataclass(frozen=True)
class Invocation:
    """One call of one handler, as the emulator logs it."""

    function: str
    trigger: str
    """What invoked it: a queue's logical name, a schedule's name, or `direct`."""
    started: datetime
    duration_ms: float
    records: int = 0
    failures: int = 0
    """Records reported in `batchItemFailures` (all of them when the handler raised)."""
    error: str | None = None
    """`Type: message` when the handler raised."""
    response: Any = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.failures == 0

    def line(self) -> str:
        """The console line: time, function, trigger, records and failures, duration, outcome."""
        stamp = self.started.astimezone(UTC).strftime("%H:%M:%S")
        counts = f"records={self.records} failures={self.failures}" if self.records else "records=- failures=-"
        outcome = f"  ERROR {self.error}" if self.error else ""
        return f"{stamp} λ {self.function:<12} ← {self.trigger:<30} {counts:<22} {self.duration_ms:7.0f} ms{outcome}"


@dataclass
class _Environment:
    function: str
    handler: Callable[[Any, Any], Any]
    variables: dict[str, str]
    invocations: int = 0


@dataclass
class _Pool:
    """A function's environments: idle ones, and how many exist; waiting callers are woken on release."""

    limit: int
    idle: list[_Environment] = field(default_factory=list)
    created: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)


@dataclass
class LambdaHost:
    """Warm execution environments for the functions whose handler exists, over one embedded AWS."""

    aws: EmbeddedAws
    functions_dir: Path | None = None
    log_stream: TextIO | None = None
    """Where the handlers' own output goes; None: discarded."""
    listeners: list[Callable[[Invocation], None]] = field(default_factory=list)
    timeouts: Mapping[str, int] = field(default_factory=dict)
    """Seconds, per function, in place of the stack's (`gpu_autoscaler.wiring`): a rig that shortens a queue's
    visibility shortens its function's timeout with it, so the stack's relation (visibility > timeout) holds
    and what counts down from the timeout (Powertools idempotency's in-progress expiry) ends before the
    redelivery."""
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _load_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _pools: dict[str, _Pool] = field(default_factory=dict, init=False, repr=False)
    _history: list[Invocation] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.functions_dir = self.functions_dir or default_functions_dir()

    # ---- what exists -----------------------------------------------------------------------------------

    def present(self, function: str) -> bool:
        assert self.functions_dir is not None
        return (self.functions_dir / function / "handler.py").is_file()

    def available(self) -> list[str]:
        """The stack's functions whose handler is in `functions/`, in the stack's order."""
        return [f for f in FUNCTIONS if self.present(f)]

    def missing(self) -> list[str]:
        return [f for f in FUNCTIONS if not self.present(f)]

    @property
    def history(self) -> list[Invocation]:
        with self._lock:
            return list(self._history)

    # ---- invoking --------------------------------------------------------------------------------------

    def invoke(self, function: str, event: Any, *, trigger: str = "direct", records: int = 0) -> Invocation:
        """Run the handler on `event` in a free environment (waiting for one if all are busy); the handler's
        exception is reported in the result, never raised."""
        started = datetime.now(UTC)
        began = time.monotonic()
        response: Any = None
        error: str | None = None
        env: _Environment | None = None
        try:
            env = self._acquire(function)
            env.invocations += 1
            wiring = FUNCTION_WIRING[function]
            context = local_context(
                env.variables.get("AWS_LAMBDA_FUNCTION_NAME", function), region=self.aws.config.region,
                timeout_seconds=float(self.timeouts.get(function, wiring.timeout_seconds)), memory_mb=wiring.memory_mb,
            )
            with scope(env.variables, self._stream()):
                response = env.handler(event, context)
        except Exception as exc:  # the handler's failure is what Lambda reports, whatever its type
            error = f"{type(exc).__name__}: {exc}"
            stream = self._stream()
            traceback.print_exc(file=stream)
            stream.flush()
        finally:
            if env is not None:
                self._release(env)
        failures = records if error else _failures(response)
        invocation = Invocation(
            function, trigger, started, (time.monotonic() - began) * 1000, records, failures, error, response
        )
        with self._lock:
            self._history.append(invocation)
        for listener in list(self.listeners):
            listener(invocation)
        return invocation

    def _pool(self, function: str) -> _Pool:
        if function not in FUNCTION_WIRING:
            raise HandlerLoadError(f"'{function}' is not a function of the stack ({', '.join(FUNCTIONS)})")
        with self._lock:
            return self._pools.setdefault(function, _Pool(concurrency(function)))

    def _acquire(self, function: str) -> _Environment:
        pool = self._pool(function)
        with pool.changed:
            while not pool.idle and pool.created >= pool.limit:
                pool.changed.wait()
            if pool.idle:
                return pool.idle.pop()
            pool.created += 1
            number = pool.created
        try:
            return self._load(function, number)
        except BaseException:
            with pool.changed:
                pool.created -= 1
                pool.changed.notify()
            raise

    def _release(self, env: _Environment) -> None:
        pool = self._pools[env.function]
        with pool.changed:
            pool.idle.append(env)
            pool.changed.notify()

    def _load(self, function: str, number: int) -> _Environment:
        """A new environment: the handler imported with the function's variables (its cold start)."""
        assert self.functions_dir is not None
        path = self.functions_dir / function / "handler.py"
        if not path.is_file():
            raise HandlerLoadError(f"no handler {path}: function '{function}' is not written yet")
        variables = {**self.aws.function_environment(function), **EMULATOR_ENVIRONMENT}
        name = function if number == 1 else f"{function}_{number}"
        # Imports touch the module table and sys.path: one load at a time.
        with self._load_lock, scope(variables, self._stream()):
            modules_before = set(sys.modules)
            boto3.DEFAULT_SESSION = None
            for service in {function, log_service(function), variables.get("POWERTOOLS_SERVICE_NAME", function)}:
                forget_foreign_logger(service)
            handler = load_handler(path, name)
            # The handler and its siblings leave the module table (the environment keeps the handler, and with it
            # everything it imported), so two functions' `helper.py` never meet and nothing outlives the host.
            forget_function_modules(path.parent, modules_before, name)
        return _Environment(function, handler, variables)

    def _stream(self) -> TextIO:
        return self.log_stream if self.log_stream is not None else _Discard()  # type: ignore[return-value]


def _failures(response: Any) -> int:
    """Records a response reports failed; a malformed `batchItemFailures` fails the batch, as Lambda treats it."""
    if not isinstance(response, dict) or "batchItemFailures" not in response:
        return 0
    items = response["batchItemFailures"]
    return len(items) if isinstance(items, list) else 0


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

"""Fault injection for the chaos suite: crashes of a function mid-way, at a chosen AWS or Kubernetes call.

A stand-in for what kills a Lambda invocation in AWS (timeout, out of memory, the sandbox recycled): the
code under test is not changed. Every AWS call of every function goes through botocore's
`BaseClient._make_api_call` and every Kubernetes call through `KubernetesRest.request`; while a `CrashPlan` is
installed, those two are wrapped, and the emulator's Lambda host is wrapped to know which function a thread
runs. A `CrashAt` names the function, the call (`ec2.CreateFleet`, `dynamodb.UpdateItem`, `kube.evict`...),
which occurrence, and whether the call takes effect first (`after`: the work is done, the function dies
before the next step) or not (`before`).

Once an invocation has crashed, every further call it makes fails too (the process is gone: nothing it
would still do reaches AWS or Kubernetes), and the host reports the invocation failed as a whole, so the
poller leaves the entire batch to SQS's redelivery, as Lambda does when a function errors or times out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import botocore.client

from gpu_autoscaler.adapters.kubernetes.rest import KubernetesRest

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.emulator.lambdas import Invocation, LambdaHost

__all__ = ["Crash", "CrashAt", "CrashPlan", "MUTATING"]

MUTATING = frozenset({
    "ec2.CreateFleet", "ec2.TerminateInstances", "ec2.CreateTags",
    "dynamodb.PutItem", "dynamodb.UpdateItem", "dynamodb.DeleteItem", "dynamodb.TransactWriteItems",
    "dynamodb.BatchWriteItem",
    "sqs.SendMessage", "sqs.SendMessageBatch",
    "kube.POST", "kube.PATCH", "kube.DELETE",
})
"""Calls that change something: the points where dying right after leaves half-done work behind."""


class Crash(Exception):  # noqa: N818 - named for what happened, as Lambda reports it
    """The invocation died at this call (injected)."""


@dataclass(frozen=True)
class CrashAt:
    function: str
    call: str
    """`service.Operation` (botocore names) or `kube.<HTTP method>`."""
    occurrence: int = 1
    """Crash at the n-th such call made by this function (counted over all its invocations)."""
    after: bool = True
    """True: the call takes effect, then the function dies; False: it dies instead of making the call."""

    def __str__(self) -> str:
        return f"{self.function} {'after' if self.after else 'before'} {self.call} #{self.occurrence}"


@dataclass(frozen=True)
class HoldAt:
    """Stop `function` right after its `occurrence`-th `call` until another invocation makes `until` (a
    `(function, call)`), or `timeout` passes: two writers of one claim forced to overlap."""

    function: str
    call: str
    until: tuple[str, str]
    occurrence: int = 1
    timeout: float = 20.0


@dataclass
class CrashPlan:
    """Crash points, the calls seen per function, and the crashes that happened."""

    points: list[CrashAt] = field(default_factory=list)
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    trace: list[tuple[str, str]] = field(default_factory=list)
    """(function, call) of every mutating call, in order: what a clean run does, to choose points from."""
    crashed: list[CrashAt] = field(default_factory=list)
    duplicate_rate: float = 0.0
    """Share of the messages sent to a queue (by any function or the agent) that SQS delivers twice; the copy
    is delayed up to `max_delay` seconds, so it may arrive after later messages (standard queues: at least once,
    in no particular order; a FIFO copy is a re-send under a new deduplication id)."""
    max_delay: int = 3
    seed: int = 0
    duplicated: Counter[str] = field(default_factory=Counter)
    duplicate_queues: frozenset[str] | None = None
    """Only these queues' messages are duplicated (their logical names: `launch`...); None: every queue."""
    holds: list[HoldAt] = field(default_factory=list)
    released: list[tuple[HoldAt, bool]] = field(default_factory=list)
    """Each hold that happened, and whether the other writer came (False: it timed out)."""
    _waiting: dict[tuple[str, str], threading.Event] = field(default_factory=dict)
    _local: threading.local = field(default_factory=threading.local)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- installing -----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def install(self, host: LambdaHost) -> Iterator[None]:
        """Wrap botocore, the functions' Kubernetes client and `host.invoke` until the generator is closed."""
        original_call = botocore.client.BaseClient._make_api_call  # type: ignore[attr-defined]  # botocore's private dispatch
        original_kube = KubernetesRest.request
        original_invoke = host.invoke
        plan = self

        def make_api_call(client: Any, operation: str, params: Any) -> Any:
            call = f"{client.meta.service_model.endpoint_prefix}.{operation}"
            result = plan._through(call, lambda: original_call(client, operation, params))
            copy = plan._duplicate(call, params)
            if copy is not None:
                original_call(client, operation, copy)
            return result

        def request(rest: KubernetesRest, method: str, *args: Any, **kwargs: Any) -> Any:
            return plan._through(f"kube.{method.upper()}", lambda: original_kube(rest, method, *args, **kwargs))

        def invoke(function: str, event: Any, **kwargs: Any) -> Invocation:
            plan._local.function, plan._local.dead = function, None
            try:
                invocation = original_invoke(function, event, **kwargs)
            finally:
                dead, plan._local.function, plan._local.dead = plan._local.dead, None, None
            if dead is not None:
                return dataclasses.replace(invocation, error=f"Crash: {dead}", failures=invocation.records)
            return invocation

        botocore.client.BaseClient._make_api_call = make_api_call  # type: ignore[attr-defined]
        KubernetesRest.request = request  # type: ignore[method-assign,assignment]
        host.invoke = invoke  # type: ignore[method-assign]
        try:
            yield
        finally:
            botocore.client.BaseClient._make_api_call = original_call  # type: ignore[attr-defined]
            KubernetesRest.request = original_kube  # type: ignore[method-assign]
            del host.invoke

    def _duplicate(self, call: str, params: Any) -> dict[str, Any] | None:
        """The copy SQS delivers again of a SendMessage, or of some entries of a SendMessageBatch; None if none."""
        if call not in ("sqs.SendMessage", "sqs.SendMessageBatch") or self.duplicate_rate <= 0:
            return None
        queue = str(params.get("QueueUrl", "")).rsplit("/", 1)[-1]
        if call == "sqs.SendMessage":
            copy = self._copy_of(queue, params)
            return None if copy is None else {**params, **copy}
        entries = [copy for entry in params.get("Entries", []) if (copy := self._copy_of(queue, entry)) is not None]
        return {**params, "Entries": entries} if entries else None

    def _copy_of(self, queue: str, message: dict[str, Any]) -> dict[str, Any] | None:
        """One message's copy, drawn at `duplicate_rate`: a FIFO copy under a new deduplication id, a standard
        one delayed up to `max_delay` seconds."""
        with self._lock:
            rng = self._rng
            if rng.random() >= self.duplicate_rate:
                return None
            delay = rng.randint(0, self.max_delay)
            logical = queue.removesuffix(".fifo").rsplit("-gpu-autoscaler-", 1)[-1]
            if self.duplicate_queues is not None and logical not in self.duplicate_queues:
                return None
            self.duplicated[queue] += 1
            copy = dict(message)
            if queue.endswith(".fifo"):
                original = message.get("MessageDeduplicationId", "")
                copy["MessageDeduplicationId"] = f"dup-{self.duplicated[queue]}-{original}"[:128]
            else:
                copy["DelaySeconds"] = max(int(message.get("DelaySeconds", 0)), delay)
            return copy

    @property
    def _rng(self) -> random.Random:
        if not hasattr(self, "_random"):
            self._random = random.Random(self.seed)
        return self._random

    # ---- one call ---------------------------------------------------------------------------------------

    def _through(self, call: str, proceed: Any) -> Any:
        function = getattr(self._local, "function", None)
        if function is None:  # the test, the agent, the emulator's own threads: never faulted
            return proceed()
        if self._local.dead is not None:
            raise Crash(f"{function} is gone ({self._local.dead})")
        point = self._point(function, call)
        if point is not None and not point.after:
            self._die(point)
        result = proceed()
        if point is not None:
            self._die(point)
        self._hold(function, call)
        return result

    def _hold(self, function: str, call: str) -> None:
        with self._lock:
            event = self._waiting.pop((function, call), None)
            if event is not None and getattr(self._local, "holding", None) is not event:
                event.set()  # the other writer came
            else:
                if event is not None:
                    self._waiting[(function, call)] = event
                hold: HoldAt | None = next((h for h in self.holds if h.function == function and h.call == call
                             and h.occurrence == self.calls[(function, call)]), None)
                if hold is None:
                    return
                self.holds.remove(hold)
                event = threading.Event()
                self._waiting[hold.until] = event
                self._local.holding = event
        assert hold is not None
        came = event.wait(hold.timeout)
        self._local.holding = None
        with self._lock:
            self.released.append((hold, came))

    def _point(self, function: str, call: str) -> CrashAt | None:
        with self._lock:
            if call in MUTATING:
                self.trace.append((function, call))
            self.calls[(function, call)] += 1
            seen = self.calls[(function, call)]
            for point in self.points:
                if point.function == function and point.call == call and point.occurrence == seen:
                    self.points.remove(point)
                    return point
        return None

    def _die(self, point: CrashAt) -> None:
        with self._lock:
            self.crashed.append(point)
        self._local.dead = point
        raise Crash(str(point))

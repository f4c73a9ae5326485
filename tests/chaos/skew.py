"""Scenario 8: the components' clocks two minutes apart.

Who reads which clock, and where one component's timestamp meets another's clock:

- the Lambdas (`gpu_autoscaler.clock.SystemClock`, one per service): claim times, GC grace (against EC2's launch
  time), drain deadlines (against a Spot warning's `instance-action-time`, EC2's clock), idempotency records
  (Powertools: their own clock on both sides), consolidation ages and do-not-disrupt durations (against the API
  server's `creationTimestamp` and a pod's start), a pod's `deletionTimestamp` (stuck terminating?), boot times
  (the claim's launch, ours, against the node's Ready time, the kubelet's: clamped in `domain.boot_times`);
- the API server and its kubelets (`LocalKubernetes.clock`): every timestamp in a Node or Pod;
- the agent (`Agent.clock`): the document's `sentAt`, its resync and batching windows (its own clock only);
- EC2 (moto): launch times and, in the events the scenario puts, a Spot warning's `instance-action-time`.

The seam: the API server's and the agent's clocks are single objects shared by everything on that side, so each
gets its own `now`; the Lambdas' `SystemClock.now` is patched for the threads running an invocation (the Lambda
host marks them), leaving every other thread (the emulator's pollers and scheduler: AWS's time) on true time.
A Spot warning's `instance-action-time` is written on EC2's clock by the scenario itself.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.clock import SystemClock
from tests.chaos.scenarios import lifecycle

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.chaos.rig import ChaosRig
    from tests.chaos.scenarios import LifecycleResult

__all__ = ["Skew", "skewed_clocks", "skewed_lifecycle"]


@dataclass(frozen=True)
class Skew:
    """How far each component's clock is ahead of true (AWS) time."""

    lambdas: timedelta = timedelta(0)
    api_server: timedelta = timedelta(0)
    agent: timedelta = timedelta(0)

    def __str__(self) -> str:
        def minutes(delta: timedelta) -> str:
            return f"{delta.total_seconds() / 60:+g} min"

        return f"API server {minutes(self.api_server)}, agent {minutes(self.agent)}, Lambdas {minutes(self.lambdas)}"


def _true_now() -> datetime:
    return datetime.now(UTC)


@contextlib.contextmanager
def skewed_clocks(rig: ChaosRig, skew: Skew) -> Iterator[None]:
    kube_clock = rig.session.kube.clock
    agent = rig.session.agent
    host = rig.pipeline.host
    inside = threading.local()
    original_invoke = host.invoke
    original_now = SystemClock.now

    def lambda_now(self: SystemClock) -> datetime:
        return _true_now() + (skew.lambdas if getattr(inside, "invoking", False) else timedelta(0))

    def invoke(function: str, event: Any, **kwargs: Any) -> Any:
        inside.invoking = True
        try:
            return original_invoke(function, event, **kwargs)
        finally:
            inside.invoking = False

    # Each clock's `now` is replaced where it is looked up (on the instance; SystemClock's on the class, for the
    # functions' clocks) and put back in `finally`: assigning to methods is the point here (mypy's method-assign).
    kube_clock.now = lambda: _true_now() + skew.api_server  # type: ignore[method-assign]
    if agent is not None:
        agent.clock.now = lambda: _true_now() + skew.agent  # type: ignore[method-assign]
    SystemClock.now = lambda_now  # type: ignore[method-assign]
    host.invoke = invoke  # type: ignore[method-assign]
    try:
        yield
    finally:
        SystemClock.now = original_now  # type: ignore[method-assign]
        del host.invoke
        del kube_clock.now
        if agent is not None:
            del agent.clock.now


def skewed_lifecycle(rig: ChaosRig, skew: Skew, prefix: str) -> LifecycleResult:
    """Scenario 8: the suite's lifecycle (pods bound, a Spot warning replaces a node, the pods deleted and the
    capacity given back) with the clocks `skew` apart; the Spot warning's action time on EC2's (true) clock."""
    with skewed_clocks(rig, skew):
        return lifecycle(rig, prefix=prefix)

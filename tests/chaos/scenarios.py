"""The chaos scenarios as plain functions over a `ChaosRig`: the tests assert on what they return, and
`python -m benchmarks chaos` prints their figures. Each is bounded in time (every wait has a timeout)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from tests.chaos.faults import CrashAt, CrashPlan
from tests.chaos.invariants import Report, wait_for_invariants
from tests.chaos.rig import INTERRUPTION_VISIBILITY, gpu_pod

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig

__all__ = ["CRASH_POINTS", "LifecycleResult", "crash_points_for", "lifecycle"]

STEP_TIMEOUT = 60.0
SETTLE_TIMEOUT = 30.0


@dataclass
class LifecycleResult:
    report: Report
    seconds: dict[str, float] = field(default_factory=dict)
    crashed: list[str] = field(default_factory=list)


def _tags(instance: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def lifecycle(rig: ChaosRig, *, pods: int = 4, prefix: str = "w", interrupt: bool = True,
              give_back_timeout: float = STEP_TIMEOUT) -> LifecycleResult:
    """Pods arrive and bind; a Spot warning takes one node (drained, replaced, pods back); the pods are deleted
    and consolidation gives everything back. The invariants are checked after each phase's work settled."""
    result = LifecycleResult(Report())
    rig.begin()
    began = time.monotonic()
    rig.create_pods([gpu_pod(f"{prefix}-{i}") for i in range(pods)])
    result.seconds["bound"] = rig.wait(rig.all_bound, STEP_TIMEOUT, "the pods to be bound")
    _settle(rig, result)
    if interrupt:
        used = {p.spec.node_name for p in rig.pods()}
        nodes = {n.spec.provider_id.rsplit("/", 1)[1]: n.metadata.name for n in rig.core.list_node().items}
        victims = [i["InstanceId"] for i in rig.instances("running") if nodes.get(i["InstanceId"]) in used]
        victim = victims[0]
        began = time.monotonic()
        rig.put_event("EC2 Spot Instance Interruption Warning", victim, spot_warning())
        rig.wait(lambda: any(i["InstanceId"] == victim for i in rig.instances("terminated", "shutting-down")),
                 STEP_TIMEOUT + INTERRUPTION_VISIBILITY, f"{victim} to be drained and terminated")  # + a retry
        rig.wait(rig.all_bound, STEP_TIMEOUT, "the pods to be bound again")
        result.seconds["replaced"] = time.monotonic() - began
        _settle(rig, result)
    began = time.monotonic()
    rig.delete_pods()
    rig.wait(lambda: not rig.instances("pending", "running"), give_back_timeout, "the capacity to be given back")
    result.seconds["given back"] = time.monotonic() - began
    _settle(rig, result)
    return result


def _settle(rig: ChaosRig, result: LifecycleResult, timeout: float = SETTLE_TIMEOUT) -> None:
    rig.wait(rig.settled, timeout, "the queues to drain")
    report = wait_for_invariants(rig, SETTLE_TIMEOUT)
    result.report.violations += report.violations
    for name in ("pods", "bound", "released", "instances", "claims", "dead_letters"):
        setattr(result.report, name, getattr(report, name))


CRASH_POINTS: dict[str, list[tuple[str, bool, int]]] = {
    # function: [(call, after, occurrence)]: the points where dying leaves half-done work (the list).
    "packer": [("sqs.SendMessage", False, 1),          # claims written, no launch message sent
               ("sqs.SendMessage", True, 1)],          # launch message sent, the document not deleted
    "fleet": [("ec2.CreateFleet", True, 1),            # instance launched, the claim not yet Launched
              ("dynamodb.TransactWriteItems", True, 2)],  # claim Launched, the request not deleted
    "interruption": [("sqs.SendMessage", False, 1),    # claim Draining, replacement written, no drain message
                     ("sqs.SendMessage", True, 1)],    # drain message sent, the notice not deleted
    "drain": [("ec2.TerminateInstances", True, 1),     # terminated, the claim not closed
              ("kube.PATCH", True, 1)],                # cordoned, nothing evicted yet
    "consolidate": [("sqs.SendMessage", True, 1),      # drain message sent, the tick not finished
                    ("dynamodb.TransactWriteItems", True, 1)],  # reconcile: a claim Registered, the tick dies
}
CONSOLIDATION_MARKED_NOT_SENT = CrashAt("consolidate", "sqs.SendMessage", after=False)
"""Dies between marking a claim for consolidation and sending its drain: the next tick finds the mark without
its drain noted as sent and sends it (it used to wait for the mark to lapse, `timeouts.consolidationDrain`)."""


def crash_points_for(seed: int) -> list[CrashAt]:
    """One crash point per function: seed 0 takes each function's first point; other seeds draw one."""
    rng = random.Random(seed)
    points = []
    for function, choices in CRASH_POINTS.items():
        call, after, occurrence = choices[0] if seed == 0 else rng.choice(choices)
        points.append(CrashAt(function, call, occurrence=occurrence, after=after))
    return points


def crash_lifecycle(rig: ChaosRig, points: list[CrashAt], prefix: str) -> tuple[LifecycleResult, CrashPlan]:
    plan = CrashPlan(points=list(points))
    with plan.install(rig.pipeline.host):
        result = lifecycle(rig, prefix=prefix)
    result.crashed = [str(p) for p in plan.crashed]
    return result, plan


def duplicate_lifecycle(rig: ChaosRig, seed: int, prefix: str) -> tuple[LifecycleResult, CrashPlan]:
    """Scenario 4: every message to every queue delivered twice, the copy up to 3 s late (out of order)."""
    plan = CrashPlan(duplicate_rate=1.0, seed=seed)
    with plan.install(rig.pipeline.host):
        result = lifecycle(rig, prefix=prefix)
    return result, plan


def spot_warning(seconds: float = 5.0) -> dict[str, str]:
    """A Spot warning's detail as EC2 sends it, with the time it takes the instance: `seconds` ahead here rather
    than two minutes (the drain holds the instance until then, as AWS would not take it earlier)."""
    at = datetime.now(UTC) + timedelta(seconds=seconds)
    return {"instance-action": "terminate", "instance-action-time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}


def interruption_storm(rig: ChaosRig, *, warnings: int = 5, prefix: str = "storm") -> LifecycleResult:
    """Scenario 4: for one instance, a rebalance recommendation, the same Spot warning `warnings` times, then
    EC2 reclaims it (the state-change notifications follow), all within seconds; every pod back, one
    replacement."""
    result = LifecycleResult(Report())
    rig.begin()
    rig.create_pods([gpu_pod(f"{prefix}-{i}") for i in range(3)])
    result.seconds["bound"] = rig.wait(rig.all_bound, STEP_TIMEOUT, "the pods to be bound")
    _settle(rig, result)
    used = {p.spec.node_name for p in rig.pods()}
    nodes = {n.spec.provider_id.rsplit("/", 1)[1]: n.metadata.name for n in rig.core.list_node().items}
    victim = next(i["InstanceId"] for i in rig.instances("running") if nodes.get(i["InstanceId"]) in used)
    began = time.monotonic()
    rig.put_event("EC2 Instance Rebalance Recommendation", victim)
    for _ in range(warnings):
        rig.put_event("EC2 Spot Instance Interruption Warning", victim, spot_warning())
        time.sleep(0.3)
    rig.ec2.terminate_instances(InstanceIds=[victim])  # EC2 reclaims it; the watcher puts the state changes
    rig.wait(rig.all_bound, STEP_TIMEOUT, "the pods to be bound again")
    result.seconds["replaced"] = time.monotonic() - began
    _settle(rig, result)
    rig.delete_pods()
    rig.wait(lambda: not rig.instances("pending", "running"), STEP_TIMEOUT, "the capacity to be given back")
    _settle(rig, result)
    return result


@dataclass
class ThrottleResult:
    report: Report
    pods: int
    seen: int
    refused: int
    seconds_to_bound: float
    dead_letters: int


def throttling_storm(rig: ChaosRig, *, pods: int = 200, rate: float = 0.3, seconds: float = 20.0, seed: int = 0,
                     prefix: str = "thr") -> ThrottleResult:
    """Scenario 1: EC2 answers RequestLimitExceeded to `rate` of its calls for `seconds` (the issue's two minutes,
    scaled down with the emulator's clock) while `pods` GPU pods arrive; then every pod must be bound."""
    from gpu_autoscaler.emulator.strict.faults import throttling

    rig.begin()
    began = time.monotonic()
    with throttling(rate, seed) as rule:
        rig.create_pods([gpu_pod(f"{prefix}-{i}") for i in range(pods)])
        time.sleep(max(0.0, seconds - (time.monotonic() - began)))
    rig.wait(rig.all_bound, 180.0, f"all {pods} pods to be bound after the throttling")
    bound = time.monotonic() - began
    result = LifecycleResult(Report())
    _settle(rig, result, timeout=120.0)  # the agent's documents queued during the storm are packed one by one
    letters, placed = result.report.dead_letters, result.report.bound
    if placed != pods:
        result.report.violations.append(f"{placed} of {pods} pods bound once settled")
    rig.delete_pods()
    rig.wait(lambda: not rig.instances("pending", "running"), 120.0, "the capacity to be given back")
    _settle(rig, result, timeout=120.0)
    return ThrottleResult(result.report, pods, rule.seen, rule.refused, bound, letters)


def conflicting_launches(rig: ChaosRig, prefix: str = "conflict") -> tuple[LifecycleResult, CrashPlan]:
    """Scenario 5: two fleet invocations write one claim at once. Every launch request is delivered twice;
    the first invocation is held right after its CreateFleet until the second one writes the claim, so both
    race to record the launch (conditional writes on the claim's version decide; the ClientToken makes the
    second CreateFleet hand back the first's instance)."""
    from tests.chaos.faults import HoldAt

    result = LifecycleResult(Report())
    rig.begin()
    plan = CrashPlan(duplicate_rate=1.0, duplicate_queues=frozenset({"launch"}), max_delay=0,
                     holds=[HoldAt("fleet", "ec2.CreateFleet", until=("fleet", "dynamodb.TransactWriteItems"))])
    with plan.install(rig.pipeline.host):
        rig.create_pods([gpu_pod(f"{prefix}-{i}") for i in range(2)])
        result.seconds["bound"] = rig.wait(rig.all_bound, STEP_TIMEOUT, "the pods to be bound")
        _settle(rig, result)
    rig.delete_pods()
    rig.wait(lambda: not rig.instances("pending", "running"), STEP_TIMEOUT, "the capacity to be given back")
    _settle(rig, result)
    return result, plan

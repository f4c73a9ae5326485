"""The chaos scenarios as plain functions over a `ChaosRig`: the tests assert on what they return, and
`python -m benchmarks chaos` prints their figures. Each is bounded in time (every wait has a timeout)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from tests import kube_reads
from tests.chaos.faults import CrashAt, CrashPlan
from tests.chaos.invariants import Report, wait_for_invariants
from tests.chaos.rig import INTERRUPTION_VISIBILITY, gpu_pod

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig

__all__ = ["CRASH_POINTS", "LifecycleResult", "crash_points_for", "lifecycle"]

STEP_TIMEOUT = 60.0
SETTLE_TIMEOUT = 30.0
NOTICE_SECONDS = 10.0
"""The Spot warning storm's bound per warned node (a bound, not a figure: the scenario returns as soon as done)."""


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
        nodes = kube_reads.instance_nodes(rig.core.list_node().items)
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
    # A claim recorded on an instance that is gone is closed by the collector a grace after its launch was recorded,
    # on its next tick: the check waits past the grace (the soak's 30 s grace was as long as this wait; issue 19).
    grace = rig.aws.config.timeouts.garbage_collection_grace.total_seconds()
    report = wait_for_invariants(rig, SETTLE_TIMEOUT + grace)
    result.report.violations += report.violations
    for name in ("pods", "bound", "released", "instances", "claims", "dead_letters"):
        setattr(result.report, name, getattr(report, name))


CRASH_POINTS: dict[str, list[tuple[str, bool, int]]] = {
    # function: [(call, after, occurrence)]: the points where dying leaves half-done work (the list).
    "packer": [("sqs.SendMessageBatch", False, 1),     # claims written, no launch message sent
               ("sqs.SendMessageBatch", True, 1)],     # launch messages sent, the document not deleted
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
    nodes = kube_reads.instance_nodes(rig.core.list_node().items)
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
    rig.wait(rig.all_bound, 120.0 + pods, f"all {pods} pods to be bound after the throttling")
    bound = time.monotonic() - began
    result = LifecycleResult(Report())
    # The agent's documents queued during the storm (each resync re-reports every pod still pending) are packed
    # one by one, each a no-op once its pods are covered: seconds apiece for documents of a hundred pods.
    settle = 120.0 + 3 * pods
    _settle(rig, result, timeout=settle)
    letters, placed = result.report.dead_letters, result.report.bound
    if placed != pods:
        result.report.violations.append(f"{placed} of {pods} pods bound once settled")
    rig.delete_pods()
    rig.wait(lambda: not rig.instances("pending", "running"), settle, "the capacity to be given back")
    _settle(rig, result, timeout=settle)
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


@dataclass
class StormResult:
    report: Report
    """The invariants after every phase (storm on, storm lifted, capacity given back)."""
    pods: int
    on_demand: int
    """Pods of the Spot-only storm bound on On-Demand nodes (the fallback the pool allows)."""
    released: int
    """Pods reported unschedulable with a reason while neither Spot nor On-Demand had capacity."""
    told: int
    """Of those, pods that carry a Warning Event saying so (what `kubectl describe pod` shows): the packer posts it
    when it finds every offering the pod could use marked unavailable at once."""
    refused: int
    """Launches EC2 refused for insufficient capacity (CreateFleet overrides)."""
    seen: int
    seconds_to_bound: float
    """From capacity back to every pod bound."""
    phases: dict[str, Report] = field(default_factory=dict)


def _capacity_types(rig: ChaosRig, names: set[str]) -> dict[str, str]:
    """Pod name → the capacity type of the node it is bound to."""
    from gpu_autoscaler.models import labels as L

    nodes = {kube_reads.name(n): kube_reads.labels(n).get(L.CAPACITY_TYPE, "") for n in rig.core.list_node().items}
    return {p.metadata.name: nodes.get(p.spec.node_name, "") for p in rig.pods()
            if p.metadata.name in names and p.spec.node_name}


def _warned(rig: ChaosRig, reason: str) -> dict[str, str | None]:
    """Pod uid → the message of its latest Warning Event with this reason (an Event need not have one)."""
    from tests.chaos.rig import NAMESPACE

    return {e.involved_object.uid: e.message for e in rig.core.list_namespaced_event(NAMESPACE).items
            if e.type == "Warning" and e.reason == reason and e.involved_object.uid}


STORM_FAMILIES = ("g5", "g6", "g6e")


def storm_shape(seed: int) -> tuple[str, int]:
    """(GPU family, pods) of a capacity storm: seed 0 takes g6 and 6 pods; other seeds draw them."""
    if seed == 0:
        return "g6", 6
    rng = random.Random(seed)
    return rng.choice(STORM_FAMILIES), rng.randint(4, 8)


def capacity_storm_lifecycle(rig: ChaosRig, *, family: str = "g6", pods: int = 6, seed: int = 0, hold: float = 5.0,
                             prefix: str = "ice") -> StormResult:
    """Scenario 2: EC2 has no Spot capacity for one GPU family (its pods go On-Demand), then no On-Demand either
    for at least `hold` seconds (new pods are released and reported with a reason, planned again and released
    again, never on two claims at once), then capacity returns (every pod bound). The pods need that family (they
    select it), so nothing else can take them."""
    from gpu_autoscaler.domain.pod_events import UNSCHEDULABLE
    from gpu_autoscaler.emulator.strict.faults import capacity_storm

    result = LifecycleResult(Report())
    phases: dict[str, Report] = {}
    rig.begin()
    first = [gpu_pod(f"{prefix}-spot-{i}", family=family) for i in range(pods // 2)]
    later = [gpu_pod(f"{prefix}-all-{i}", family=family) for i in range(pods - pods // 2)]
    with capacity_storm(seed=seed) as storm:
        storm.take(family, "spot")
        rig.create_pods(first)
        rig.wait(rig.all_bound, STEP_TIMEOUT, f"the pods to be bound On-Demand while {family} Spot is out")
        _settle(rig, result)
        phases["spot out"] = result.report.snapshot()
        names = {p["metadata"]["name"] for p in first}
        on_demand = sum(t == "on-demand" for t in _capacity_types(rig, names).values())

        storm.take(family, "on-demand")
        out = time.monotonic()
        rig.create_pods(later)
        waiting = {p["metadata"]["name"] for p in later}
        rig.wait(lambda: _released_by_name(rig, waiting) == waiting and time.monotonic() - out >= hold,
                 STEP_TIMEOUT + hold, f"the pods to be reported unschedulable while {family} has no capacity")
        _settle(rig, result)
        phases["all out"] = result.report.snapshot()
        released = _released_by_name(rig, waiting)
        uids = {p.metadata.uid for p in rig.pods() if p.metadata.name in released}
        told = len(uids & set(_warned(rig, UNSCHEDULABLE)))

        began = time.monotonic()
        storm.give_back()
    rig.wait(rig.all_bound, STEP_TIMEOUT, "every pod to be bound once capacity returned")
    seconds = time.monotonic() - began
    _settle(rig, result)
    phases["capacity back"] = result.report.snapshot()
    rig.delete_pods()
    rig.wait(lambda: not rig.instances("pending", "running"), STEP_TIMEOUT, "the capacity to be given back")
    _settle(rig, result)
    return StormResult(result.report, pods, on_demand, len(released), told, storm.refused, storm.seen, seconds,
                       phases)


def _released_by_name(rig: ChaosRig, names: set[str]) -> set[str]:
    """Those of `names` that are pending and were reported unschedulable with a reason (the invariants' test)."""
    from tests.chaos.invariants import released_pods

    reasons = released_pods(rig.log_records())
    return {p.metadata.name for p in rig.pods()
            if p.metadata.name in names and not p.spec.node_name and p.metadata.uid in reasons}


@dataclass
class WarningStormResult:
    report: Report
    nodes: int
    warnings: int
    replacements: int
    """Instances launched after the first warning: the replacements, and any claim the packer made for a pod
    reported pending while no replacement had room it could see (a node registering at that moment)."""
    planned: dict[str, list[str]]
    """Warned instance → the replacement claims the interruption function planned for its pods."""
    held_back: dict[str, list[str]]
    """Warned instance → its pods the interruption function could not place at once (reported unschedulable with
    the reason: the pool's limit counts the warned nodes until they are gone); they are placed once they are."""
    notices: dict[str, list[dict[str, Any]]]
    """Warned instance → the interruption function's reports of its warning (what a failed assertion shows)."""
    peak_gpus: int
    """Most GPUs the pool's live claims (the warned ones still draining included) held at once."""
    limit_gpus: int | None
    seconds_to_bound: float
    """From the first warning to every pod bound again (on replacements), all warned instances gone."""
    seconds_after_last: float
    """The same, from the last warning."""

    @property
    def shared(self) -> dict[str, list[str]]:
        """Replacement claims planned for more than one warned node (each holds one node's pods: none should). A
        notice handled twice (SQS delivers at least once; a slow invocation outlives its idempotency record) plans
        the same claims for the same node again: that is one node."""
        owners: dict[str, set[str]] = {}
        for instance, claims in self.planned.items():
            for claim in claims:
                owners.setdefault(claim, set()).add(instance)
        return {claim: sorted(instances) for claim, instances in owners.items() if len(instances) > 1}


class _PeakGpus:
    """Samples the GPUs a pool's live claims hold, counted as its `limits.gpus` counts them (the launched type's
    GPUs, else the most of its candidate types'; EC2's DescribeInstanceTypes says how many), while a scenario
    runs."""

    def __init__(self, rig: ChaosRig, pool: str, interval: float = 0.5) -> None:
        import threading

        from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore

        self.store = DynamoStateStore(rig.aws.clients.client("dynamodb"), rig.aws.table_name,
                                      rig.aws.config.cluster_name)
        self.gpus: dict[str, int] = {}
        for page in rig.ec2.get_paginator("describe_instance_types").paginate():
            for info in page["InstanceTypes"]:
                self.gpus[info["InstanceType"]] = sum(g.get("Count", 0) for g in
                                                      (info.get("GpuInfo") or {}).get("Gpus", []))
        self.pool, self.interval, self.peak = pool, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-gpus", daemon=True)

    def _held(self) -> int:
        from gpu_autoscaler.models.claims import CLAIMED_STATES

        total = 0
        for claim in self.store.list_claims(CLAIMED_STATES):
            if claim.pool == self.pool:
                types = [claim.instance_type] if claim.instance_type else list(claim.instance_types)
                total += max((self.gpus.get(t, 0) for t in types), default=0)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._held())

    def __enter__(self) -> _PeakGpus:
        self.peak = self._held()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def spot_warning_storm(rig: ChaosRig, *, nodes: int = 20, seconds: float = 12.0, pool: str = "gpu-burst",
                       prefix: str = "itn") -> WarningStormResult:
    """Scenario 6: one pod per node on `nodes` Spot nodes; each node gets a Spot interruption warning, spread over
    `seconds` (the issue's 100 in one minute); every node is replaced (within the pool's limits, its pods back on
    a replacement) and reclaimed at the warning's action time; then the pods are deleted and the capacity given
    back. Each pod asks 40 vCPUs, so no node holds two (one warning, one node, one pod)."""
    result = LifecycleResult(Report())
    rig.begin()
    rig.create_pods([gpu_pod(f"{prefix}-{i}", cpu="40") for i in range(nodes)])
    rig.wait(rig.all_bound, STEP_TIMEOUT + 2 * nodes, f"the {nodes} pods to be bound")
    # The agent reported the pods as they were created and as each was bound: the packer goes through every one of
    # those documents (one per invocation's record, each a no-op once its pods are covered) before the queue is
    # idle, some seconds per document on a loaded machine.
    _settle(rig, result, timeout=SETTLE_TIMEOUT + 5 * nodes)
    used = {p.spec.node_name for p in rig.pods()}
    by_instance = kube_reads.instance_nodes(rig.core.list_node().items)
    victims = [i["InstanceId"] for i in rig.instances("running") if by_instance.get(i["InstanceId"]) in used]
    before = {i["InstanceId"] for i in rig.instances()}
    limit = rig.aws.config.pool(pool).limits.gpus

    def replaced() -> bool:
        gone = {i["InstanceId"] for i in rig.instances("shutting-down", "terminated")}
        return gone >= set(victims) and rig.all_bound()

    with _PeakGpus(rig, pool) as peak:
        began = time.monotonic()
        for n, victim in enumerate(victims):
            time.sleep(max(0.0, began + n * seconds / max(1, len(victims)) - time.monotonic()))
            rig.put_event("EC2 Spot Instance Interruption Warning", victim, spot_warning())
        last = time.monotonic()
        # Each notice costs the interruption function seconds here (~4 s at load average 20-35: DynamoDB reads
        # that moto answers by scanning the table, in one process with everything else), two at a time.
        rig.wait(replaced, STEP_TIMEOUT + 70 + NOTICE_SECONDS * nodes,
                 "every warned node to be reclaimed and its pod bound again")
        done = time.monotonic()
        _settle(rig, result, timeout=SETTLE_TIMEOUT + 5 * nodes)
    launched = [i for i in rig.instances() if i["InstanceId"] not in before]
    planned: dict[str, list[str]] = {}
    held_back: dict[str, list[str]] = {}
    notices: dict[str, list[dict[str, Any]]] = {}
    for record in rig.log_records():  # the interruption function's report of each notice it acted on
        if record.get("kind") == "spot-interruption" and record.get("instanceId") in victims:
            notices.setdefault(record["instanceId"], []).append(record)
            planned.setdefault(record["instanceId"], []).extend(record.get("replacements") or [])
            if record.get("unschedulable"):
                held_back.setdefault(record["instanceId"], []).extend(record["unschedulable"])
    rig.delete_pods()
    rig.wait(lambda: not rig.instances("pending", "running"), STEP_TIMEOUT + 2 * nodes, "the capacity to be given back")
    _settle(rig, result, timeout=SETTLE_TIMEOUT + 5 * nodes)
    return WarningStormResult(result.report, len(used), len(victims), len(launched), planned, held_back, notices,
                              peak.peak, limit, done - began, done - last)

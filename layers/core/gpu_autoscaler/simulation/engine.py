"""One policy over one trace: a discrete-event replay through the Lambdas' own services and domain.

The clock is a `FixedClock` the engine moves from event to event (a heap ordered by time); the state store
is the in-memory one; EC2 is `SimulatedCloud` and Kubernetes `SimulatedCluster`. On them run, unchanged:

- the packer (`services.packer.PackerService` with the policy's `Solver`): the pending pods the agent would
  report, batched every `pack_interval` as the agent and the FIFO queue batch them, re-reported every
  `resync_interval` while pending (the agent's resync); a pod the packer cannot place is re-reported with a
  doubling interval up to `max_resync_interval`, on that interval's grid (so pods refused alike go in one
  document, as the agent's resync sends them), and a pod that fits nowhere costs a bounded number of passes;
- the fleet (`services.fleet.FleetService`: attempts, capacity errors, unavailable offerings, fallback);
- interruptions (`services.interruption.InterruptionService`, fed the EventBridge events EC2 sends: the Spot
  warning, and the state change when EC2 reclaims the instance two minutes later) and drains
  (`services.drain.DrainService`, its requests delivered as the drain queue would, delays included);
- consolidation (`services.consolidate.ConsolidateService`, its reconcile step included: registrations, demand):
  an empty node on the first minute it falls due (consolidateAfter, minNodeAge), in a pass over its pool limited
  to empty nodes; the underutilized search (a packing pass per candidate) on the function's minute
  (`underutilized_interval`) when the cluster changed since the last one or a node became weighable since, its
  proposals validated on the next minute by that minute's pass limited to empty nodes (not a second search). A
  pass with no node it could weigh is not run — it would decide nothing. A node that joins is registered by the
  reconcile step on the next minute, as the consolidate function's schedule has it; on the other minutes while a
  claim in flight lists pods, the step that gives back the room of a claim none of whose pods waits for it any
  more runs alone (the demand it would also record is recorded on pre-warm's ticks, as before);
- pre-warm (`services.prewarm.PrewarmService`, every 5 minutes, windows and forecast), its demand history
  (pending plus running GPUs per pool and 5-minute bucket, recorded on each tick and by the packer and the
  reconcile step) a dense series in the store.

The run ends when no pod is left to run: every pod finished, was deleted while pending, or waits with no
way to be placed (nothing running, nothing on its way, the packer's last word a refusal); instances still
up are terminated then.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import random
import time
import zlib
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.consolidation import ConsolidationNode, empty_wait, node_pods, warm_held, warm_until
from gpu_autoscaler.domain.disruption_marks import awaiting_validation, disruption_until
from gpu_autoscaler.domain.forecast import BUCKET
from gpu_autoscaler.domain.interruption import parse_notice
from gpu_autoscaler.domain.packing.fit import gpu_equivalent, pod_requests
from gpu_autoscaler.domain.packing.solver import Solver
from gpu_autoscaler.models.claims import CLAIMED_STATES, IN_FLIGHT_STATES, ClaimState
from gpu_autoscaler.models.messages import DrainRequest, LaunchRequest, ScheduleTick
from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler.services.demand import pool_gpus, record_demand
from gpu_autoscaler.services.drain import DrainService
from gpu_autoscaler.services.fleet import FleetService
from gpu_autoscaler.services.interruption import InterruptionService
from gpu_autoscaler.services.prewarm import PERIOD, SolverPlanner
from gpu_autoscaler.services.reconcile import ReconcileService
from gpu_autoscaler.simulation.cloud import SimulatedCloud, interruption_hazard
from gpu_autoscaler.simulation.cluster import SimPod, SimulatedCluster
from gpu_autoscaler.simulation.costs import CostLedger, pool_costs
from gpu_autoscaler.simulation.metrics import GpuPrices, RunResult, Timeline
from gpu_autoscaler.simulation.policies import PodShaper
from gpu_autoscaler.simulation.services import EventQueue, PolicyPacker, SimulatedConsolidate, SimulatedPrewarm
from gpu_autoscaler.simulation.store import SimulationStateStore
from gpu_autoscaler.simulation.trace import TRACE_EPOCH

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence
    from datetime import datetime

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.simulation.cloud import SimulatedInstance
    from gpu_autoscaler.simulation.cluster import SimNode
    from gpu_autoscaler.simulation.policies import Policy
    from gpu_autoscaler.simulation.settings import SimulationSettings
    from gpu_autoscaler.simulation.trace import Trace

__all__ = ["REPLAY_COLLECTOR_THRESHOLDS", "PolicyRun"]

# Event kinds, in the order they are handled at one instant: room is freed before it is taken.
(_FINISH, _DELETE, _RECLAIM, _READY, _RECONCILE, _ARRIVE, _SCHEDULE, _DRAIN, _NOTICE, _LAUNCH, _PACK, _PREWARM,
 _CONSOLIDATE) = range(13)
_LAUNCH_TEMPLATE = "lt-0000000000simulated"
_RETRY_SOON = ("budget", "incoming", "nominated")
"""Reasons consolidation leaves an empty node alone that pass with time alone: look again next minute."""
REPLAY_COLLECTOR_THRESHOLDS = (700, 10, 1_000)
"""The cyclic garbage collector's thresholds while a policy runs (`gc.set_threshold`): CPython's own for the young
generations (700, 10), and a full collection after 1,000 middle ones instead of 10. A replay keeps ~650,000 objects
for the whole run (caches, series, claims, pods), and each full collection walks every one of them to free next to
nothing: on the default trace CPython's thresholds made 9–10 full collections, ~0.2 s each — ~1.6 of
ours-no-prediction's ~23 CPU-s and ~2.2 of ours' ~36 — that freed 289 objects between them; with these there are
none, and the young collections, which free the few cycles a run makes, cost the ~0.3 s they did. The collector
stays on, unlike in `plan` (`cli.plan`): a replay runs for minutes, on traces of any length."""


class PolicyRun:
    """Replays `trace` under `policy`. `run()` once."""

    def __init__(self, policy: Policy, trace: Trace, catalog: Catalog, settings: SimulationSettings,
                 *, progress: Callable[[float], None] | None = None) -> None:
        self.policy = policy
        self.config: Config = policy.config
        self.trace = trace
        self.catalog = catalog
        self.settings = settings
        self.progress = progress
        self.t = 0.0
        self.clock = FixedClock(TRACE_EPOCH)
        self.events: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        seed = [settings.seed, zlib.crc32(policy.name.encode())]
        self.rng = np.random.default_rng(seed)
        self._start, self._end_estimate = trace.span
        self.store = SimulationStateStore(
            self.config.cluster_name, self.clock, history_from=self.moment(max(0.0, self._start - 86400)),
            buckets=int((self._end_estimate - self._start) / BUCKET.total_seconds()) + 2 * 288,
        )
        self.cluster = SimulatedCluster(self.config, lambda: self.t, self.moment, self._unbound, self._node_empty,
                                        lambda: self.pending.values())
        self.cloud = SimulatedCloud(catalog, self.rng, lambda: self.t,
                                    insufficient_capacity_rate=settings.insufficient_capacity_rate,
                                    on_launch=self._launched, on_terminate=self._terminated)
        self.solver = Solver(self.config, catalog, self.clock, packer=policy.packer)
        launches = EventQueue(lambda delay, request: self.push(self.t + delay, _LAUNCH, request), settings.queue_delay)
        drains = EventQueue(lambda delay, request: self.push(self.t + delay, _DRAIN, request), settings.queue_delay)
        self.packer = PolicyPacker(self.solver, self.config, self.store, catalog, launches, clock=self.clock)
        self.fleet = FleetService(self.config, self.store, self.cloud, clock=self.clock,
                                  launch_template_id=_LAUNCH_TEMPLATE, catalog=catalog, sleep=_no_sleep,
                                  rng=random.Random(seed[0] * 1_000_003 + seed[1]))
        self.drains = DrainService(self.config.cluster_name, self.store, self.cluster, self.fleet, drains,
                                   clock=self.clock, sleep=_no_sleep)
        self.interruptions = InterruptionService(self.config, self.store, self.cluster, self.fleet, self.packer,
                                                 drains, clock=self.clock)
        self.prewarm: SimulatedPrewarm | None = None
        if policy.prewarm:
            self.prewarm = SimulatedPrewarm(
                self.store.series, self.config, self.store, launches, catalog.instance_types,
                plan_capacity=SolverPlanner(self.packer.solver, self.store), clock=self.clock,
            )
        self.reconcile = ReconcileService(self.config, self.store, self.cluster, self.fleet, clock=self.clock)
        consolidation = (self.store, self.cluster, launches, drains, self.reconcile)
        self.consolidate = SimulatedConsolidate(self._picture, self.config, *consolidation,
                                                solver=lambda: self.solver, clock=self.clock,
                                                max_replacements=policy.max_replacements)
        empty_only = _when_empty(self.config)
        empty_solver = Solver(empty_only, self.solver.index, self.clock, packer=policy.packer)
        self.consolidate_empty = SimulatedConsolidate(self._picture, empty_only, *consolidation,
                                                      solver=lambda: empty_solver, clock=self.clock,
                                                      max_replacements=policy.max_replacements)
        shaper = PodShaper(self.config)
        self.pods = []
        for tp in trace.pods:
            spec = shaper.pending(tp)
            self.pods.append(SimPod(tp, spec, pod_requests(spec).as_dict()))
        self.pending: dict[str, SimPod] = {}
        self.running = 0
        self.arrivals_left = len(self.pods)
        self.requested = 0.0
        self.running_demand: dict[str, float] = {p.name: 0.0 for p in self.config.node_pools}
        self.provisioned = 0.0
        self.rate = 0.0
        self.timeline = Timeline()
        self.prices = GpuPrices(catalog, self.config.zones)
        self.ledger = CostLedger()
        self.never_ran: dict[str, int] = {}
        """Pods the trace ran that never started here, by reason."""
        self.cancelled: dict[str, int] = {}
        """Pods the trace deleted while pending (never ran there) that never started here either, by reason."""
        self.interruption_count = 0
        self.launch_failures = 0
        self.consolidations = 0
        self._validating = False
        """The last underutilized pass proposed decisions: the next one runs to validate them."""
        self._weighable_at = math.inf
        """When a node with pods next becomes weighable by the underutilized search with nothing else changed."""
        self.evictions = 0
        self._pack_at: float | None = None
        self._schedule_at: float | None = None
        self._pack_serial = itertools.count(1)
        self._dirty = True
        self._consolidation_ticks: set[tuple[float, bool]] = set()
        self._consolidation_nodes: dict[str, tuple[tuple[object, ...], ConsolidationNode]] = {}
        self._picture_pools: set[str] | None = None
        self._reconcile_at: float | None = None
        self._register_due = False
        """A node joined since the last reconcile: the next one runs the whole step, not only its giving back."""
        self._ticking = False

    # Time and events

    def moment(self, seconds: float) -> datetime:
        return TRACE_EPOCH + timedelta(seconds=seconds)

    def push(self, at: float, kind: int, payload: Any = None) -> None:
        heapq.heappush(self.events, (at, kind, next(self._seq), payload))

    def run(self) -> RunResult:
        started = time.perf_counter()
        with _rarer_collections():
            self._replay()
        return self._result(time.perf_counter() - started)

    def _replay(self) -> None:
        for pod in self.pods:
            self.push(pod.trace.arrival, _ARRIVE, pod)
        if self.prewarm is not None:
            self.push(self._first_prewarm(), _PREWARM)
        handlers: dict[int, Callable[[Any], None]] = {
            _FINISH: self._finish, _DELETE: self._delete, _RECLAIM: self._reclaim, _READY: self._ready,
            _RECONCILE: self._reconcile,
            _ARRIVE: self._arrive, _SCHEDULE: self._schedule_pending, _DRAIN: self._drain, _NOTICE: self._notice,
            _LAUNCH: self._launch, _PACK: self._pack, _PREWARM: self._prewarm_tick, _CONSOLIDATE: self._consolidate,
        }
        shown = 0.0
        span = max(self._end_estimate - self._start, 1.0)
        while self.events:
            at, kind, _, payload = heapq.heappop(self.events)
            if at > self.t:
                self.t = at
                self.clock.set(self.moment(at))
            handlers[kind](payload)
            if self._finished():
                break
            if self.progress is not None and self.t - shown > 3600:
                shown = self.t
                self.progress(min(1.0, max(0.0, self.t - self._start) / span))
        self._close()
        if self.progress is not None:
            self.progress(1.0)

    def _finished(self) -> bool:
        if self.arrivals_left or self.running:
            return False
        if not self.pending:
            return True
        if any(p.verdict is None for p in self.pending.values()):
            return False
        booting = any(e[1] in (_READY, _LAUNCH) for e in self.events)
        return not booting and not self.store.unavailable_offerings()

    # Pods

    def _arrive(self, pod: SimPod) -> None:
        self.arrivals_left -= 1
        pod.state = "pending"
        pod.pending_since = self.t
        self.pending[pod.uid] = pod
        self.requested += pod.trace.share
        if pod.trace.deleted_at is not None and pod.trace.duration is None:
            self.push(max(pod.trace.deleted_at, self.t), _DELETE, pod)
        self._start_ticks()
        self._bind(self.cluster.schedule([pod]))
        if pod.state == "pending":
            self._want_pack(self.t + self.settings.pack_interval)
        self._record()

    def _bind(self, bindings: list[tuple[SimPod, SimNode]]) -> None:
        for pod, node in bindings:
            self.pending.pop(pod.uid, None)
            pod.running_on = (node.pool.name, gpu_equivalent(pod.spec.resources, node.pool))
            self.running_demand[node.pool.name] += pod.running_on[1]
            pod.state = "running"
            pod.waited += self.t - (pod.pending_since if pod.pending_since is not None else self.t)
            pod.pending_since = None
            pod.started_at = self.t
            self.ledger.pod_started(
                node.instance.instance_id, pod.uid, self.t, pod.trace.share, self.prices.per_gpu_second(pod.trace),
                self.prices.per_gpu_second_allocatable(pod.trace, pod.requests, node.pool, self.config.overhead))
            if pod.first_started is None:
                pod.first_started = self.t
            self._verdict(pod, None)
            pod.token += 1
            self.running += 1
            self._dirty = True
            trace = pod.trace
            end = self.t + trace.duration - pod.ran if trace.duration is not None else max(
                self.t, trace.deleted_at or self.t)
            self.push(end, _FINISH, (pod, pod.token))

    def _finish(self, payload: tuple[SimPod, int]) -> None:
        pod, token = payload
        if pod.state != "running" or pod.token != token:
            return
        pod.ran += self.t - (pod.started_at or self.t)
        pod.state = "done"
        pod.started_at = None
        self._stop_running(pod)
        self.requested -= pod.trace.share
        self.cluster.release(pod)
        self._dirty = True
        if self.pending:
            self._want_schedule()
        self._record()

    def _delete(self, pod: SimPod) -> None:
        if pod.state != "pending":
            return
        self.pending.pop(pod.uid, None)
        pod.state = "deleted"
        pod.waited += self.t - (pod.pending_since or self.t)
        pod.pending_since = None
        if pod.verdict is None:
            self.requested -= pod.trace.share
        if pod.first_started is None:
            soonest = self.settings.pack_interval + self.settings.queue_delay + self.settings.boot_seconds
            if self.t - pod.trace.arrival <= soonest:
                reason = f"deleted within {soonest:.0f} s of arriving, before any new node could be Ready"
            elif pod.verdict:
                reason = f"deleted while pending: {pod.verdict}"
            else:
                reason = "deleted while pending, waiting for capacity on its way"
            self._never_started(pod, reason)
        self._record()

    def _never_started(self, pod: SimPod, reason: str) -> None:
        """Count a pod that never started, by reason: as never ran if the trace ran it, else (the trace itself
        deleted it while pending: it never ran there either) as cancelled — a policy is not short of capacity
        for not running a pod its owner withdrew, often within seconds, before any node could have booted."""
        tally = self.cancelled if pod.trace.duration is None else self.never_ran
        tally[reason] = tally.get(reason, 0) + 1

    def _unbound(self, pod: SimPod, why: str) -> None:
        """The cluster took a running pod off its node (eviction, node gone): pending again, what is left to run."""
        if pod.state != "running":
            return
        pod.ran += self.t - (pod.started_at or self.t)
        pod.started_at = None
        pod.token += 1
        self._stop_running(pod)
        self.evictions += 1
        self._dirty = True
        left = pod.trace.duration - pod.ran if pod.trace.duration is not None else (
            (pod.trace.deleted_at or self.t) - self.t)
        if left <= 0:
            pod.state = "done"
            self.requested -= pod.trace.share
            return
        pod.state = "pending"
        pod.pending_since = self.t
        pod.reported_at = None
        pod.report_every = 0.0
        pod.evicted += 1
        self.pending[pod.uid] = pod
        self._want_schedule()
        self._want_pack(self.t + self.settings.pack_interval)

    def _verdict(self, pod: SimPod, reason: str | None) -> None:
        """Record the packer's word on a pod. A pending pod it refused leaves the requested GPUs (the plots'
        demand): it waits for nothing that is coming."""
        if (reason is None) != (pod.verdict is None):
            self.requested += pod.trace.share if reason is None else -pod.trace.share
        pod.verdict = reason

    def _stop_running(self, pod: SimPod) -> None:
        self.running -= 1
        self.ledger.pod_stopped(pod.uid, self.t)
        if pod.running_on is not None:
            self.running_demand[pod.running_on[0]] -= pod.running_on[1]
            pod.running_on = None

    def _want_schedule(self) -> None:
        if self._schedule_at is None or self._schedule_at > self.t:
            self._schedule_at = self.t
            self.push(self.t, _SCHEDULE)

    def _schedule_pending(self, _: object) -> None:
        if self._schedule_at is not None and self._schedule_at > self.t:
            return
        self._schedule_at = None
        if self.pending:
            self._bind(self.cluster.schedule(sorted(self.pending.values(), key=_order)))
            self._record()

    # The agent and the packer

    def _want_pack(self, at: float) -> None:
        if self._pack_at is None or at < self._pack_at:
            self._pack_at = at
            self.push(at, _PACK)

    def _pack(self, _: object) -> None:
        if self._pack_at is None or self._pack_at > self.t + 1e-9:
            return
        self._pack_at = None
        if not self.pending:
            return
        due = [p for p in self.pending.values() if p.reported_at is None or self.t - p.reported_at >= p.report_every]
        if due:
            covered = self.store.assignments([p.uid for p in due])
            report = sorted((p for p in due if p.uid not in covered), key=_order)
            for pod in due:
                if pod.uid in covered:
                    pod.reported_at, pod.report_every = self.t, self.settings.resync_interval
                    self._verdict(pod, None)
            if report:
                self._report(report)
        upcoming = [p.reported_at + p.report_every for p in self.pending.values() if p.reported_at is not None]
        if any(p.reported_at is None for p in self.pending.values()):
            upcoming.append(self.t + self.settings.pack_interval)
        if upcoming:
            self._want_pack(max(min(upcoming), self.t + self.settings.pack_interval))

    def _report(self, pods: list[SimPod]) -> None:
        document = PendingPodsDocument(schema_version=1, cluster=self.config.cluster_name,
                                       sent_at=self.clock.now(), pods=[p.spec for p in pods])
        outcome = self.packer.handle(document, source=f"agent-{next(self._pack_serial)}")
        refused = {u.pod: u.reason for u in outcome.unschedulable}
        for pod in pods:
            pod.reported_at = self.t
            reason = refused.get(pod.uid)
            self._verdict(pod, reason)
            if reason is None:
                pod.report_every = self.settings.resync_interval
            else:
                pod.report_every = min(max(self.settings.resync_interval, 2 * pod.report_every),
                                       self.settings.max_resync_interval)
                # On the interval's grid: refused pods whose intervals are equal fall due together, one document
                # for all of them, as the agent's resync sends them, not one packing pass each.
                pod.reported_at = math.floor(self.t / pod.report_every) * pod.report_every
        self._record()

    # The fleet and EC2

    def _launch(self, request: LaunchRequest) -> None:
        outcome = self.fleet.launch(request)
        self.launch_failures += len(outcome.failed)
        if outcome.failed and self.pending:
            self._want_pack(self.t + self.settings.pack_interval)

    def _launched(self, instance: SimulatedInstance) -> None:
        self.provisioned += instance.instance_type.gpus
        self.rate += instance.price_per_hour
        self.ledger.launched(instance.instance_id, self.t, instance.price_per_hour, instance.instance_type.gpus,
                             pool=instance.pool)
        self.push(self.t + self.settings.boot(instance.instance_type, self.rng), _READY, instance)
        self._want_reconcile(register=False)
        if instance.capacity_type == "spot":
            hazard = interruption_hazard(instance.interruption_band, self.settings.spot_monthly_interruption)
            if hazard > 0:
                self.push(self.t + float(self.rng.exponential(1 / hazard)), _NOTICE, instance)
        self._record()

    def _terminated(self, instance: SimulatedInstance) -> None:
        self.provisioned -= instance.instance_type.gpus
        self.rate -= instance.price_per_hour
        self.ledger.terminated(instance.instance_id, self.t)
        node = self.cluster.node_of_instance(instance.instance_id)
        if node is not None:
            self.cluster.remove(node, "instance terminated")
        self._dirty = True
        self._record()

    def _ready(self, instance: SimulatedInstance) -> None:
        """The node joins; the consolidate function's reconcile step registers its claim on the next minute."""
        if not instance.alive:
            return
        self.ledger.ready(instance.instance_id, self.t)
        self._mark_warm([instance])
        self.cluster.join(instance, self.config.pool(instance.pool))
        self._dirty = True
        self._want_reconcile(register=True)
        if self.pending:
            self._schedule_pending(None)

    def _reconcile(self, _: object) -> None:
        if self._reconcile_at is None or self._reconcile_at > self.t:
            return
        self._reconcile_at = None
        if self._register_due:
            self._register_due = False
            self.reconcile.run(self.cluster.list_nodes(), self.cluster.list_pods())
        else:
            self.reconcile.give_back(self.cluster.list_nodes(), self.cluster.list_pods())
        if any(c.pods for c in self.store.list_claims(IN_FLIGHT_STATES)):
            self._want_reconcile(register=False)

    def _want_reconcile(self, *, register: bool) -> None:
        """The reconcile step on the next minute, as the consolidate function's schedule runs it: all of it when a
        node joined (to register it), else only its giving back of orphaned claims' room (a claim in flight lists
        pods: once none of them waits for it, its room is the next pods')."""
        self._register_due = self._register_due or register
        step = self.settings.consolidation_interval
        at = (math.floor(self.t / step) + 1) * step
        if self._reconcile_at is None or self._reconcile_at > at:
            self._reconcile_at = at
            self.push(at, _RECONCILE)

    # Interruptions and drains

    def _notice(self, instance: SimulatedInstance) -> None:
        if not instance.alive:
            return
        self.interruption_count += 1
        self.ledger.noticed(instance.instance_id, self.t)
        self.interruptions.handle(parse_notice(self._event(instance, "EC2 Spot Instance Interruption Warning", {
            "instance-id": instance.instance_id, "instance-action": "terminate",
            "instance-action-time": _iso(self.moment(self.t + 120)),
        })))
        self.push(self.t + 120, _RECLAIM, instance)

    def _reclaim(self, instance: SimulatedInstance) -> None:
        """EC2 takes the Spot instance back, and says so with a state-change event."""
        if not instance.alive:
            return
        self.cloud.terminate([instance.instance_id])
        self.interruptions.handle(parse_notice(self._event(instance, "EC2 Instance State-change Notification", {
            "instance-id": instance.instance_id, "state": "terminated"})))

    def _event(self, instance: SimulatedInstance, detail_type: str, detail: dict[str, str]) -> dict[str, Any]:
        return {
            "version": "0", "id": f"sim-{next(self._seq)}", "detail-type": detail_type, "source": "aws.ec2",
            "account": "123456789012", "time": _iso(self.clock.now()), "region": self.config.region,
            "resources": [f"arn:aws:ec2:{self.config.region}:123456789012:instance/{instance.instance_id}"],
            "detail": detail,
        }

    def _drain(self, request: DrainRequest) -> None:
        self.drains.drain(request)

    # Consolidation

    def _node_empty(self, node: SimNode) -> None:
        """A node just became empty (or joined empty): look at it once its wait is over."""
        disruption = node.pool.disruption
        due = max((node.empty_since or self.t) + empty_wait(node.pool).total_seconds(),
                  node.created_at + disruption.min_node_age.total_seconds())
        self._consolidate_on(due, empty=True)

    def _tick_seeing(self, at: float) -> float:
        """The first consolidate tick at or after `at`: when the function, on its one-minute schedule, sees it."""
        step = self.settings.consolidation_interval
        return math.ceil(at / step - 1e-9) * step

    def _consolidate_on(self, at: float, *, empty: bool) -> None:
        tick = self._tick_seeing(at)
        if (tick, empty) not in self._consolidation_ticks:
            self._consolidation_ticks.add((tick, empty))
            self.push(tick, _CONSOLIDATE, empty)

    def _consolidate(self, empty: bool) -> None:
        self._consolidation_ticks.discard((self.t, empty))
        if not self.cluster.nodes:
            if not empty:  # the function's schedule goes on through an empty cluster
                self._consolidate_on(self.t + self.settings.underutilized_interval, empty=False)
            return
        if empty:
            pools = self._candidates(empty=True)
            if pools:
                self._empty_pass(pools)
            return
        if self._validating:
            # The minute after a search: its proposals validated (and carried out or rejected) by the minute's
            # pass, which looks for empty nodes only; the next search on its interval. A second search here
            # would cost a packing pass per candidate again for what the next one finds as well.
            self._validating = False
            self._empty_pass(None)
        elif (self._dirty or self.t >= self._weighable_at) and self._candidates(empty=False):
            self._dirty = False
            self._picture_pools = None
            outcome = self.consolidate.run()
            self._weighable_at = self._next_weighable()
            self.consolidations += len(outcome.acted)
            self._untainted(outcome.untainted)
            self._validating = bool(outcome.proposed)
            if outcome.proposed:  # validated on the next minute, as the consolidate schedule would
                self._consolidate_on(self.t + self.settings.consolidation_interval, empty=False)
                return
        self._consolidate_on(self.t + self.settings.underutilized_interval, empty=False)

    def _next_weighable(self) -> float:
        """When the search could next decide otherwise with nothing in the cluster changed: the first time after now
        that a node with pods comes out of its pool's consolidateAfter since its last pod event (as the function
        sees it: from the first minute after the event), or its minNodeAge, or a warm hold on it ends.
        Every other input of the search changes with the cluster (`_dirty`)."""
        soonest = math.inf
        for node in self.cluster.nodes.values():
            disruption = node.pool.disruption
            if not node.pods or disruption.consolidation_policy != "WhenEmptyOrUnderutilized":
                continue
            changed = node.pods_changed_at if node.pods_changed_at is not None else node.created_at
            times = [self._tick_seeing(changed) + disruption.consolidate_after.total_seconds(),
                     node.created_at + disruption.min_node_age.total_seconds()]
            claim = self.store.get_claim(node.claim_id) if node.claim_id else None
            until = warm_until(claim) if claim is not None else None
            if until is not None:
                times.append((until - TRACE_EPOCH).total_seconds())
            soonest = min([soonest] + [at for at in times if at > self.t])
        return soonest

    def _empty_pass(self, pools: set[str] | None) -> None:
        """The minute's pass limited to empty nodes, over `pools` (None: all): it validates the proposals due
        whatever their reason, and proposes empty nodes."""
        self._picture_pools = pools
        outcome = self.consolidate_empty.run()
        self.consolidations += len(outcome.acted)
        if outcome.proposed or any(why.startswith(_RETRY_SOON) for why in outcome.result.skipped.values()):
            self._consolidate_on(self.t + self.settings.consolidation_interval, empty=True)
        self._untainted(outcome.untainted)

    def _untainted(self, nodes: Sequence[str]) -> None:
        """Nodes whose disrupted taint came off take pending pods at once: kube-scheduler retries its unschedulable
        pods on a Node update."""
        if nodes and self.pending:
            self._want_schedule()

    def _candidates(self, *, empty: bool) -> set[str]:
        """The pools with a node the pass would weigh at all — empty for its pool's consolidateAfter, or (for the
        underutilized search) running pods in a pool that consolidates underused nodes — Registered, Ready,
        uncordoned, not warm, not being disrupted, old enough. A pass with none decides nothing: not run."""
        now = self.clock.now()
        found: set[str] = set()
        for node in self.cluster.nodes.values():
            disruption = node.pool.disruption
            if node.pool.name in found or node.cordoned or \
                    self.t - node.created_at < disruption.min_node_age.total_seconds():
                continue
            if empty:
                if node.pods or node.empty_since is None or \
                        self.t - node.empty_since < empty_wait(node.pool).total_seconds() - 1e-9:
                    continue
            elif not node.pods or disruption.consolidation_policy != "WhenEmptyOrUnderutilized":
                continue
            claim = self.store.get_claim(node.claim_id) if node.claim_id else None
            if claim is None or claim.state is not ClaimState.REGISTERED or warm_held(claim, now):
                continue
            until = disruption_until(claim)
            if until is None or now >= until or awaiting_validation(claim, now):
                found.add(node.pool.name)
        return found

    def _picture(self, claims: Sequence[NodeClaim], now: datetime) -> list[ConsolidationNode]:
        """Every node (of the pools the minute's empty pass looks at: what it decides for a pool depends on that
        pool's nodes and claims alone) with its claim, the pods that would move, since when it has been empty (as
        the consolidate function sees it: from the first minute it found it so), its last pod event (likewise: the
        first minute after a pod was bound to it or taken off it) and the pods on their way: the pending pods
        assigned to its claim. The service also counts the pods still on a draining node assigned to its
        replacement; here a pod stays on a draining node only for the drain queue's delay after a Spot warning,
        while its replacement boots (the simulator sends no rebalance and holds no PodDisruptionBudget), and
        counting them changed no decision of the four policies on the default trace (reports identical,
        2026-11-28), so they are left out of this hot path."""
        by_id = {c.id: c for c in claims}
        incoming: dict[str, int] = {}
        if self.pending:
            for claim_id in self.store.assignments(list(self.pending)).values():
                incoming[claim_id] = incoming.get(claim_id, 0) + 1
        pools = self._picture_pools
        out = []
        for node in self.cluster.nodes.values():
            if pools is not None and node.pool.name not in pools:
                continue
            claim = by_id.get(node.claim_id or "")
            out.append(self._consolidation_node(node, claim, incoming.get(claim.id, 0) if claim else 0))
        return out

    def _consolidation_node(self, node: SimNode, claim: NodeClaim | None, incoming: int) -> ConsolidationNode:
        key = (node.version, id(claim), incoming)
        cached = self._consolidation_nodes.get(node.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        view = self.cluster.view(node)
        pods = node_pods(view, [self.cluster.pod_view(p) for p in node.pods.values()])
        since = changed = None
        if node.empty_since is not None and not pods:
            since = self.moment(self._tick_seeing(node.empty_since))
        if node.pods_changed_at is not None:
            changed = self.moment(self._tick_seeing(node.pods_changed_at))
        found = ConsolidationNode(view, claim, pods, since, incoming, pods_changed_at=changed)
        self._consolidation_nodes[node.name] = (key, found)
        return found

    # Pre-warm

    def _start_ticks(self) -> None:
        if not self._ticking:
            self._ticking = True
            self._consolidate_on(self.t + self.settings.underutilized_interval, empty=False)

    def _first_prewarm(self) -> float:
        """The prewarm schedule starts a lead time and a period before the first arrival (on its 5-minute grid),
        so a window open when the first pod comes has had its chance to bring capacity up."""
        period = PERIOD.total_seconds()
        lead = max([p.lead_time for p in self.config.node_pools] + [self.config.predictive.lead_time])
        first = min((p.trace.arrival for p in self.pods), default=0.0)
        return max(0.0, math.floor((first - lead.total_seconds() - period) / period) * period)

    def _prewarm_tick(self, _: object) -> None:
        assert self.prewarm is not None
        if self.config.predictive.enabled:
            self._record_demand()
        outcome = self.prewarm.run(ScheduleTick(trigger="rate", scheduled_time=self.clock.now()))
        self._mark_warm([self.cloud.instances[i] for i in self.ledger.instance_ids()])
        if outcome.released or outcome.handed_over:
            self._dirty = True  # nodes pre-warm held are the underutilized search's again
            self._consolidate_on(self.t, empty=True)
        self.push(self.t + PERIOD.total_seconds(), _PREWARM)

    def _mark_warm(self, instances: Iterable[SimulatedInstance]) -> None:
        """Tell the cost ledger which instances pre-warm holds now. Holds change on pre-warm's ticks (it takes
        and lets go of capacity then) and when a hold's `warmUntil` passes — seen here on the next tick, so
        at most one period of an expired hold is counted as warm rather than as consolidation lag."""
        if self.prewarm is None:
            return
        now = self.clock.now()
        for instance in instances:
            claim = self.store.get_claim(instance.claim_id) if instance.claim_id else None
            self.ledger.warm(instance.instance_id, self.t, claim is not None and warm_held(claim, now))

    def _record_demand(self) -> None:
        """Pending plus running GPUs per pool, as the reconcile step records them (its tally, kept as pods come
        and go rather than recounted)."""
        demand = {pool: max(0.0, gpus) for pool, gpus in self.running_demand.items()}
        if self.pending:
            owners = self.store.assignments(list(self.pending))
            if owners:
                claims = {c.id: c.pool for c in self.store.list_claims(CLAIMED_STATES)}
                requests = [(claims[cid], self.pending[uid].spec.resources) for uid, cid in owners.items()
                            if cid in claims]
                for pool, gpus in pool_gpus(self.config, requests).items():
                    demand[pool] = demand.get(pool, 0.0) + gpus
        record_demand(self.store, self.config, demand, self.clock.now())

    # Figures

    def _record(self) -> None:
        self.timeline.record(self.t, self.provisioned, self.requested, self.rate)

    def _close(self) -> None:
        for pod in self.pending.values():
            if pod.first_started is None:
                self._never_started(pod, f"never placed: {pod.verdict}" if pod.verdict else "still waiting at the end")
        for instance in self.cloud.alive():
            instance.terminated_at = self.t
        self.ledger.close(self.t)
        self.provisioned = 0.0
        self.rate = 0.0
        self._record()

    def _result(self, seconds: float) -> RunResult:
        prices = self.prices
        lower = 0.0
        allocated = 0.0
        waits = []
        ran = 0
        for pod in self.pods:
            if pod.first_started is None:
                continue
            ran += 1
            waits.append(pod.waited)
            gpu_seconds = pod.trace.share * pod.ran
            allocated += gpu_seconds / 3600
            price = prices.per_gpu_second(pod.trace)
            if price is not None:
                lower += gpu_seconds * price
        instances = list(self.cloud.instances.values())
        cost = self.cloud.cost(self.t)
        spot = sum(i.cost(self.t) for i in instances if i.capacity_type == "spot")
        provisioned = sum(i.instance_type.gpus * i.seconds_up(self.t) / 3600 for i in instances)
        return RunResult(
            name=self.policy.name, cost=cost, lower_bound=lower, gpu_hours_provisioned=provisioned,
            gpu_hours_allocated=allocated, waits=waits, interruptions=self.interruption_count,
            never_ran=dict(self.never_ran), cancelled=dict(self.cancelled), pods_ran=ran, pods=len(self.pods),
            nodes_launched=len(instances),
            spot_share=spot / cost if cost > 0 else 0.0, capacity_errors=self.cloud.capacity_errors,
            launch_failures=self.launch_failures, consolidations=self.consolidations, evictions=self.evictions,
            end=self.t, seconds=seconds, timeline=self.timeline, policy=self.policy.to_json(),
            cost_breakdown=self.ledger.breakdown(cost),
            cost_by_pool=pool_costs(instances, self.t, self.ledger.by_pool()),
        )


@contextmanager
def _rarer_collections() -> Iterator[None]:
    kept = gc.get_threshold()
    gc.set_threshold(*REPLAY_COLLECTOR_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*kept)


def _when_empty(config: Config) -> Config:
    """The configuration with every pool's consolidation limited to empty nodes: the minute's pass."""
    pools = [p.model_copy(update={"disruption": p.disruption.model_copy(
        update={"consolidation_policy": "WhenEmpty"})}) for p in config.node_pools]
    return config.model_copy(update={"node_pools": pools})


def _order(pod: SimPod) -> tuple[float, int]:
    return (pod.trace.arrival, pod.trace.index)


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _no_sleep(_: float) -> None:
    """Waiting is the event queue's job: services that would sleep return at once."""


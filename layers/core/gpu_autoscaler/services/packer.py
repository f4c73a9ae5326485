"""The packer use case: one pending-pods document in; claims stored, pods assigned, launches requested.

The solver decides (`domain.packing`); this module acts, in an order that makes every step safe to
repeat: a redelivered message, a resent document or a crash halfway leave at most one claim per pod.

1. Read the cluster's live claims, the assignments of the document's pods, the unavailable offerings
   and the vCPU quotas, and plan.
2. Pods placed on claims in flight: assign them (a conditional write per pod: a pod already assigned is
   skipped) and add them, with their requests, to their claims (read together, each written on its own
   state and version, a few transactions for the document).
3. New claims: store each (a conditional create; ids are derived from the message and the pods, so a
   redelivery finds the claims it made before), then assign their pods. A claim left with no pod of its
   own (all taken by another claim meanwhile) is closed before it is ever launched.
4. One `LaunchRequest` per claim, one per gang (all its claims, all or nothing), on the launch queue. On a
   redelivery of the same message, claims it created that are still Pending are requested again, in
   case the first attempt stopped before sending; the fleet acts on a claim's state, so a repeat is
   harmless.
5. Demand history for forecasting: the GPUs of the document's pods per pool, in the 5-minute bucket.

`free_room` is the other half of a claim's room bookkeeping: the drain calls it to take the pods it is about
to evict off the claims in flight made for them, so the pods their controllers create in their place (new
uids) find that room free instead of a second node being planned.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.catalog import Catalog
from gpu_autoscaler.domain.fleet import launch_groups
from gpu_autoscaler.domain.initialization import initialization_overdue, initialized_at
from gpu_autoscaler.domain.orphaned_claims import started_since
from gpu_autoscaler.domain.packing.fit import pod_requests
from gpu_autoscaler.domain.packing.quotas import vcpu_budget
from gpu_autoscaler.domain.packing.results import (
    HELD_ATTRIBUTE,
    REQUESTS_ATTRIBUTE,
    SOURCE_ATTRIBUTE,
    Unschedulable,
    claim_held,
    claim_requests,
    requests_attribute,
)
from gpu_autoscaler.domain.packing.solver import Solver
from gpu_autoscaler.domain.pod_events import events_for_plan
from gpu_autoscaler.errors import GpuAutoscalerError, StaleClaim
from gpu_autoscaler.models.claims import CLAIMED_STATES, IN_FLIGHT_STATES, ClaimState, NodeClaim
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.services.claim_writes import withdraw_beyond_limits, write_fresh_many
from gpu_autoscaler.services.demand import pool_gpus, record_demand, shape_gpus

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.packing.results import Plan
    from gpu_autoscaler.domain.pod_events import EventRecorder
    from gpu_autoscaler.models.pods import PendingPod, PendingPodsDocument
    from gpu_autoscaler.ports import CatalogSource, LaunchQueue, QuotaSource, StateStore
    from gpu_autoscaler.settings import FunctionSettings

__all__ = [
    "DEMAND_BUCKET",
    "LAUNCH_REQUEST_CLAIMS",
    "PackOutcome",
    "PackerService",
    "WrongCluster",
    "aws_packer_service",
    "free_room",
]

logger = logging.getLogger(__name__)

DEMAND_BUCKET = timedelta(minutes=5)
LAUNCH_REQUEST_CLAIMS = 10
"""Claims one launch request names at most: one CreateFleet for ten like instances instead of ten calls (EC2's
API rate limits count calls), while a document's requests still spread over several fleet invocations."""


class WrongCluster(GpuAutoscalerError):
    """The document names another cluster than the configuration's: it was sent to the wrong queue."""


@dataclass(frozen=True)
class PackOutcome:
    """What one document led to, for the handler's response, logs and metrics."""

    cluster: str
    pods: int
    created: tuple[str, ...] = ()
    """Ids of the claims created by this call."""
    placed_in_flight: int = 0
    covered: int = 0
    """Pods already covered by a live claim (re-reported, or a duplicate document)."""
    unschedulable: tuple[Unschedulable, ...] = ()
    launch_requests: tuple[tuple[str, ...], ...] = ()
    price_per_hour: float = 0.0
    """USD/h of the claims created."""
    demand: dict[str, float] = field(default_factory=dict)
    events_refused: int = 0
    """Events on the pods the API server refused to take (`Recorded.refused`); the packing stands."""

    def summary(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "pods": self.pods,
            "claimsCreated": list(self.created),
            "podsPlacedInFlight": self.placed_in_flight,
            "podsCovered": self.covered,
            "unschedulable": [{"pod": u.pod, "name": u.name, "reason": u.reason} for u in self.unschedulable],
            "launchRequests": [list(ids) for ids in self.launch_requests],
            "pricePerHour": round(self.price_per_hour, 6),
            "eventsRefused": self.events_refused,
        }


class PackerService:
    """Plans a document's pods and records the plan; safe to call again with the same document."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        catalog: Catalog | CatalogSource,
        launches: LaunchQueue,
        *,
        clock: Clock,
        quotas: QuotaSource | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        """`events`: where the pods are told what became of them (Kubernetes Events); none in the simulator."""
        self.config = config
        self.events = events
        self.store = store
        self.launches = launches
        self.clock = clock
        self._catalog = catalog
        self._quotas = quotas
        self._solver: Solver | None = None
        self._offerings: tuple[object, ...] | None = None

    def solver(self) -> Solver:
        """The solver over the current catalog; rebuilt only when the source's offerings change (prices, or the
        reservations' counts, read again each minute: `catalog.RESERVATION_TTL`)."""
        if isinstance(self._catalog, Catalog):
            if self._solver is None:
                self._solver = Solver(self.config, self._catalog, self.clock)
            return self._solver
        offerings = tuple(self._catalog.offerings())
        if self._solver is None or offerings != self._offerings:
            self._solver = Solver(self.config, Catalog(self._catalog.instance_types(), offerings), self.clock)
            self._offerings = offerings
        return self._solver

    def plan(self, document: PendingPodsDocument, source: str = "", *,
             running: Mapping[str, datetime | None] | None = None) -> tuple[Plan, list[NodeClaim]]:
        """The decision alone, from the store's current state: (plan, live claims it was made against).

        `running`: given when the document's pods are running on a node about to go and their replacements are
        planned (uid → the pod's `status.startTime`, None where unknown). The room held on claims in flight for
        evicted pods' successors then counts as taken (they must not take it), and a claim in flight that lists
        one of these pods covers it only if it was made after the pod started. One made before was made for it
        while it was pending, and the pod was bound elsewhere (kube-scheduler binds the oldest pending pod to
        the first node up, not to the node planned for it): that claim's room goes to another pod when its
        node comes, so counting it as this pod's replacement leaves the pod's successor with no room."""
        live, covered = self._read(document, holding=running is not None)
        return self._plan(document, source, live, covered, running), live

    def _read(self, document: PendingPodsDocument, *, holding: bool = False,
              ) -> tuple[list[NodeClaim], dict[str, str]]:
        """The live claims and the document's pods' assignments: read once per document, since every read of
        the claims returns all the cluster keeps (the cost a backlog of documents pays per document)."""
        if document.cluster != self.config.cluster_name:
            raise WrongCluster(
                f"document for cluster '{document.cluster}' reached the packer of '{self.config.cluster_name}'"
            )
        live = self.store.list_claims(CLAIMED_STATES)
        if holding:
            live = [_holding(c) for c in live]
        covered = self.store.assignments([p.uid for p in document.pods]) if document.pods else {}
        return live, covered

    def _plan(self, document: PendingPodsDocument, source: str, live: list[NodeClaim],
              covered: dict[str, str], running: Mapping[str, datetime | None] | None) -> Plan:
        covered = dict(covered)
        for uid in self._displaced(live, covered):
            del covered[uid]
        covered.update(_listed_on_claims_in_flight(live, document.pods, covered, running))
        solver = self.solver()
        quotas, outside = vcpu_budget(self._quotas, live, solver.index.catalog)
        return solver.solve(
            document.pods,
            claims=live,
            covered=covered,
            unavailable=self.store.unavailable_offerings(),
            source=source,
            quotas=quotas,
            outside=outside,
        )

    def _displaced(self, live: Iterable[NodeClaim], covered: Mapping[str, str]) -> list[str]:
        """Covered pods whose claim's node has been able to take them for longer than the scheduling grace and who
        are still pending: kube-scheduler gave their room to other pods, so the assignment no longer stands for
        capacity.

        The grace counts from the node's initialization (`domain.initialization.initialized_at`: Ready, the
        cloud controller manager's and the node controller's taints gone, its GPUs allocatable), not from its
        registration: a Node object appears minutes before a GPU node can take a GPU pod, and its pods waiting
        through those minutes have lost their room to nobody. A node not initialized yet is still within its
        allowance (`timeouts.registrationTtl` from its registration); past it, the claim is given up (the
        reconcile step ends it, `services.reconcile`) and its pods are planned again now.

        Not while a claim of the same pool that was already in flight when that node came is still in flight:
        kube-scheduler binds pending pods oldest first to whichever node is up, not to the node planned for them,
        so in a burst a node's room goes to the pods of a claim still launching, and that claim's node, when it
        comes, has the room for these. Planning them again then bought a node per such swap (567 instances for
        1,000 pods where 500 would do, on the emulator). Once every such claim has come (or ended), pods still
        pending past the grace really lost their room and are planned again; the wait is bounded by those
        claims' registration timeout."""
        live = list(live)
        now = self.clock.now()
        grace_ended = now - self.config.timeouts.scheduling_grace
        allowance = self.config.timeouts.registration_ttl
        oldest_in_flight: dict[str, datetime] = {}
        for claim in live:
            if claim.state in IN_FLIGHT_STATES:
                known = oldest_in_flight.get(claim.pool)
                oldest_in_flight[claim.pool] = claim.created_at if known is None else min(known, claim.created_at)
        released = set()
        for claim in live:
            if claim.state is not ClaimState.REGISTERED:
                continue
            usable = initialized_at(claim)
            if usable is None:
                if initialization_overdue(claim, now, allowance):
                    released.add(claim.id)
                continue
            awaited = oldest_in_flight.get(claim.pool)
            if usable <= grace_ended and (awaited is None or awaited > usable):
                released.add(claim.id)
        return [uid for uid, claim_id in covered.items() if claim_id in released]

    def handle(self, document: PendingPodsDocument, source: str = "", *,
               running: Mapping[str, datetime | None] | None = None,
               time_left: Callable[[], float] | None = None) -> PackOutcome:
        """Plan and act. `source` is the message id: it keys claim ids, so a redelivery finds its own claims;
        `running` as for `plan` (the interruption function's replacements); `time_left`, the seconds left in the
        invocation, bounds the pods' Events (the last thing done: the record is finished by then)."""
        live, covered = self._read(document, holding=running is not None)
        displaced = self._displaced(live, covered)
        if displaced:
            logger.info("%d pod(s) still pending on registered nodes: planned again", len(displaced))
            self.store.release_pods(displaced)  # so the claims planned for them can take their assignment
        plan = self._plan(document, source, live, covered, running)
        pods = {p.uid: p for p in document.pods}
        by_id = {c.id: c for c in live}
        ttl = self.config.timeouts.pod_assignment_ttl
        # Restores what a crash between storing a claim and assigning its pods left unwritten; pods whose
        # assignment was read are left alone, so a document re-reported while its claims launch writes nothing.
        self.store.assign_many(_group(_listed_on_claims_in_flight(live, document.pods, covered, running)), ttl)
        placed = self._add_to_claims([(by_id[cid], uids) for cid, uids in plan.existing.items()], pods, ttl,
                                     holding=running is not None)
        created = withdraw_beyond_limits(self.store, self.solver(), self._store_claims(plan.claims, pods, ttl))
        groups: dict[str, list[str]] = {}
        for claim in created:
            groups.setdefault(f"gang:{claim.gang}" if claim.gang else claim.id, []).append(claim.id)
        if source:
            self._resend_own_pending(live, source, {c.id for c in plan.claims}, groups)
        requests = _launch_requests(self.config.cluster_name, groups, {**by_id, **{c.id: c for c in created}})
        self.launches.send_many(requests)
        demand = self._record_demand(document.pods, plan, by_id)
        for item in plan.unschedulable:
            logger.warning("pod %s cannot be placed: %s", item.name, item.reason)
        refused = 0
        if self.events is not None:
            named = {**{c.id: c for c in plan.claims}, **by_id, **{c.id: c for c in created}}
            refused = self.events.record(events_for_plan(document.pods, plan, named), time_left=time_left).refused
        return PackOutcome(
            cluster=self.config.cluster_name,
            pods=len(document.pods),
            created=tuple(c.id for c in created),
            placed_in_flight=placed,
            covered=len(plan.covered),
            unschedulable=plan.unschedulable,
            launch_requests=tuple(tuple(r.claim_ids) for r in requests),
            price_per_hour=sum(c.price_per_hour for c in created),
            demand=demand,
            events_refused=refused,
        )

    # Acting on the plan

    def _add_to_claims(self, placed: Sequence[tuple[NodeClaim, Sequence[str]]], pods: Mapping[str, PendingPod],
                       ttl: timedelta, *, holding: bool) -> int:
        """Assign pods to claims in flight (all in one `assign_many`) and record their requests on each claim, all
        claims at once (`write_fresh_many`: one read and a few transactions for the document, not a read and a
        write per claim); returns how many pods were added.

        Each claim is read again first: the plan's copy may be seconds old, and writing from it would put back pods
        a drain took off meanwhile (`free_room`), with their requests. Another writer between that read and the
        write (the fleet recording its attempt) makes that claim read and add again; a claim that moved on
        meanwhile (launched or registered) keeps the pods assigned to it — its node is the one they will run on —
        and only the room bookkeeping of a claim in flight is skipped.

        Every copy is written only with the pods that still fit it (`Solver.holds`, counting the room held for
        evicted pods' successors as taken when planning replacements, `holding`, as the plan did): another planner
        may have taken the room since the plan (the interruption function plans replacements in its own
        invocations, beside the packer's, and several at once in a Spot storm; DynamoDB's conditional write guards
        the item, not the fit). Pods that no longer fit are released (their assignment deleted): the next report
        of them plans them anew, instead of their waiting on a claim whose node has no room for them."""
        assigned = self.store.assign_many({c.id: list(uids) for c, uids in placed}, ttl) if placed else {}
        newly = {claim.id: [u for u in assigned.get(claim.id, []) if u not in claim.pods] for claim, _ in placed}
        newly = {cid: uids for cid, uids in newly.items() if uids}
        if not newly:
            return 0
        solver = self.solver()
        left_out: dict[str, list[str]] = {}

        def add(copy: NodeClaim) -> dict[str, object] | None:
            total, held = claim_requests(copy), claim_held(copy)
            taken = claim_requests(_holding(copy)) if holding else total
            added, left_out[copy.id] = [], []
            for uid in (u for u in newly[copy.id] if u not in copy.pods):
                if solver.holds(copy, taken + pod_requests(pods[uid])):
                    taken, total, held = (taken + pod_requests(pods[uid]), total + pod_requests(pods[uid]),
                                          held - pod_requests(pods[uid]))
                    added.append(uid)
                else:
                    left_out[copy.id].append(uid)
            if not added:
                return None
            attributes = {**copy.attributes, REQUESTS_ATTRIBUTE: requests_attribute(total)}
            if HELD_ATTRIBUTE in attributes:  # successors (or other pending pods) take the held room
                attributes[HELD_ATTRIBUTE] = requests_attribute({k: v for k, v in held.items() if v > 0})
            return {"pods": tuple(copy.pods) + tuple(added), "attributes": attributes}

        _, moved_on = write_fresh_many(self.store, newly, add, still=lambda first, fresh: fresh.state is first.state)
        for claim_id in sorted(moved_on):
            logger.info("claim %s changed while pods were added; its recorded room is left as it was", claim_id)
        released = [uid for cid, uids in left_out.items() if cid not in moved_on for uid in uids]
        if released:
            logger.info("%d pod(s) no longer fit the claim another planner filled meanwhile: released, planned on "
                        "their next report", len(released))
            self.store.release_pods(released)
        return sum(len(uids) for uids in newly.values()) - len(released)

    def _store_claims(self, claims: Sequence[NodeClaim], pods: Mapping[str, PendingPod],
                      ttl: timedelta) -> list[NodeClaim]:
        """Create the claims (or find them again, on a redelivery), then assign their pods: a few transactions
        for a whole document (`create_claims`, `assign_many`), not a write per claim and per pod. Returns the
        claims stored that hold pods, as stored; a claim left with none is closed before it is ever launched."""
        if not claims:
            return []
        existing = self.store.create_claims(claims)
        stored: dict[str, NodeClaim] = {}
        for claim in claims:
            if claim.id not in existing:
                stored[claim.id] = claim
                continue
            found = self.store.get_claim(claim.id)
            if found is None or not found.live:
                logger.info("claim %s exists and is no longer live; not planned again", claim.id)
                continue
            stored[claim.id] = found
        planned = {c.id: c for c in claims if c.id in stored}
        assigned = self.store.assign_many({cid: list(c.pods) for cid, c in planned.items()}, ttl)
        newly = {cid: set(assigned.get(cid, ())) for cid in planned}
        short = [u for cid, c in planned.items() for u in c.pods if u not in newly[cid]]
        for uid, owner in (self.store.assignments(short) if short else {}).items():
            if owner in newly:  # already this claim's (a redelivery): its own
                newly[owner].add(uid)
        kept: list[NodeClaim] = []
        for cid, claim in planned.items():
            mine = newly[cid]
            if not mine:
                self.store.transition(stored[cid], ClaimState.TERMINATED,
                                      "every pod it was made for is covered elsewhere")
                continue
            if len(mine) < len(claim.pods) and not claim.gang:
                stored[cid] = self._trim(stored[cid], tuple(u for u in claim.pods if u in mine), pods)
            kept.append(stored[cid])
        return kept

    def _trim(self, stored: NodeClaim, kept: tuple[str, ...], pods: Mapping[str, PendingPod]) -> NodeClaim:
        """Fewer pods than planned: every candidate still fits them; record what the claim really holds."""
        total = Resources()
        for uid in kept:
            total = total + pod_requests(pods[uid])
        try:
            return self.store.update_claim(
                stored, pods=kept, attributes={**stored.attributes, REQUESTS_ATTRIBUTE: requests_attribute(total)})
        except StaleClaim:
            logger.info("claim %s changed while its pods were trimmed", stored.id)
            return stored

    def _resend_own_pending(self, live: Iterable[NodeClaim], source: str, planned: set[str],
                            groups: dict[str, list[str]]) -> None:
        for claim in live:
            if claim.state is not ClaimState.PENDING or claim.id in planned:
                continue
            if claim.attributes.get(SOURCE_ATTRIBUTE) != source:
                continue
            key = f"gang:{claim.gang}" if claim.gang else claim.id
            if claim.id not in groups.setdefault(key, []):
                groups[key].append(claim.id)

    def _record_demand(self, pods: Sequence[PendingPod], plan: Plan, live: Mapping[str, NodeClaim]) -> dict[str, float]:
        """Pending GPUs per pool seen in this document (placed, in flight or covered), in its 5-minute bucket."""
        pool_of: dict[str, str] = {}
        for claim in plan.claims:
            pool_of.update(dict.fromkeys(claim.pods, claim.pool))
        for claim_id, uids in plan.existing.items():
            pool_of.update(dict.fromkeys(uids, live[claim_id].pool))
        for uid, claim_id in plan.covered.items():
            if claim_id in live:
                pool_of[uid] = live[claim_id].pool
        pairs = [(pool_of[p.uid], p.resources) for p in pods if p.uid in pool_of]
        demand = pool_gpus(self.config, pairs)
        shapes = shape_gpus(self.config, pairs) if self.config.records_pod_shapes else {}
        record_demand(self.store, self.config, {**demand, **shapes}, self.clock.now())
        return demand


def free_room(store: StateStore, claim_ids: Iterable[str], pods: Sequence[PendingPod]) -> dict[str, tuple[str, ...]]:
    """Take `pods` off those claims, still in flight, that were made (in part) for them, and their recorded
    requests with them; claim id → the uids taken off. The drain calls it just before it evicts or deletes
    the pods of a node whose replacement is not there yet.

    Why here and then, and not by having the packer guess which of a claim's pods are gone: the packer sees
    only pending pods and cannot tell an evicted pod from one still running on the doomed node, while the
    drain knows exactly which pods it is about to move. And before the eviction, not after it:

    - a crash (or a lost reply) between the two leaves the pod on its node, so the redelivered request
      evicts it again and calls this again, which finds nothing left to take off and writes nothing; done
      after the eviction, the crash would lose it for good (the pod is gone, nothing names it any more);
    - the controller recreates an evicted pod within a second and the agent reports it soon after: the room
      must already be free when it reaches the packer;
    - every write is computed from the claim as stored now (the uids it still holds, the requests it still
      records), so a repeat, a duplicate message or two drains at once cannot take anything off twice.

    A pod whose eviction is then refused (a PodDisruptionBudget) keeps running with its room freed early;
    the room is its successor's when it does go, or any pending pod's before that, which is demand too.
    Claims already Registered are left alone: their room is their node's, which the scheduler sees.

    The room freed is also recorded as held (`HELD_ATTRIBUTE`) until pending pods take it: the replacements
    the interruption function plans for another doomed node (`running`) do not count it as free. Without
    that, in a storm of Spot warnings, node B's pods took the room node A's drain had just freed, and A's
    evicted pods waited for a claim made only after their eviction.
    """
    requests = {p.uid: pod_requests(p) for p in pods}
    freed: dict[str, tuple[str, ...]] = {}
    for claim_id in dict.fromkeys(claim_ids):
        for _ in range(3):
            claim = store.get_claim(claim_id)
            if claim is None or claim.state not in IN_FLIGHT_STATES:
                break
            taken = tuple(u for u in claim.pods if u in requests)
            if not taken:
                break
            total, held = claim_requests(claim), claim_held(claim)
            for uid in taken:
                total = total - requests[uid]
                held = held + requests[uid]
            left = {name: value for name, value in total.items() if value > 0}
            try:
                store.update_claim(claim, pods=tuple(u for u in claim.pods if u not in requests),
                                   attributes={**claim.attributes, REQUESTS_ATTRIBUTE: requests_attribute(left),
                                               HELD_ATTRIBUTE: requests_attribute(held)})
            except StaleClaim:
                continue  # it moved on meanwhile (launched, registered): look at it again
            freed[claim_id] = taken
            break
    return freed


def _holding(claim: NodeClaim) -> NodeClaim:
    """A copy of a claim in flight whose held room counts as taken (for planning replacements only)."""
    held = claim_held(claim)
    if claim.state not in IN_FLIGHT_STATES or not held:
        return claim
    taken = claim_requests(claim) + held
    return claim.model_copy(update={"attributes": {**claim.attributes, REQUESTS_ATTRIBUTE: requests_attribute(taken)}})


def _listed_on_claims_in_flight(live: Iterable[NodeClaim], pods: Sequence[PendingPod], covered: Mapping[str, str],
                                running: Mapping[str, datetime | None] | None = None) -> dict[str, str]:
    """Pods a claim in flight was made for: theirs until its node comes, even if their assignment is missing
    (a crash between storing the claim and assigning its pods). A running pod (`running`: uid → start) is not
    the claim's if it started since the claim was made (`started_since`): the claim was made for it while it was
    pending, and it runs on another node (`PackerService.plan`)."""
    wanted = {p.uid for p in pods} - set(covered)
    started = running or {}
    out: dict[str, str] = {}
    for claim in live:
        if claim.state in IN_FLIGHT_STATES:
            out.update({uid: claim.id for uid in claim.pods
                        if uid in wanted and not started_since(started.get(uid), claim.created_at)})
    return out


def _launch_requests(cluster: str, groups: Mapping[str, list[str]],
                     claims: Mapping[str, NodeClaim]) -> list[LaunchRequest]:
    """One request per gang (all or nothing); the other claims that ask EC2 for the same thing share a
    request, up to `LAUNCH_REQUEST_CLAIMS` (the fleet asks one CreateFleet for them: `domain.fleet.launch_groups`),
    so a document of 500 like pods is 50 messages and 50 CreateFleet calls, not 500 of each."""
    requests = []
    singles = []
    for key, ids in groups.items():
        if key.startswith("gang:"):
            requests.append(LaunchRequest(cluster=cluster, claim_ids=ids, gang=key.removeprefix("gang:")))
        else:
            singles += [claims[i] for i in ids]
    for group in launch_groups(singles):
        for start in range(0, len(group), LAUNCH_REQUEST_CLAIMS):
            chunk = [c.id for c in group[start:start + LAUNCH_REQUEST_CLAIMS]]
            requests.append(LaunchRequest(cluster=cluster, claim_ids=chunk))
    return requests


def _group(owners: Mapping[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for uid, claim_id in owners.items():
        out.setdefault(claim_id, []).append(uid)
    return out


def aws_packer_service(settings: FunctionSettings, clock: Clock | None = None, *,
                       clients: AwsClients | None = None) -> PackerService:
    """The service as the Lambda runs it: configuration from SSM, catalog from EC2, state in DynamoDB.
    `clients`: the handler's, shared with its dead-letter sender."""
    from gpu_autoscaler.services.aws_environment import AwsEnvironment

    return AwsEnvironment(settings, clock, clients=clients).packer

"""The fleet use case: launch stored NodeClaims with EC2 Fleet, and the one way any claim's capacity ends.

Launch (`FleetService.launch`, one `LaunchRequest`):

1. Read the named claims; only those still Pending are launched, so a redelivered or duplicated message
   launches nothing twice. Claims asking the same thing share one request; a gang is one request.
2. Per group, attempts as `domain.fleet` decides them. Before each CreateFleet call the attempt is written
   on the claims (conditional on their still being Pending), so if this invocation dies after EC2 answered,
   the retried message asks EC2 the same request under the same ClientToken and is given the same
   instances instead of new ones.
3. Each instance launched: Pending → Launched with its instance id, type, zone, capacity type, the reservation
   it runs in (not the one planned: none after a fallback to On-Demand) and price, the image its request named
   for it (`domain.drift`'s `imageId`: drift compares it with its pool's image) and the security groups and subnet
   it was launched with (`securityGroups`, `subnetId`: compared with the configuration's) — a
   conditional write. If the claim moved on meanwhile, the instance is not ours to keep: terminated.
4. Each capacity error marks its offering unavailable for `timeouts.unavailableOfferingTtl`; the claims go
   on with what is left, then On-Demand where the pool allows. Throttling is retried here with backoff and
   jitter; when it persists the message fails and SQS brings it back later (the claims are still Pending).
5. A claim that cannot launch at all: Pending → Terminated with the reason, its pods released so the packer
   plans them again, and each reported unschedulable with that reason (the outcome's `unschedulable`, in the
   packer's shape): in a storm that empties a whole family, the next claims fail too, and the packer reports
   the pods itself only once every candidate offering is marked unavailable at the same time.

Terminate (`FleetService.terminate`): the single path drain, consolidation and reconcile end a claim by —
terminate its instance (only if this cluster owns it), record the claim Terminated, release its pods.
Safe to call again.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.catalog import Catalog
from gpu_autoscaler.domain.drift import IMAGE_ATTRIBUTE, network_attributes
from gpu_autoscaler.domain.fleet import (
    ATTEMPT_ATTRIBUTE,
    Attempt,
    LaunchContext,
    architecture,
    backoff_delay,
    build_request,
    client_token,
    describe_failure,
    first_attempt,
    launch_groups,
    next_attempt,
    read_result,
)
from gpu_autoscaler.domain.user_data import ClusterBootstrap
from gpu_autoscaler.errors import GpuAutoscalerError, RequestThrottled, StaleClaim
from gpu_autoscaler.models.claims import ClaimState, NodeClaim, launched_at
from gpu_autoscaler.models.fleet import PARAM_VALIDATION_ERROR
from gpu_autoscaler.services.claim_writes import write_fresh

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import Config, NodePool
    from gpu_autoscaler.models.catalog import Offering
    from gpu_autoscaler.models.fleet import FleetError, FleetRequest, FleetResult, LaunchedInstance
    from gpu_autoscaler.models.messages import LaunchRequest
    from gpu_autoscaler.ports import CatalogSource, Compute, StateStore
    from gpu_autoscaler.settings import FunctionSettings

__all__ = [
    "PRICE_REFRESH",
    "THROTTLE_RETRIES",
    "FailedClaim",
    "FleetService",
    "LaunchOutcome",
    "LaunchedClaim",
    "NotConfiguredForLaunch",
    "aws_fleet_service",
]

logger = logging.getLogger(__name__)

THROTTLE_RETRIES = 3
"""Backed-off retries of a throttled CreateFleet within one invocation (botocore already retried it)."""
PRICE_REFRESH = timedelta(minutes=10)


@dataclass(frozen=True)
class _OfferingIndex:
    """The catalog's offerings as launches ask them: the cheapest price per offering key, and each reservation's
    offering by id (EC2's type, instance type and zone of it: `domain.fleet.reservation_options`)."""

    prices: dict[tuple[str, str, str], float] = field(default_factory=dict)
    reservations: dict[str, Offering] = field(default_factory=dict)

    @classmethod
    def of(cls, offerings: Iterable[Offering]) -> _OfferingIndex:
        index = cls()
        for offering in offerings:
            index.prices[offering.key] = min(offering.price_per_hour,
                                             index.prices.get(offering.key, offering.price_per_hour))
            if offering.reservation_id:
                index.reservations[offering.reservation_id] = offering
        return index


class NotConfiguredForLaunch(GpuAutoscalerError):
    """This service was built without a launch template: it can terminate, not launch."""


@dataclass(frozen=True)
class LaunchedClaim:
    claim_id: str
    instance_id: str
    instance_type: str
    zone: str
    capacity_type: str
    price_per_hour: float
    seconds_to_launch: float


@dataclass(frozen=True)
class FailedClaim:
    claim_id: str
    reason: str
    code: str
    """One error code (or `NoOfferings`, `NoCapacity`, …) for the failure metric's dimension."""
    pods: tuple[str, ...] = ()
    """The pods released (uids): each is reported unschedulable with the reason, as the packer reports its own."""
    refused: bool = False
    """EC2 refused one of its launches for a reason no retry mends (`FleetError.refusal`), or the configuration
    stopped it (the EFA security group): an operator must act. The claim ends like one that found no capacity,
    with no Lambda error and no dead letter, so the handler counts it apart (`LaunchesRefused`) for an alarm."""


@dataclass
class LaunchOutcome:
    """What one launch request led to, for the handler's response, logs and metrics."""

    cluster: str
    requested: tuple[str, ...]
    launched: list[LaunchedClaim] = field(default_factory=list)
    failed: list[FailedClaim] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(claim id, why): no longer Pending, or not stored."""
    unavailable: list[tuple[str, str, str]] = field(default_factory=list)
    """Offerings marked unavailable by this request."""
    calls: int = 0
    """CreateFleet calls made."""
    throttled: int = 0
    strays: list[str] = field(default_factory=list)
    """Instances launched and terminated again (short gang, claim gone meanwhile)."""

    @property
    def price_per_hour(self) -> float:
        return sum(c.price_per_hour for c in self.launched)

    def summary(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "requested": list(self.requested),
            "launched": [
                {"claim": c.claim_id, "instanceId": c.instance_id, "instanceType": c.instance_type, "zone": c.zone,
                 "capacityType": c.capacity_type, "pricePerHour": round(c.price_per_hour, 6),
                 "secondsToLaunch": round(c.seconds_to_launch, 3)}
                for c in self.launched
            ],
            "failed": [{"claim": f.claim_id, "reason": f.reason, "code": f.code} for f in self.failed],
            "unschedulable": [{"pod": uid, "claim": f.claim_id, "reason": f"claim {f.claim_id}: {f.reason}"}
                              for f in self.failed for uid in f.pods],
            "skipped": [{"claim": cid, "why": why} for cid, why in self.skipped],
            "unavailableOfferings": [list(o) for o in self.unavailable],
            "createFleetCalls": self.calls,
            "strayInstancesTerminated": list(self.strays),
            "pricePerHour": round(self.price_per_hour, 6),
        }


class FleetService:
    """Launches claims and ends them; every step conditional on the claim's stored state."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        compute: Compute,
        *,
        clock: Clock,
        launch_template_id: str | None = None,
        launch_templates: Mapping[str, str] | None = None,
        template_versions: Mapping[str, str] | None = None,
        placement_groups: Mapping[str, str] | None = None,
        efa_check: Callable[[], str | None] | None = None,
        subnet_ids: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
        catalog: CatalogSource | Catalog | None = None,
        bootstrap: ClusterBootstrap | Callable[[], ClusterBootstrap] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        """`subnet_ids`: configuration subnet id → the endpoint's (or a function giving it, called on first
        launch); `catalog`: instance types (architecture, GPU labels, max pods) and prices, read on first
        launch; `bootstrap`: the cluster's coordinates for the user data (default: the configuration's), or
        a function giving them on first launch, which may raise to fail the launch (and is asked again by
        the next one); `launch_templates`: template key (`domain.launch_templates`) → template, where one differs
        from `launch_template_id`; `template_versions`: template id → the version to launch
        (`LaunchContext.template_versions`); `placement_groups`: `pool/zone` → an EFA pool's cluster placement group;
        `efa_check`: why EFA traffic would not flow (the security group), asked before an EFA pool's first launch.
        Without `launch_template_id` the service only terminates (drain, consolidation)."""
        self.config = config
        self.store = store
        self.compute = compute
        self.clock = clock
        self._launch_template_id = launch_template_id
        self._launch_templates = dict(launch_templates or {})
        self._template_versions = dict(template_versions or {})
        self._placement_groups = dict(placement_groups or {})
        self._efa_check = efa_check
        self._efa_problem: tuple[str | None] | None = None
        self._subnet_ids = subnet_ids
        self._catalog = catalog
        self._bootstrap = bootstrap if bootstrap is not None else ClusterBootstrap.from_config(config)
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._context: LaunchContext | None = None
        self._warned_bootstrap = False
        self._index: tuple[datetime, _OfferingIndex] | None = None

    # ---- launch -------------------------------------------------------------------------------------------

    def context(self) -> LaunchContext:
        """Resolved on first launch and kept: subnets, instance types and the cluster's coordinates do not
        change under a warm Lambda. A failure to resolve them fails this launch and is tried again next time."""
        if self._context is None:
            if not self._launch_template_id:
                raise NotConfiguredForLaunch("no launch template id (LAUNCH_TEMPLATE_ID): cannot launch")
            bootstrap = self._bootstrap() if callable(self._bootstrap) else self._bootstrap
            subnets = self._subnet_ids() if callable(self._subnet_ids) else self._subnet_ids
            types = self._catalog.instance_types() if self._catalog is not None else ()
            self._context = LaunchContext.from_config(
                self.config, self._launch_template_id, subnet_ids=subnets, instance_types=types,
                bootstrap=bootstrap, launch_templates=self._launch_templates,
                template_versions=self._template_versions, placement_groups=self._placement_groups,
            )
            missing = bootstrap.missing()
            if missing and not self._warned_bootstrap:
                self._warned_bootstrap = True
                logger.warning("nodes will not be able to join the cluster until the configuration sets %s",
                               ", ".join(missing))
        return self._context

    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        if request.cluster != self.config.cluster_name:
            from gpu_autoscaler.services.packer import WrongCluster

            raise WrongCluster(
                f"launch request for cluster '{request.cluster}' reached the fleet of '{self.config.cluster_name}'"
            )
        outcome = LaunchOutcome(cluster=self.config.cluster_name, requested=tuple(request.claim_ids))
        pending: list[NodeClaim] = []
        for claim_id in dict.fromkeys(request.claim_ids):
            claim = self.store.get_claim(claim_id)
            if claim is None:
                outcome.skipped.append((claim_id, "not stored"))
            elif claim.state is not ClaimState.PENDING:
                outcome.skipped.append((claim_id, f"already {claim.state.value}"))
            else:
                pending.append(claim)
        for claim_id, why in outcome.skipped:
            logger.info("claim %s not launched: %s", claim_id, why)
        if not pending:
            return outcome
        context = self.context()
        for group in launch_groups(pending, request.gang):
            self._launch_group(group, request.gang, context, outcome)
        return outcome

    def _launch_group(self, claims: list[NodeClaim], gang: str | None, context: LaunchContext,
                      outcome: LaunchOutcome) -> None:
        try:
            pool = self.config.pool(claims[0].pool)
        except KeyError:
            self._fail(claims, f"node pool '{claims[0].pool}' is no longer configured", "UnknownPool", outcome)
            return
        problem = self._efa_preflight() if pool.efa else None
        if problem is not None:
            self._fail(claims, problem, "EfaSecurityGroup", outcome, refused=True)
            return
        unavailable = set(self.store.unavailable_offerings())
        attempt, replay = self._resume(claims, pool, context, unavailable)
        remaining = claims
        errors: list[FleetError] = []
        fatal: FleetError | None = None
        calls = 0
        while remaining and attempt is not None:
            if not replay:
                remaining = self._record_attempt(remaining, attempt, context, outcome)
                if not remaining:
                    return
            replay = False
            # The catalog is read before CreateFleet only for reserved capacity (EC2's type of each reservation).
            reserved = attempt.capacity_type == "reserved"
            request = build_request(remaining, pool, attempt, context, gang=gang,
                                    reservations=self._offerings().reservations if reserved else None)
            calls += 1
            reading = read_result(request, self._create_fleet(request, outcome))
            errors.extend(reading.errors)
            self._terminate_strays(reading.strays, outcome)
            self._mark_unavailable(reading.unavailable, unavailable, outcome)
            if reading.dropped:
                logger.info("dropping %s from this launch: %s", sorted({o[0] for o in reading.dropped}),
                            "; ".join(f"{e.code} {e.message}" for e in reading.errors if e.instance_type))
                unavailable.update(reading.dropped)
            done = self._record_launches(remaining, reading.launched, outcome, pool, context)
            remaining = [c for c in remaining if c.id not in done]
            if not remaining:
                return
            if reading.fatal is not None:
                fatal = reading.fatal
                break
            if reading.throttled:
                self._backoff(outcome.throttled, outcome)
            attempt = next_attempt(remaining, pool, attempt, unavailable, context, repeat=reading.repeat)
        if fatal is not None:
            not_sent = fatal.code == PARAM_VALIDATION_ERROR
            said = "the launch request was not sent" if not_sent else "EC2 refused the launch"
            reason, code = f"{said}: {fatal.code} {fatal.message}".strip(), fatal.code
        elif errors:
            reason, code = describe_failure(errors, "")
        elif calls == 0:
            reason = "no offering left to try: every candidate is unavailable, or has no subnet or image"
            code = "NoOfferings"
        else:
            reason, code = "EC2 launched nothing and reported no error", "NoCapacity"
        # Any refusal on the way counts, not only the last error: Spot refused for the account, then no On-Demand
        # capacity, ends on the capacity error while Spot stays refused until someone fixes the account.
        self._fail(remaining, reason, code, outcome, refused=any(error.refusal for error in errors))

    def _efa_preflight(self) -> str | None:
        """The EFA security group check, asked once per warm Lambda (a fix needs a new invocation anyway)."""
        if self._efa_check is None:
            return None
        if self._efa_problem is None:
            self._efa_problem = (self._efa_check(),)
            if self._efa_problem[0]:
                logger.error("EFA pools cannot launch: %s", self._efa_problem[0])
        return self._efa_problem[0]

    def _mark_unavailable(self, marks: Sequence[tuple[tuple[str, str, str], str]],
                          unavailable: set[tuple[str, str, str]], outcome: LaunchOutcome) -> None:
        ttl = self.config.timeouts.unavailable_offering_ttl
        for offering, code in marks:
            self.store.mark_unavailable(offering, ttl, code)
            unavailable.add(offering)
            outcome.unavailable.append(offering)
            logger.info("offering %s unavailable for %s: %s", "/".join(offering), ttl, code)

    def _resume(self, claims: Sequence[NodeClaim], pool: NodePool, context: LaunchContext,
                unavailable: set[tuple[str, str, str]]) -> tuple[Attempt | None, bool]:
        """(attempt to start with, whether it repeats one already asked). An attempt recorded on every claim
        under the token these claims have now is asked again as it was; a recorded attempt under another
        grouping is spent, and the next number starts afresh."""
        recorded = {c.attributes.get(ATTEMPT_ATTRIBUTE) for c in claims}
        if len(recorded) == 1 and None not in recorded:
            (raw,) = recorded
            assert raw is not None
            try:
                attempt, token = Attempt.from_json(raw)
            except (ValueError, KeyError, TypeError):
                logger.warning("unreadable launch attempt on claim %s; starting afresh", claims[0].id)
            else:
                askable = bool(attempt.offerings) and all(z in context.zone_subnets for _, z in attempt.offerings)
                if askable and token == client_token(context.cluster, [c.id for c in claims], attempt.number):
                    logger.info("claims %s: asking attempt %d again (same token)", [c.id for c in claims],
                                attempt.number)
                    return attempt, True
                first = first_attempt(claims, pool, unavailable, context)
                if first is None:
                    return None, False
                return Attempt(attempt.number + 1, first.capacity_type, first.offerings), False
        return first_attempt(claims, pool, unavailable, context), False

    def _record_attempt(self, claims: Sequence[NodeClaim], attempt: Attempt, context: LaunchContext,
                        outcome: LaunchOutcome) -> list[NodeClaim]:
        """Write the attempt on each claim before asking EC2; a claim that moved on meanwhile drops out."""
        token = client_token(context.cluster, [c.id for c in claims], attempt.number)
        recorded = attempt.to_json(token)
        kept = []
        for claim in claims:
            try:  # retried on a fresh copy while still Pending (the packer may have added pods meanwhile)
                kept.append(write_fresh(
                    self.store, claim,
                    lambda c: self.store.update_claim(c, attributes={**c.attributes, ATTEMPT_ATTRIBUTE: recorded}),
                    still=_pending,
                ))
            except StaleClaim:
                outcome.skipped.append((claim.id, "moved on while it was being launched"))
        if len(kept) < len(claims):
            # The rest go on (a gang's rest still all or nothing, as one request), under their own token.
            return self._record_attempt(kept, attempt, context, outcome) if kept else []
        return kept

    def _create_fleet(self, request: FleetRequest, outcome: LaunchOutcome) -> FleetResult:
        for retry in range(THROTTLE_RETRIES + 1):
            try:
                outcome.calls += 1
                return self.compute.create_fleet(request)
            except RequestThrottled:
                if retry == THROTTLE_RETRIES:
                    raise
                self._backoff(retry, outcome)
        raise AssertionError("unreachable")  # pragma: no cover

    def _backoff(self, retry: int, outcome: LaunchOutcome) -> None:
        outcome.throttled += 1
        delay = backoff_delay(retry, self._rng)
        logger.info("CreateFleet throttled or unavailable; waiting %.2f s", delay)
        self._sleep(delay)

    def _record_launches(self, claims: Sequence[NodeClaim], launched: Sequence[LaunchedInstance],
                         outcome: LaunchOutcome, pool: NodePool, context: LaunchContext) -> set[str]:
        """Each claim records the image its request named for its instance (`LaunchContext.images_for` its pool), and
        the security groups and subnet it was launched with (`drift.network_attributes`)."""
        images = context.images_for(pool)
        by_id = {c.id: c for c in claims}
        done: set[str] = set()
        now = self.clock.now()
        for instance in launched:
            claim = by_id.get(instance.claim_id or "")
            if claim is None:
                continue
            price = self._price(instance, claim)
            image = images.get(architecture(instance.instance_type, context.instance_types))
            launch = network_attributes(self.config, instance.zone) | ({IMAGE_ATTRIBUTE: image} if image else {})

            def record(copy: NodeClaim, instance: LaunchedInstance = instance, price: float = price,
                       launch: dict[str, str] = launch) -> NodeClaim:
                return self.store.transition(
                    copy, ClaimState.LAUNCHED, f"launched {instance.instance_type} in {instance.zone}",
                    instance_id=instance.instance_id, instance_type=instance.instance_type, zone=instance.zone,
                    capacity_type=instance.capacity_type, reservation_id=instance.reservation_id,
                    launched_price_per_hour=price, attributes={**copy.attributes, **launch})

            try:  # retried on a fresh copy while still Pending: only a change of state makes the instance a stray
                write_fresh(self.store, claim, record, still=_pending)
            except StaleClaim:
                current = self.store.get_claim(claim.id)
                if current is not None and current.instance_id == instance.instance_id:
                    done.add(claim.id)  # the same launch, recorded by a duplicate of this message
                    continue
                logger.warning("claim %s moved on during its launch; terminating %s", claim.id, instance.instance_id)
                self._terminate_strays([instance.instance_id], outcome)
                done.add(claim.id)
                outcome.skipped.append((claim.id, "moved on while it was being launched"))
                continue
            done.add(claim.id)
            seconds = max(0.0, (now - claim.created_at).total_seconds())
            outcome.launched.append(LaunchedClaim(claim.id, instance.instance_id, instance.instance_type,
                                                  instance.zone, instance.capacity_type, price, seconds))
            logger.info("claim %s launched %s (%s, %s, %s) at %.4f USD/h", claim.id, instance.instance_id,
                        instance.instance_type, instance.zone, instance.capacity_type, price)
        return done

    def _price(self, instance: LaunchedInstance, claim: NodeClaim) -> float:
        """The offering's price from the catalog; the claim's planned price where the catalog has none."""
        found = self._offerings().prices.get((instance.instance_type, instance.zone, instance.capacity_type))
        return claim.price_per_hour if found is None else found

    def _offerings(self) -> _OfferingIndex:
        """What the launches read of the catalog: a domain `Catalog` as it is; a `CatalogSource` read again when the
        index is older than `PRICE_REFRESH` (prices move slowly; a reservation's type and place never change)."""
        if isinstance(self._catalog, Catalog):
            if self._index is None:
                self._index = (self.clock.now(), _OfferingIndex.of(self._catalog.all_offerings()))
            return self._index[1]
        if self._catalog is None:
            return _OfferingIndex()
        now = self.clock.now()
        if self._index is None or now - self._index[0] >= PRICE_REFRESH:
            self._index = (now, _OfferingIndex.of(self._catalog.offerings()))
        return self._index[1]

    def _terminate_strays(self, instance_ids: Sequence[str], outcome: LaunchOutcome) -> None:
        if instance_ids:
            terminated = self.compute.terminate(list(instance_ids))
            outcome.strays.extend(terminated)

    def _fail(self, claims: Sequence[NodeClaim], reason: str, code: str, outcome: LaunchOutcome, *,
              refused: bool = False) -> None:
        for claim in claims:
            try:
                closed = write_fresh(self.store, claim,
                                     lambda c: self.store.transition(c, ClaimState.TERMINATED, reason), still=_pending)
            except StaleClaim:
                logger.info("claim %s moved on before it could be closed; left as it is", claim.id)
                continue
            self.store.release_pods(closed.pods)
            outcome.failed.append(FailedClaim(claim.id, reason, code, tuple(closed.pods), refused))
            logger.warning("claim %s cannot launch, its %d pod(s) released: %s", claim.id, len(closed.pods), reason)

    # ---- terminate ----------------------------------------------------------------------------------------

    def terminate(self, claim: NodeClaim, reason: str) -> NodeClaim:
        """End a claim: its instance terminated (if this cluster owns it), the claim Terminated, its pods
        released. Idempotent: a claim already Terminated is returned as it is."""
        current = self.store.get_claim(claim.id)
        if current is None:
            if claim.instance_id:
                self.compute.terminate([claim.instance_id])
            raise StaleClaim(f"claim {claim.id} is not stored; its instance (if ours) was terminated")
        for _ in range(3):
            if current.state is ClaimState.TERMINATED:
                self.store.release_pods(current.pods)
                return current
            if current.instance_id:
                # Past the garbage collector's grace (longer than EC2's eventual consistency), an instance EC2 does
                # not know is gone, not too new to be known: asking again would only wait.
                settled = self.clock.now() - launched_at(current) > self.config.timeouts.garbage_collection_grace
                done = self.compute.terminate([current.instance_id], unknown_is_gone=settled)
                if current.instance_id not in done:
                    logger.warning("claim %s: instance %s was not terminated (not owned by cluster %s, or gone)",
                                   current.id, current.instance_id, self.config.cluster_name)
            try:
                closed = self.store.transition(current, ClaimState.TERMINATED, reason)
            except StaleClaim:
                # It moved on meanwhile (Launched → Registered, or a launch recorded its instance): read it again.
                current = self.store.get_claim(claim.id) or current
                continue
            self.store.release_pods(closed.pods)
            logger.info("claim %s terminated: %s", closed.id, reason)
            return closed
        raise StaleClaim(f"claim {claim.id} kept changing while it was being terminated")

    def instance_gone(self, claim: NodeClaim) -> bool:
        """Whether the claim's instance no longer exists: EC2 shows it `terminated`, or no longer at all. A
        `shutting-down` one still exists, as Karpenter's instance provider counts it (karpenter-provider-aws
        pkg/providers/instance/instance.go): it may still run its containers' graceful shutdown."""
        if not claim.instance_id:
            return True
        return self.compute.instance_states([claim.instance_id]).get(claim.instance_id, "terminated") == "terminated"


def _pending(claim: NodeClaim) -> bool:
    return claim.state is ClaimState.PENDING


def aws_fleet_service(settings: FunctionSettings, clock: Clock | None = None) -> FleetService:
    """The service as the Lambdas run it: configuration from SSM, state in DynamoDB, EC2 for capacity.

    The fleet function has a launch template (LAUNCH_TEMPLATE_ID) and launches; drain, consolidation and
    the interruption function build it without one and only terminate. Subnets, the catalog and what the
    configuration leaves out of the cluster's coordinates (certificate authority, service CIDR: EKS
    DescribeCluster) are read on the first launch and kept for the execution environment's life; a message
    that launches nothing costs none of those calls. If DescribeCluster fails, the launch fails
    (`ClusterBootstrapUnavailable`, the message retried, then dead-lettered) instead of starting nodes that
    could never join.
    """
    from gpu_autoscaler.adapters.aws.cluster_bootstrap import cluster_bootstrap
    from gpu_autoscaler.adapters.aws.fleet import (
        Ec2Compute,
        efa_security_group_problem,
        resolve_security_groups,
        resolve_subnets,
    )
    from gpu_autoscaler.services.aws_environment import AwsEnvironment

    env = AwsEnvironment(settings, clock)
    if not settings.launch_template_id:
        return env.terminations
    config, ec2 = env.config, env.clients.client("ec2")
    return FleetService(
        config,
        env.store,
        Ec2Compute(ec2, config.cluster_name),
        clock=env.clock,
        launch_template_id=settings.launch_template_id,
        launch_templates={key: template.id for key, template in settings.launch_templates.items()},
        template_versions={template.id: template.version for template in settings.launch_templates.values()},
        placement_groups=settings.placement_groups,
        efa_check=lambda: efa_security_group_problem(
            ec2, list(resolve_security_groups(ec2, config).values())),
        subnet_ids=lambda: resolve_subnets(ec2, config),
        catalog=env.catalog,
        bootstrap=lambda: cluster_bootstrap(config, env.clients.client("eks")),
    )

"""Launch decisions: which CreateFleet request a NodeClaim (or a gang) becomes, and what to do with the answer.

Plain data in, plain data out, no AWS: the fleet service runs these against EC2, the simulator against its
simulated capacity.

- Requests (`build_request`): one per claim, or one per gang (all or nothing: `MinTargetCapacity` = its
  size and one zone, plus one instance type where the pool needs EFA). Overrides are the claim's candidate
  types × the subnets of its zones, cheapest first, at most 60, each with the AMI of its architecture.
  Spot asks `price-capacity-optimized`, On-Demand `lowest-price`, reserved capacity launches into the
  claim's reservations only, each asked as the type EC2 says it is (On-Demand Capacity Reservations before
  Capacity Blocks, in override order).
  Instances and volumes carry the DESIGN tags; user data joins the node with its labels and taints.
- Attempts (`first_attempt`, `next_attempt`): an attempt is a capacity type and the offerings it may use.
  After a failure the claim goes on with the offerings not yet known to be unavailable; when none is left
  it falls back to On-Demand where the pool allows it and the claim is not pinned to its capacity type (a
  consolidation replacement, `CAPACITY_TYPE_PINNED_ATTRIBUTE`); then it gives up.
- Idempotency (`client_token`): the ClientToken is a digest of the cluster, the claims and the attempt
  number, so the same attempt asked twice is the same request to EC2, and a new attempt is a new one.
- Results (`read_result`): instances are matched to claims; each error is classified — capacity errors
  mark their offering unavailable (for the configured TTL; a reservation, itself alone; a full subnet, its
  whole zone; an account that may not launch Spot, all of Spot), throttling backs off with jitter
  (`backoff_delay`), a spent token moves to the next attempt, an error about one instance type drops that
  type from the launch, anything else ends the launch.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_autoscaler.config import CAPACITY_ORDER, Overhead
from gpu_autoscaler.domain.catalog import ANY, is_excluded, unavailable_key
from gpu_autoscaler.domain.launch_templates import (
    block_device_mappings,
    efa_template_key,
    ephemeral_gib,
    launched_efas,
    placement_group_key,
)
from gpu_autoscaler.domain.user_data import ClusterBootstrap, node_setup, render_user_data
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.fleet import (
    MAX_LAUNCH_CONFIGS,
    MAX_OVERRIDES,
    SPOT_ROLE_ERROR,
    SUBNET_FULL_ERROR,
    ErrorKind,
    FleetError,
    FleetOverride,
    FleetRequest,
    FleetResult,
    LaunchConfig,
    LaunchedInstance,
    ReservationOptions,
    ReservationType,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from random import Random

    from gpu_autoscaler.config import Ami, BlockDeviceMapping, CapacityType, Config, NodePool
    from gpu_autoscaler.domain.catalog import OfferingKey
    from gpu_autoscaler.models.catalog import InstanceType, Offering
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.fleet import AllocationStrategy

__all__ = [
    "ATTEMPT_ATTRIBUTE",
    "CAPACITY_TYPE_PINNED_ATTRIBUTE",
    "MAX_ATTEMPTS",
    "STRATEGIES",
    "TAG_GANG",
    "TAG_LAUNCH",
    "Attempt",
    "LaunchContext",
    "ResultReading",
    "architecture",
    "assign_claims",
    "backoff_delay",
    "build_request",
    "candidate_offerings",
    "client_token",
    "describe_failure",
    "first_attempt",
    "fleet_tags",
    "launch_groups",
    "launched_capacity_type",
    "next_attempt",
    "read_result",
    "reservation_options",
]

TAG_GANG = "gpu-autoscaler/gang"
"""On the instances of a gang's request: the gang they were launched for, all or nothing."""
TAG_LAUNCH = "gpu-autoscaler/launch"
"""On the instances of a request for several claims, from launch: the request's ClientToken (also recorded on each
of its claims as their attempt). Which instance is whose is known only from the answer, and tagged afterwards
(`gpu-autoscaler/claim`, CreateTags); until the claims record their instances this tag is what tells the garbage
collector that live claims own them (an invocation that died after CreateFleet, or CreateTags throttled)."""
MAX_ATTEMPTS = 5
"""CreateFleet calls per claim and invocation: the claim's own type, what is left of it, On-Demand."""
CAPACITY_TYPE_PINNED_ATTRIBUTE = "capacityTypePinned"
"""NodeClaim attribute, `"true"`: the claim launches as its own capacity type or not at all, never falling back to
On-Demand. Consolidation sets it on a replacement: its types were kept for being cheaper than what it replaces at
that capacity type's price, and On-Demand could cost more than the node itself. Karpenter pins such a replacement
(`computeConsolidation`, kubernetes-sigs/karpenter pkg/controllers/disruption/consolidation.go) so that "if spot
capacity is insufficient we don't replace the node with a more expensive on-demand node": the launch fails, the
drain waiting for it is abandoned, and the node stays. Drift's replacements are not pinned (Karpenter's are not):
they replace whatever they cost."""
ATTEMPT_ATTRIBUTE = "launchAttempt"
"""NodeClaim attribute: the attempt in flight (JSON), written before CreateFleet is called, so a retried
message asks EC2 the very same request again (same token, same parameters) and gets the same answer."""

STRATEGIES: dict[CapacityType, AllocationStrategy] = {
    "spot": "price-capacity-optimized",
    "on-demand": "lowest-price",
    "reserved": "prioritized",
}
"""Spot: the deepest pools among the cheapest (fewer interruptions than `lowest-price`). On-Demand: the
cheapest. Reserved: the reservations in the order of the overrides (the claim's ranking)."""

_RESERVATION_TYPES: dict[str, ReservationType] = {
    "default": "on-demand-capacity-reservation",
    "capacity-block": "capacity-block",
}
"""A reservation's type as DescribeCapacityReservations (and the configuration) words it → CreateFleet's word."""
_FAMILY = re.compile(r"^(?P<category>[a-z]+?)(?P<generation>\d+)(?P<suffix>[a-z0-9-]*)$")


@dataclass(frozen=True)
class LaunchContext:
    """What every request of one cluster shares, resolved once: where and from what instances launch."""

    cluster: str
    zone_subnets: Mapping[str, str]
    """Availability zone → subnet id at the endpoint (the configuration's on AWS, stand-ins on an emulator)."""
    launch_template_id: str
    images: Mapping[str, str]
    """Architecture (`x86_64`, `arm64`) → AMI. The template holds the x86_64 one; arm64 types override it."""
    bootstrap: ClusterBootstrap
    instance_types: Mapping[str, InstanceType] = field(default_factory=dict)
    """What is known of the candidate types (architecture, GPUs, max pods); names alone work too."""
    launch_templates: Mapping[str, str] = field(default_factory=dict)
    """Capacity type → launch template (`domain.launch_templates`); absent ones use `launch_template_id`."""
    template_versions: Mapping[str, str] = field(default_factory=dict)
    """Launch template id → the version launches ask: the one the stack last wrote (its `LatestVersionNumber`). Not
    `$Default`: a stack update adds a version and leaves the default at 1 (infra/nodes.py), so a new image or
    security group would never reach a node. Absent (templates no deployment named: hand-built contexts), `$Default`."""
    ami: Ami | None = None
    """The global image (its family decides the default volumes); absent, launches carry no volumes."""

    placement_groups: Mapping[str, str] = field(default_factory=dict)
    """`pool/zone` → the cluster placement group an EFA pool's gangs launch into there."""

    def template_for(self, capacity_type: CapacityType, efa_interfaces: int = 0) -> str:
        return self.launch_templates.get(efa_template_key(capacity_type, efa_interfaces),
                                         self.launch_templates.get(capacity_type, self.launch_template_id))

    def version_of(self, template_id: str) -> str:
        return self.template_versions.get(template_id, "$Default")

    def images_for(self, pool: NodePool) -> Mapping[str, str]:
        """Architecture → AMI for a pool's nodes: its own image where it sets one, else the global one."""
        return self.images if pool.ami is None else pool.ami.images()

    def volumes_for(self, pool: NodePool) -> tuple[BlockDeviceMapping, ...]:
        """The pool's volumes (its `blockDeviceMappings`, else its `ephemeralStorage`); none without an image."""
        if pool.block_device_mappings:
            return tuple(pool.block_device_mappings)
        ami = pool.ami or self.ami
        if ami is None:
            return ()
        return block_device_mappings(ami, ephemeral_gib(pool))

    overhead: Overhead = field(default_factory=Overhead)
    """The configuration's: the kubelet reservations the user data states are the ones the packer planned with."""

    @classmethod
    def from_config(
        cls,
        config: Config,
        launch_template_id: str,
        *,
        subnet_ids: Mapping[str, str] | None = None,
        instance_types: Iterable[InstanceType] = (),
        bootstrap: ClusterBootstrap | None = None,
        launch_templates: Mapping[str, str] | None = None,
        template_versions: Mapping[str, str] | None = None,
        placement_groups: Mapping[str, str] | None = None,
    ) -> LaunchContext:
        """`subnet_ids` maps the configuration's subnet ids to the endpoint's (identity where absent)."""
        mapping = subnet_ids or {}
        return cls(
            cluster=config.cluster_name,
            zone_subnets={zone: mapping.get(subnet, subnet) for zone, subnet in config.network.subnets.items()},
            launch_template_id=launch_template_id,
            images=config.ami.images(),
            bootstrap=bootstrap or ClusterBootstrap.from_config(config),
            instance_types={t.name: t for t in instance_types},
            launch_templates=dict(launch_templates or {}),
            template_versions=dict(template_versions or {}),
            ami=config.ami,
            placement_groups=dict(placement_groups or {}),
            overhead=config.overhead,
        )


@dataclass(frozen=True)
class Attempt:
    """One CreateFleet call's worth of choice: a capacity type and the offerings (type, zone) it may use."""

    number: int
    capacity_type: CapacityType
    offerings: tuple[tuple[str, str], ...]
    """Ranked, best first; (instance type, zone)."""

    def to_json(self, token: str) -> str:
        return json.dumps({"number": self.number, "capacityType": self.capacity_type, "token": token,
                           "offerings": [list(o) for o in self.offerings]}, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> tuple[Attempt, str]:
        """(attempt, the token it was asked under)."""
        data = json.loads(raw)
        return cls(int(data["number"]), data["capacityType"], tuple((t, z) for t, z in data["offerings"])), str(
            data["token"]
        )


# ---- grouping ----------------------------------------------------------------------------------------------


def launch_groups(claims: Sequence[NodeClaim], gang: str | None = None) -> list[list[NodeClaim]]:
    """Claims asked together: a gang is one group (all or nothing); otherwise claims that ask for exactly the
    same thing (pool, capacity type, candidates, zones, reservation) share one request of N instances."""
    if not claims:
        return []
    if gang is not None:
        return [list(claims)]
    groups: dict[tuple[object, ...], list[NodeClaim]] = {}
    for claim in claims:
        key = (claim.pool, claim.capacity_type, claim.instance_types, claim.zones, claim.reservation_id, claim.gang)
        groups.setdefault(key, []).append(claim)
    return list(groups.values())


# ---- offerings and attempts --------------------------------------------------------------------------------


def architecture(instance_type: str, known: Mapping[str, InstanceType] | None = None) -> str:
    """`arm64` or `x86_64`. From the catalog when known; else from the name: Graviton families carry a `g`
    after the generation (g5g, c7gn, p6e-gb200), x86 ones do not (g5, g6e, p5en, gr6)."""
    if known and instance_type in known:
        return "arm64" if known[instance_type].architecture == "arm64" else "x86_64"
    match = _FAMILY.match(instance_type.split(".", 1)[0])
    return "arm64" if match and "g" in match.group("suffix") else "x86_64"


def _shared(values: Sequence[Sequence[str]]) -> list[str]:
    """The values every sequence holds, in the first one's order."""
    first, *rest = values
    common = set(first).intersection(*rest) if rest else set(first)
    return [v for v in first if v in common]


def candidate_offerings(
    claims: Sequence[NodeClaim],
    capacity_type: CapacityType,
    unavailable: Iterable[tuple[str, str, str]],
    context: LaunchContext,
    images: Mapping[str, str] | None = None,
) -> tuple[tuple[str, str], ...]:
    """The (type, zone) pairs every claim accepts, ranked by type then zone, not known to be unavailable (reserved
    capacity: while one of the claims' reservations there is not marked), in a zone we have a subnet for, of an
    architecture we have an image for (`images`, default the context's); ≤ 60, ≤ 50 types."""
    images = context.images if images is None else images
    blocked = set(unavailable)
    reservations = {c.reservation_id for c in claims if c.reservation_id} if capacity_type == "reserved" else set()
    types = _shared([c.instance_types for c in claims])
    zones = [z for z in _shared([c.zones for c in claims]) if z in context.zone_subnets]
    out: list[tuple[str, str]] = []
    used_types: list[str] = []
    for instance_type in types:
        if architecture(instance_type, context.instance_types) not in images:
            continue
        for zone in zones:
            if is_excluded((instance_type, zone, capacity_type), blocked, reservations):
                continue
            if instance_type not in used_types:
                if len(used_types) == MAX_LAUNCH_CONFIGS:
                    return tuple(out)
                used_types.append(instance_type)
            out.append((instance_type, zone))
            if len(out) == MAX_OVERRIDES:
                return tuple(out)
    return tuple(out)


def first_attempt(
    claims: Sequence[NodeClaim],
    pool: NodePool,
    unavailable: Iterable[tuple[str, str, str]],
    context: LaunchContext,
) -> Attempt | None:
    """The claims' own capacity type with what is available of their candidates; else the fallback."""
    capacity_type = claims[0].capacity_type
    blocked = set(unavailable)
    offerings = candidate_offerings(claims, capacity_type, blocked, context, context.images_for(pool))
    if offerings:
        return Attempt(0, capacity_type, offerings)
    return _fallback(claims, pool, capacity_type, 0, blocked, context)


def next_attempt(
    claims: Sequence[NodeClaim],
    pool: NodePool,
    previous: Attempt,
    unavailable: Iterable[tuple[str, str, str]],
    context: LaunchContext,
    *,
    repeat: bool = False,
) -> Attempt | None:
    """After `previous` left these claims without instances: what is left of the same capacity type if that
    is something new to ask (or `repeat`: the last call told us nothing about the offerings), else On-Demand
    where the pool allows it, else None (give up). Never more than `MAX_ATTEMPTS`."""
    number = previous.number + 1
    if number >= MAX_ATTEMPTS:
        return None
    blocked = set(unavailable)
    left = candidate_offerings(claims, previous.capacity_type, blocked, context, context.images_for(pool))
    if left and (repeat or set(left) != set(previous.offerings)):
        return Attempt(number, previous.capacity_type, left)
    return _fallback(claims, pool, previous.capacity_type, number, blocked, context)


def _fallback(
    claims: Sequence[NodeClaim],
    pool: NodePool,
    capacity_type: CapacityType,
    number: int,
    unavailable: Iterable[tuple[str, str, str]],
    context: LaunchContext,
) -> Attempt | None:
    if capacity_type == "on-demand" or "on-demand" not in pool.capacity_types or any(
            c.attributes.get(CAPACITY_TYPE_PINNED_ATTRIBUTE) == "true" for c in claims):
        return None
    offerings = candidate_offerings(claims, "on-demand", unavailable, context, context.images_for(pool))
    return Attempt(number, "on-demand", offerings) if offerings else None


# ---- the request -------------------------------------------------------------------------------------------


def client_token(cluster: str, claim_ids: Sequence[str], attempt: int) -> str:
    """Deterministic per (cluster, claims, attempt): a repeat of an attempt is idempotent at EC2."""
    digest = hashlib.sha256(f"{cluster}\n{','.join(sorted(claim_ids))}".encode()).hexdigest()
    return f"gpu-autoscaler-{digest[:40]}-{attempt}"


def fleet_tags(cluster: str, pool: str, claims: Sequence[NodeClaim], gang: str | None = None,
               token: str | None = None) -> dict[str, str]:
    """DESIGN's tags. A request for several claims names none of them: each instance gets its claim's tags
    once it is known which instance is whose (`assign_claims`); until then it carries the request's `token`."""
    tags = {**L.cluster_tags(cluster), L.TAG_NODE_POOL: pool}
    if len(claims) == 1:
        tags.update(L.claim_tags(cluster, claims[0].id))
    else:
        tags["Name"] = f"{cluster}/{pool}/{gang or 'batch'}"
        if token:
            tags[TAG_LAUNCH] = token
    if gang:
        tags[TAG_GANG] = gang
    return tags


def reservation_options(claims: Sequence[NodeClaim], pool: NodePool,
                        reservations: Mapping[str, Offering]) -> ReservationOptions:
    """The claims' own reservations (the solver planned each claim on one), or every reservation of the pool, each
    asked as the type EC2 says it is: `reservations` are the catalog's reserved offerings by id, whose
    `reservation_type` is DescribeCapacityReservations' `ReservationType`. EC2 "attempts to launch instances into each
    Capacity Reservation type in the order that you specify" (EC2 API Reference, ReservedCapacityOptionsRequest), so
    a Capacity Block asked for as an On-Demand Capacity Reservation is never used. A reservation the catalog does not
    hold (no catalog given, or no longer offered) is asked as the configuration says (its `type`); where the API does
    not answer, the catalog's offerings carry that same configured type. On-Demand Capacity Reservations are tried
    before Capacity Blocks."""
    wanted = {c.reservation_id for c in claims if c.reservation_id}
    configured = {r.id: r.type for r in pool.capacity_reservations}
    ids = [i for i in configured if not wanted or i in wanted] + sorted(wanted - configured.keys())
    kinds: set[ReservationType] = set()
    placements: dict[tuple[str, str, str], None] = {}
    for reservation in ids:
        offering = reservations.get(reservation)
        kind = offering.reservation_type if offering is not None and offering.reservation_type else \
            configured.get(reservation, "default")
        kinds.add(_RESERVATION_TYPES[kind])
        if offering is not None:
            placements[(offering.instance_type, offering.zone, reservation)] = None
        else:  # where the claims planned on it say it is
            placements.update(((t, z, reservation), None) for c in claims if c.reservation_id == reservation
                              for t in c.instance_types for z in c.zones)
    ordered = tuple(k for k in ("on-demand-capacity-reservation", "capacity-block") if k in kinds)
    return ReservationOptions(reservation_ids=tuple(ids), reservation_types=ordered, placements=tuple(placements))


def build_request(
    claims: Sequence[NodeClaim],
    pool: NodePool,
    attempt: Attempt,
    context: LaunchContext,
    *,
    gang: str | None = None,
    reservations: Mapping[str, Offering] | None = None,
) -> FleetRequest:
    """The CreateFleet request of one attempt for these claims (one instance each); `reservations`: the catalog's
    reserved offerings by reservation id (`reservation_options`)."""
    gang = gang or claims[0].gang
    ids = tuple(c.id for c in claims)
    token = client_token(context.cluster, ids, attempt.number)
    single_claim = claims[0].id if len(claims) == 1 else None
    configs: dict[tuple[str, str | None], list[FleetOverride]] = {}
    images = context.images_for(pool)
    all_or_nothing = gang is not None and len(claims) > 1
    user_data: dict[str, str] = {}  # per instance type: its offerings in other zones boot the same node
    for rank, (instance_type, zone) in enumerate(attempt.offerings):
        arch = architecture(instance_type, context.instance_types)
        known = context.instance_types.get(instance_type)
        # EFA pools: each type from the template with its EFA count; a gang in its zone's placement group.
        efa = launched_efas(pool, known) if known is not None else 0
        override = FleetOverride(
            instance_type=instance_type,
            zone=zone,
            subnet_id=context.zone_subnets[zone],
            priority=float(rank),
            # The templates hold the global x86_64 image; anything else is named per override.
            image_id=images[arch] if images[arch] != context.images.get("x86_64") else None,
            placement_group=context.placement_groups.get(placement_group_key(pool.name, zone))
            if pool.efa and all_or_nothing else None,
        )
        rendered = user_data.get(instance_type)
        if rendered is None:
            setup = node_setup(pool, attempt.capacity_type, instance_type=known or instance_type,
                               claim_id=single_claim, gang=gang, overhead=context.overhead)
            rendered = user_data[instance_type] = render_user_data(context.bootstrap, setup)
        template = context.template_for(attempt.capacity_type, efa) if efa else None
        configs.setdefault((rendered, template), []).append(override)
    return FleetRequest(
        cluster=context.cluster,
        pool=pool.name,
        claim_ids=ids,
        gang=gang,
        attempt=attempt.number,
        capacity_type=attempt.capacity_type,
        allocation_strategy=STRATEGIES[attempt.capacity_type],
        target_capacity=len(ids),
        min_target_capacity=len(ids) if all_or_nothing else None,
        single_availability_zone=all_or_nothing,
        single_instance_type=all_or_nothing and pool.efa,
        launch_template_id=context.template_for(attempt.capacity_type),
        launch_template_version=context.version_of(context.template_for(attempt.capacity_type)),
        launch_configs=tuple(LaunchConfig(user_data=ud, launch_template_id=template, overrides=tuple(o),
                                          launch_template_version=context.version_of(template) if template else None)
                             for (ud, template), o in configs.items()),
        client_token=token,
        tags=fleet_tags(context.cluster, pool.name, claims, gang, token),
        reservation=reservation_options(claims, pool, reservations or {})
        if attempt.capacity_type == "reserved" else None,
        block_device_mappings=context.volumes_for(pool),
    )


# ---- the answer --------------------------------------------------------------------------------------------


def launched_capacity_type(requested: CapacityType, lifecycle: str | None,
                           fallback_on_demand: bool = False) -> CapacityType:
    """What an instance was bought as, from EC2's `Lifecycle`. A reserved request's instances report
    `on-demand` (they run in an On-Demand Capacity Reservation) or `capacity-block`: both are reserved."""
    if lifecycle == "spot":
        return "spot"
    if lifecycle in ("capacity-block", "interruptible-capacity-reservation"):
        return "reserved"
    if requested == "reserved" and not fallback_on_demand:
        return "reserved"
    return "on-demand" if lifecycle == "on-demand" else requested


def assign_claims(claim_ids: Sequence[str], instances: Sequence[LaunchedInstance]) -> tuple[LaunchedInstance, ...]:
    """The k-th instance is the k-th claim's (every claim of a request accepts every override, so any order
    is right); instances beyond the claims keep no claim. Instances already assigned keep theirs."""
    taken = {i.claim_id for i in instances if i.claim_id}
    free = iter([c for c in claim_ids if c not in taken])
    out = []
    for instance in instances:
        if instance.claim_id is None:
            claim_id = next(free, None)
            instance = instance.model_copy(update={"claim_id": claim_id}) if claim_id else instance
        out.append(instance)
    return tuple(out)


@dataclass(frozen=True)
class ResultReading:
    """What the service must do with one CreateFleet answer."""

    launched: tuple[LaunchedInstance, ...] = ()
    """Instances with the claim each is for, and the reservation each runs in (`_in_reservation`)."""
    strays: tuple[str, ...] = ()
    """Instances to terminate: an all-or-nothing request that came back short, or more than asked for."""
    unavailable: tuple[tuple[tuple[str, str, str], str], ...] = ()
    """(offering, error code) to mark unavailable; an offering of `ANY` instance type (and zone) stands for every
    offering of its zone (or any zone) and capacity type (`domain.catalog.is_excluded`)."""
    dropped: tuple[tuple[str, str, str], ...] = ()
    """Offerings EC2 refused for their instance type (an invalid parameter for that type): left out of this
    launch's next attempts, not recorded as missing capacity for everyone."""
    throttled: bool = False
    conflict: bool = False
    fatal: FleetError | None = None
    errors: tuple[FleetError, ...] = ()

    @property
    def repeat(self) -> bool:
        """The call told nothing about the offerings: the next attempt may ask them again."""
        return (self.throttled or self.conflict) and not self.unavailable


def read_result(request: FleetRequest, result: FleetResult) -> ResultReading:
    instances = assign_claims(request.claim_ids, tuple(_in_reservation(request, i) for i in result.instances))
    strays = [i.instance_id for i in instances if i.claim_id is None]
    launched = [i for i in instances if i.claim_id is not None]
    short = request.min_target_capacity is not None and len(launched) < request.min_target_capacity
    if short:
        strays += [i.instance_id for i in launched]
        launched = []
    marks: dict[tuple[str, str, str], str] = {}
    dropped: dict[tuple[str, str, str], None] = {}
    fatal = None
    for error in result.errors:
        if error.kind is ErrorKind.UNAVAILABLE:
            for offering in _made_unavailable(request, error):
                marks.setdefault(offering, error.code)
        elif error.kind is ErrorKind.FATAL and error.instance_type:
            # About one type only (Karpenter drops such a type and launches the rest): every offering of it.
            dropped.update((o, None) for o in request.offerings if o[0] == error.instance_type)
        elif error.kind is ErrorKind.FATAL and fatal is None:
            fatal = error
    if short and not marks and not result.errors:
        # All or nothing came back short without saying why: the pools it used cannot hold the gang now.
        marks = {mark: "UnfulfillableCapacity" for i in result.instances
                 for mark in _records(request, (i.instance_type, i.zone, request.capacity_type))}
    return ResultReading(
        launched=tuple(launched),
        strays=tuple(strays),
        unavailable=tuple(marks.items()),
        dropped=tuple(dropped),
        throttled=ErrorKind.THROTTLED in result.error_kinds,
        conflict=ErrorKind.CONFLICT in result.error_kinds,
        fatal=fatal,
        errors=result.errors,
    )


def _in_reservation(request: FleetRequest, instance: LaunchedInstance) -> LaunchedInstance:
    """The instance with the reservation it runs in — not the one its claim was planned on: an instance that is not
    reserved (a claim fallen back to On-Demand) runs in none, so a Capacity Block's end is not its end; a reserved
    one in what EC2 said (`CapacityReservationId`, read by the adapter), else in the request's only reservation of
    its type and zone (EC2 launches a reserved fleet into the targeted reservations alone), else unknown here."""
    if instance.capacity_type != "reserved" or request.reservation is None:
        found = None
    elif instance.reservation_id:
        found = instance.reservation_id
    else:
        there = request.reservation.named_at(instance.instance_type, instance.zone)
        found = there[0] if len(there) == 1 else None
    return instance if found == instance.reservation_id else instance.model_copy(update={"reservation_id": found})


def _made_unavailable(request: FleetRequest, error: FleetError) -> list[OfferingKey]:
    """What an error of kind UNAVAILABLE makes unavailable: every Spot offering when the account may not launch
    Spot (Karpenter's `MarkCapacityTypeUnavailable`, one `ANY` record); every offering of a zone whose subnet is
    out of addresses, of every capacity type (one subnet per zone; Karpenter's `MarkSubnetUnavailable`); else the
    offering EC2 named, or every offering asked when it named none (a reserved one by its reservations, `_records`)."""
    if error.code == SPOT_ROLE_ERROR:
        return [(ANY, ANY, "spot")]
    if error.code == SUBNET_FULL_ERROR and error.zone:
        return [(ANY, error.zone, capacity_type) for capacity_type in CAPACITY_ORDER]
    return [mark for offering in ([error.offering] if error.offering else request.offerings)
            for mark in _records(request, offering)]


def _records(request: FleetRequest, offering: OfferingKey) -> list[OfferingKey]:
    """The records an offering of the request is marked by: a reserved one's name the request's reservations there
    (`unavailable_key`; EC2 names the override, a type in a zone, not the reservation), or, where none is known
    there, its key, which stands for every reservation of the type and zone."""
    instance_type, zone, capacity_type = offering
    if capacity_type != "reserved" or request.reservation is None:
        return [offering]
    return [unavailable_key(instance_type, zone, capacity_type, r)
            for r in request.reservation.named_at(instance_type, zone)] or [offering]


def describe_failure(errors: Sequence[FleetError], fallback: str) -> tuple[str, str]:
    """(reason in words, one error code for the failure metric) for claims that could not launch."""
    if not errors:
        return fallback, "NoCapacity"
    parts: list[str] = []
    for error in errors[:5]:
        where = " ".join(x for x in (error.instance_type, error.zone, error.capacity_type) if x)
        parts.append(f"{error.code}{f' ({where})' if where else ''}")
    more = f" and {len(errors) - 5} more" if len(errors) > 5 else ""
    return "could not launch: " + "; ".join(parts) + more, errors[-1].code


def backoff_delay(retry: int, rng: Random, *, base: float = 0.5, cap: float = 8.0, fixed: float = 0.0) -> float:
    """Exponential backoff with jitter: uniform in [fixed·d, d], d = min(cap, base·2ⁿ). Full jitter (`fixed` 0,
    AWS's advice for throttling) spreads contending callers; waiting for something to propagate (EC2's eventual
    consistency) needs a floor too, else unlucky draws spend every retry within milliseconds ("equal jitter")."""
    ceiling = min(cap, base * (2 ** max(0, retry)))
    return ceiling * (fixed + (1.0 - fixed) * rng.random())

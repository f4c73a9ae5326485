"""The AWS `CatalogSource`: GPU instance types, where each is offered, and what each offering costs.

- Instance types: `DescribeInstanceTypes`, restricted by name to the GPU families (g*, p*: every EC2
  type with a GPU is in one of them), GPU data corrected by the override table.
- Where: `DescribeInstanceTypeOfferings` by availability zone, restricted to the configured zones.
- Prices: see `pricing` (Pricing API / spot price history, with bundled snapshots as fallback).
- Reserved: the node pools' active capacity reservations, read with `DescribeCapacityReservations`; an id
  EC2 does not know, or a reservation for another platform or tenancy than our nodes', is skipped, logged
  once. Where that API does not answer (moto lacks it, or permission is denied), the reservations'
  `instanceType`/`availabilityZone` from the configuration stand in, logged once.
  A reservation is already paid for, so using it costs nothing extra; its offering is priced like
  Karpenter's, on-demand / 10,000,000: near zero, so it is always preferred, yet two reservations still rank
  by what their instances are worth.

Instance types are read once per source; offerings are re-priced when older than `price_ttl`, and the
reservations read again when older than `reservation_ttl` (see `RESERVATION_TTL`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from gpu_autoscaler.adapters.aws.instance_types import instance_type_from_api, load_gpu_overrides
from gpu_autoscaler.adapters.aws.pricing import (
    OnDemandPrices,
    PriceSnapshot,
    SpotPrices,
    WarnOnce,
    describe_error,
    pricing_endpoint,
)
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.domain.catalog import Catalog
from gpu_autoscaler.models.catalog import Offering

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.adapters.aws.instance_types import GpuFacts
    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import CapacityReservation, Config
    from gpu_autoscaler.models.catalog import InstanceType

__all__ = [
    "CAPACITY_BLOCK_EXPIRING",
    "GPU_NAME_PATTERNS",
    "NODE_PLATFORM",
    "NODE_TENANCY",
    "RESERVATION_TTL",
    "RESERVED_PRICE_DIVISOR",
    "UNKNOWN_RESERVATION",
    "Ec2CatalogSource",
    "Reservation",
    "describe_reservations",
    "unusable_reason",
]

logger = logging.getLogger(__name__)

GPU_NAME_PATTERNS = ("g*", "p*")
RESERVED_PRICE_DIVISOR = 10_000_000

_UNAVAILABLE = (ClientError, BotoCoreError, ResponseParserError, NotImplementedError)
"""How an API that is not there shows itself: AWS errors, and moto, which raises NotImplementedError
in-process and answers an unparseable HTML 500 in server mode."""


@dataclass(frozen=True)
class Reservation:
    id: str
    instance_type: str
    zone: str
    type: str
    """`default` (an On-Demand Capacity Reservation) or `capacity-block`."""
    available: int | None
    from_api: bool = True
    """False where the configuration stands in for the API: `available` is then its `instanceCount`."""


RESERVATION_TTL = timedelta(minutes=1)
"""How long a reservation's AvailableInstanceCount is used before it is read again: each launch into it and each
termination (freed after "several minutes to clean up", EC2 User Guide, capacity-blocks-launch.html) changes it.
Karpenter reads reservations each minute (karpenter-provider-aws pkg/controllers/nodeclass/capacityreservation.go).

Between two readings our own launches are the change that matters (the packer would plan a slot already taken, its
launch fail with ReservationCapacityExceeded, the pods wait for On-Demand). Karpenter keeps the count in its one
process and decrements it on launch (`MarkLaunched`, pkg/providers/capacityreservation/types.go); our functions are
separate short-lived processes whose shared state is the claims table, where a launch is a claim's Launched
transition, with its time. So each reserved offering says when its count was read (`Offering.counted_at`), and the
solver takes off the claims launched into it after that (`SolvePass`). The time is taken after the call answered:
a launch recorded while the call was under way counts as in it, an overestimate for at most a minute, which Karpenter
prefers too ("we'd rather overestimate than underestimate"); EC2's own lag in counting a launch errs the same way.
A termination is not added back: EC2 frees the slot only after cleaning up, which the next reading shows."""

CAPACITY_BLOCK_EXPIRING = timedelta(minutes=40)
"""A Capacity Block's last 40 minutes: EC2 sends its one expiration warning then and terminates its instances from 30
minutes before the end (EC2 User Guide, "Capacity Blocks for ML"), so an instance launched into it meanwhile would
get no warning. Karpenter takes the block as expiring from then and offers it no more (karpenter-provider-aws
`CapacityReservationFromEC2`)."""


NODE_PLATFORM = "Linux/UNIX"
NODE_TENANCY = "default"
"""What our nodes are to EC2: Linux/UNIX (AL2023 and Bottlerocket alike) with default tenancy (the launch templates
set none). An instance runs in a reservation only if it "Has matching attributes (instance type, platform,
Availability Zone, and tenancy)" (EC2 User Guide, "Launch instances into an existing Capacity Reservation"); a
reservation's `InstancePlatform` may also be e.g. `Red Hat Enterprise Linux`, `SUSE Linux`, `Ubuntu Pro`, `Windows`
or `Linux with SQL Server Standard`, and its `Tenancy` `dedicated`, none of which takes them."""


_INTERRUPTIBLE = (
    "interruptible: its instances are terminated on a 2-minute warning whenever the owner reclaims the capacity, "
    "but reserved capacity is planned as uninterruptible and near free (every pod would go there first, with no "
    "label to keep one off) and launched without CreateFleet's interruptible-capacity-reservation type"
)
"""DescribeCapacityReservations' `Interruptible` (EC2 User Guide, "Interruptible Capacity Reservations"; "Monitor
interruptible Capacity Reservations": the warning comes "2 minutes before your instances are terminated"). Karpenter
offers them with a `capacity-reservation-interruptible` label pods select on, after ODCRs and blocks
(karpenter-provider-aws pkg/providers/instance/filter/filter.go), and launches them with that reservation type
(instance/types.go): none of that exists here, so they are not offered rather than offered as what they are not."""


def unusable_reason(item: Mapping[str, Any]) -> str | None:
    """Why our nodes cannot (or must not) run in the reservation EC2 describes as `item` (its platform, its tenancy,
    `_INTERRUPTIBLE`), or None. A field EC2 leaves out is taken to match: what is not known to differ is not ruled
    out."""
    problems = []
    if item.get("Interruptible"):
        problems.append(_INTERRUPTIBLE)
    platform = item.get("InstancePlatform", NODE_PLATFORM)
    if platform != NODE_PLATFORM:
        problems.append(f"platform {platform}, not {NODE_PLATFORM}")
    tenancy = item.get("Tenancy", NODE_TENANCY)
    if tenancy != NODE_TENANCY:
        problems.append(f"tenancy {tenancy}, not {NODE_TENANCY}")
    return "; ".join(problems) or None


UNKNOWN_RESERVATION = frozenset({"InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed"})
"""How EC2 answers a DescribeCapacityReservations call naming an id it does not know (a Capacity Block purged after
its end, a typo): the whole call fails, whatever the other ids."""


def describe_reservations(
    ec2: Any, wanted: Sequence[CapacityReservation], warn: WarnOnce | None = None, *, until: datetime | None = None
) -> list[Reservation]:
    """The active reservations among `wanted`, from the API, or from the configuration when the API is not there
    (permission denied, moto). `until`: the offerings made of them may be used until then, so a Capacity Block
    expiring by then is left out.

    One call for all ids; when EC2 refuses it for an unknown id, one call per id, and the ids EC2 does not know
    are skipped (warned once each), as Karpenter does (karpenter-provider-aws
    pkg/providers/capacityreservation/provider.go: "we only receive this error when requesting a single ID"). Only
    active reservations are asked for, as Karpenter's query (types.go, `DescribeCapacityReservationsInput`)."""
    warn = warn or WarnOnce(logger)
    if not wanted:
        return []
    ids = sorted({r.id for r in wanted})
    try:
        try:
            items = _describe(ec2, ids)
        except ClientError as error:
            if _code(error) not in UNKNOWN_RESERVATION:
                raise
            items = []
            for reservation_id in ids:
                try:
                    items += _describe(ec2, [reservation_id])
                except ClientError as one:
                    if _code(one) not in UNKNOWN_RESERVATION:
                        raise
                    warn(f"reservation-unknown:{reservation_id}",
                         "capacity reservation %s: EC2 does not know it (%s): ignored",
                         reservation_id, describe_error(one))
    except _UNAVAILABLE as error:
        usable = [r for r in wanted if r.instance_type and r.availability_zone]
        skipped = sorted(r.id for r in wanted if not (r.instance_type and r.availability_zone))
        note = f"; skipped {', '.join(skipped)} (no instanceType/availabilityZone configured)" if skipped else ""
        warn(
            "reservations-from-config",
            "DescribeCapacityReservations unavailable (%s): using %d reservation(s) as configured%s",
            describe_error(error), len(usable), note,
        )
        return [
            Reservation(r.id, r.instance_type or "", r.availability_zone or "", r.type, r.instance_count,
                        from_api=False)
            for r in usable
        ]
    found: list[Reservation] = []
    for item in items:
        why = unusable_reason(item)
        if why is not None:
            warn(f"reservation-unusable:{item['CapacityReservationId']}",
                 "capacity reservation %s takes no node of ours (%s): ignored", item["CapacityReservationId"], why)
            continue
        end = item.get("EndDate")
        if (item.get("ReservationType") == "capacity-block" and end is not None and until is not None
                and until >= end - CAPACITY_BLOCK_EXPIRING):
            continue
        found.append(Reservation(
            id=item["CapacityReservationId"],
            instance_type=item["InstanceType"],
            zone=item["AvailabilityZone"],
            type=item.get("ReservationType", "default"),
            available=item.get("AvailableInstanceCount"),
        ))
    return found


def _describe(ec2: Any, ids: list[str]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    paginator = ec2.get_paginator("describe_capacity_reservations")
    for page in paginator.paginate(CapacityReservationIds=ids, Filters=[{"Name": "state", "Values": ["active"]}]):
        items += page.get("CapacityReservations", [])
    return items


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class Ec2CatalogSource:
    """`CatalogSource` over EC2 (real or moto): GPU instance types and their offerings in one region."""

    def __init__(
        self,
        ec2_client: Any,
        region: str,
        *,
        zones: Sequence[str] | None = None,
        on_demand: OnDemandPrices | None = None,
        spot: SpotPrices | None = None,
        reservations: Sequence[CapacityReservation] = (),
        prefix_delegation: bool = False,
        overrides: dict[str, GpuFacts] | None = None,
        clock: Clock | None = None,
        price_ttl: timedelta = timedelta(minutes=10),
        reservation_ttl: timedelta = RESERVATION_TTL,
        name_patterns: Sequence[str] = GPU_NAME_PATTERNS,
    ) -> None:
        self.region = region
        self._ec2 = ec2_client
        self._zones = tuple(sorted(zones)) if zones else None
        self._warn = WarnOnce(logger)
        self._clock = clock or SystemClock()
        snapshot = None if on_demand and spot else PriceSnapshot.load()
        self._on_demand = on_demand or OnDemandPrices(region, None, snapshot, self._warn, self._clock)
        self._spot = spot or SpotPrices(region, ec2_client, snapshot, self._clock, self._warn)
        self._reservations = tuple(reservations)
        self._prefix_delegation = prefix_delegation
        self._overrides = load_gpu_overrides() if overrides is None else overrides
        self._price_ttl = price_ttl
        self._reservation_ttl = reservation_ttl
        self._patterns = tuple(name_patterns)
        self._types: tuple[InstanceType, ...] | None = None
        self._offered: dict[str, tuple[str, ...]] = {}
        self._priced: tuple[Offering, ...] = ()
        """The on-demand and spot offerings of the last pricing."""
        self._on_demand_prices: dict[str, float] = {}
        self._offerings: tuple[Offering, ...] | None = None
        self._priced_at: datetime | None = None
        self._counted_at: datetime | None = None

    @classmethod
    def from_config(
        cls,
        clients: AwsClients,
        config: Config | None = None,
        *,
        use_pricing_api: bool = True,
        clock: Clock | None = None,
    ) -> Ec2CatalogSource:
        """The source a Lambda or command uses: zones, reservations and prefix delegation from `config`.

        The Pricing API client points at the Price List endpoint of the region's partition (`pricing_endpoint`;
        none in AWS GovCloud (US)), on the endpoint URL `clients` use (moto answers it with an error, and the
        snapshot takes over); `use_pricing_api=False` skips it altogether.
        """
        region = clients.region
        ec2 = clients.client("ec2")
        warn = WarnOnce(logger)
        snapshot = PriceSnapshot.load()
        endpoint = pricing_endpoint(region) if use_pricing_api else None
        pricing = clients.for_region(endpoint).client("pricing") if endpoint else None
        zones: list[str] | None = None
        reservations: list[CapacityReservation] = []
        if config is not None:
            if config.region == region:
                zones = config.zones
                reservations = [r for pool in config.node_pools for r in pool.capacity_reservations]
            else:
                logger.warning(
                    "configuration is for %s, catalog asked for %s: its zones and reservations are ignored",
                    config.region, region,
                )
        return cls(
            ec2,
            region,
            zones=zones,
            on_demand=OnDemandPrices(region, pricing, snapshot, warn, clock),
            spot=SpotPrices(region, ec2, snapshot, clock, warn),
            reservations=reservations,
            prefix_delegation=bool(config and config.prefix_delegation),
            clock=clock,
        )

    # CatalogSource

    def instance_types(self) -> list[InstanceType]:
        if self._types is None:
            self._load_types()
        assert self._types is not None
        return list(self._types)

    def offerings(self) -> list[Offering]:
        now = self._clock.now()
        if self._priced_at is None or now - self._priced_at >= self._price_ttl:
            self._priced = tuple(self._price())
            self._priced_at = now
            self._counted_at = None
        if self._offerings is None or self._counted_at is None or now - self._counted_at >= self._reservation_ttl:
            reserved, self._counted_at = self._reserved(now)
            self._offerings = self._priced + tuple(reserved)
        return list(self._offerings)

    def catalog(self) -> Catalog:
        return Catalog(self.instance_types(), self.offerings())

    @property
    def on_demand_source(self) -> str:
        return self._on_demand.source

    # Loading

    def _load_types(self) -> None:
        offered: dict[str, set[str]] = {}
        filters = [{"Name": "location", "Values": list(self._zones)}] if self._zones else []
        paginator = self._ec2.get_paginator("describe_instance_type_offerings")
        for page in paginator.paginate(LocationType="availability-zone", Filters=filters):
            for item in page.get("InstanceTypeOfferings", []):
                if self._zones is None or item["Location"] in self._zones:
                    offered.setdefault(item["InstanceType"], set()).add(item["Location"])
        types: list[InstanceType] = []
        paginator = self._ec2.get_paginator("describe_instance_types")
        pages = paginator.paginate(Filters=[{"Name": "instance-type", "Values": list(self._patterns)}])
        for page in pages:
            for raw in page.get("InstanceTypes", []):
                if raw["InstanceType"] not in offered:
                    continue
                instance_type = instance_type_from_api(
                    raw, self._overrides, self._prefix_delegation, self._disagreement
                )
                if instance_type.is_gpu:
                    types.append(instance_type)
        self._types = tuple(sorted(types, key=lambda t: t.name))
        self._offered = {t.name: tuple(sorted(offered[t.name])) for t in self._types}

    def _disagreement(self, name: str, api: GpuFacts, table: GpuFacts) -> None:
        self._warn(
            f"override:{name}",
            "DescribeInstanceTypes now says %s has %s × %s (%d devices, %d MiB); the override table's %s × %s "
            "(%d devices, %d MiB) is used: review data/gpu_overrides.json",
            name, api.gpus, api.gpu_model, api.gpu_devices, api.gpu_memory_mib,
            table.gpus, table.gpu_model, table.gpu_devices, table.gpu_memory_mib,
        )

    def _price(self) -> list[Offering]:
        """The on-demand and spot offerings; the on-demand prices are kept to price the reservations with."""
        types = {t.name: t for t in self.instance_types()}
        on_demand = self._on_demand_prices = self._on_demand.prices(list(types))
        spot_places = [
            (name, zone) for name, t in types.items() if "spot" in t.capacity_types for zone in self._offered[name]
        ]
        spot = self._spot.quotes(spot_places, on_demand)
        offerings: list[Offering] = []
        for name, instance_type in types.items():
            for zone in self._offered[name]:
                if "on-demand" in instance_type.capacity_types and name in on_demand:
                    offerings.append(Offering(
                        instance_type=name, zone=zone, capacity_type="on-demand", price_per_hour=on_demand[name]
                    ))
                quote = spot.get((name, zone))
                if quote is not None:
                    offerings.append(Offering(
                        instance_type=name, zone=zone, capacity_type="spot", price_per_hour=quote.price_per_hour,
                        interruption_band=quote.interruption_band,
                    ))
        return offerings

    def _reserved(self, now: datetime) -> tuple[list[Offering], datetime]:
        """The reservations' offerings, used until `now` + `reservation_ttl`, and when their counts were read: after
        the call answered (`RESERVATION_TTL`)."""
        types = {t.name for t in self.instance_types()}
        on_demand = self._on_demand_prices
        offerings: list[Offering] = []
        until = now + self._reservation_ttl
        reservations = describe_reservations(self._ec2, self._reservations, self._warn, until=until)
        counted_at = self._clock.now()
        for reservation in reservations:
            if reservation.instance_type not in types:
                self._warn(
                    f"reservation-type:{reservation.id}",
                    "capacity reservation %s holds %s, which is not a GPU type offered here: ignored",
                    reservation.id, reservation.instance_type,
                )
                continue
            if self._zones is not None and reservation.zone not in self._zones:
                self._warn(
                    f"reservation-zone:{reservation.id}",
                    "capacity reservation %s is in %s, where no subnet is configured: ignored",
                    reservation.id, reservation.zone,
                )
                continue
            offerings.append(Offering(
                instance_type=reservation.instance_type,
                zone=reservation.zone,
                capacity_type="reserved",
                price_per_hour=on_demand.get(reservation.instance_type, 0.0) / RESERVED_PRICE_DIVISOR,
                reservation_id=reservation.id,
                reservation_type=reservation.type,
                available_count=reservation.available,
                counted_at=counted_at if reservation.from_api else None,
            ))
        return offerings, counted_at

"""A stand-in for EC2 Capacity Reservations, which moto does not have, written from the EC2 documentation.

What it implements (EC2 User Guide, "On-Demand Capacity Reservations", "Capacity Blocks for ML", "Launch
instances into an existing Capacity Reservation"; EC2 API Reference, CreateCapacityReservation,
DescribeCapacityReservations, CancelCapacityReservation, CreateFleet `ReservedCapacityOptions`):

- A reservation holds `TotalInstanceCount` instances of one instance type in one Availability Zone;
  `AvailableInstanceCount` is what is left. Instance match criteria `open` (the default) or `targeted`. One made
  here runs until cancelled (`EndDateType` `unlimited`); a Capacity Block ends when its days do (`limited`, its
  `EndDate`).
- A launch with `CapacityReservationPreference` `open` (the default when a launch says nothing) runs in any
  active `open` reservation with a matching type and zone and uses it up; `none` never does ("Launch
  instances into an existing Capacity Reservation": "open — the instance can run in any open Capacity
  Reservation that has matching attributes"; "none — the instance avoids running in a Capacity
  Reservation even if one is available").
- A `reserved-capacity` instant fleet launches only into the reservations its `CapacityReservationTarget`
  names that are of a type its `ReservationTypes` lists, type by type in that order, each type's in override
  priority order: an override matching none of them (type and zone) fails for that override, and what the
  reservations cannot hold fails with `ReservationCapacityExceeded` ("The targeted Capacity Reservation does not
  have enough available capacity", EC2 API Reference, Common error codes), a Capacity Block's with
  `InsufficientInstanceCapacity` (the Capacity Blocks fleet tutorial), the rest launching;
  an unknown reservation is `InvalidCapacityReservationId.NotFound`. The instances launch as On-Demand
  ones in the reservation (Lifecycle `on-demand`; a Capacity Block's `capacity-block`).
- DescribeInstances names the reservation an instance runs in (`CapacityReservationId`; a block's instances also
  carry `InstanceLifecycle` `capacity-block`); a terminated instance gives its reservation its place back.

moto launches the instances; this module decides which launches happen, asks moto for them through
`request.forward`, and keeps the reservations' counts.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.strict.core import Answer, Refusal, after, answer, ask_after, on_reset
from gpu_autoscaler.emulator.strict.ec2 import launch_template_data, launch_template_specs, zone_of_subnet

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.strict.core import AwsRequest

__all__ = ["Reservation", "register_reservation", "reservations"]


@dataclass
class Reservation:
    id: str
    account: str
    region: str
    instance_type: str
    zone: str
    total: int
    available: int
    match: str = "open"
    """`open` or `targeted`."""
    kind: str = "default"
    """`default` (On-Demand Capacity Reservation) or `capacity-block`."""
    state: str = "active"
    created: datetime = field(default_factory=lambda: datetime.now(UTC))
    end: datetime | None = None
    """When it ends; None: when cancelled. A Capacity Block always ends, at the end of the days bought: one given none
    runs for one day, the shortest EC2 sells ("Capacity Blocks for ML": durations in 1-day increments)."""
    tags: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind == "capacity-block" and self.end is None:
            self.end = self.created + timedelta(days=1)

    def matches(self, instance_type: str, zone: str) -> bool:
        return self.state == "active" and (self.instance_type, self.zone) == (instance_type, zone)

    def describe(self) -> dict[str, Any]:
        """As DescribeCapacityReservations shows it (EC2 API Reference, CapacityReservation): `EndDateType`
        `unlimited` ("remains active until you explicitly cancel it") or `limited` ("expires automatically at a
        specified date and time", `EndDate`)."""
        ends = {"EndDateType": "limited", "EndDate": self.end} if self.end else {"EndDateType": "unlimited"}
        return {
            "CapacityReservationId": self.id, "OwnerId": self.account,
            "CapacityReservationArn": f"arn:aws:ec2:{self.region}:{self.account}:capacity-reservation/{self.id}",
            "InstanceType": self.instance_type, "InstancePlatform": "Linux/UNIX", "AvailabilityZone": self.zone,
            "Tenancy": "default", "TotalInstanceCount": self.total, "AvailableInstanceCount": self.available,
            "State": self.state, **ends, "InstanceMatchCriteria": self.match,
            "CreateDate": self.created, "StartDate": self.created, "ReservationType": self.kind,
            "Tags": [{"Key": k, "Value": v} for k, v in self.tags],
        }


_lock = threading.Lock()
_reservations: dict[str, Reservation] = {}
_placed: dict[str, Reservation] = {}
"""Instance id → the reservation it runs (or ran) in."""
_released: set[str] = set()
"""Instances terminated: their place is back in their reservation."""


@on_reset
def _forget() -> None:
    with _lock:
        _reservations.clear()
        _placed.clear()
        _released.clear()


def reservations() -> list[Reservation]:
    with _lock:
        return list(_reservations.values())


def register_reservation(reservation: Reservation) -> Reservation:
    """Put a reservation with a chosen id (the configuration's) in place: EC2 has no API for that, the
    customer's reservations pre-exist on AWS."""
    with _lock:
        _reservations[reservation.id] = reservation
    return reservation


def _mine(request: AwsRequest) -> list[Reservation]:
    return [r for r in reservations() if (r.account, r.region) == (request.account, request.region)]


# ---- the reservation API -----------------------------------------------------------------------------------


@answer("ec2", "CreateCapacityReservation")
def _create(request: AwsRequest) -> Answer:
    params = request.params
    tags = tuple((t["Key"], t["Value"]) for spec in params.get("TagSpecifications", [])
                 if spec.get("ResourceType") == "capacity-reservation" for t in spec.get("Tags", []))
    count = int(params.get("InstanceCount") or 0)
    reservation = register_reservation(Reservation(
        id=f"cr-{secrets.token_hex(9)[:17]}", account=request.account, region=request.region,
        instance_type=str(params.get("InstanceType", "")), zone=str(params.get("AvailabilityZone", "")),
        total=count, available=count, match=str(params.get("InstanceMatchCriteria") or "open"), tags=tags,
    ))
    return Answer(result={"CapacityReservation": reservation.describe()})


def _find(request: AwsRequest, ids: list[str]) -> list[Reservation]:
    known = {r.id: r for r in _mine(request)}
    for reservation_id in ids:
        if reservation_id not in known:
            raise Refusal("InvalidCapacityReservationId.NotFound",
                          f"The capacity reservation ID '{reservation_id}' does not exist")
    return [known[i] for i in ids] if ids else list(known.values())


@answer("ec2", "DescribeCapacityReservations")
def _describe(request: AwsRequest) -> Answer:
    found = _find(request, list(request.params.get("CapacityReservationIds", [])))
    for spec in request.params.get("Filters", []):
        field = {"instance-type": "instance_type", "availability-zone": "zone", "state": "state",
                 "instance-match-criteria": "match"}.get(spec.get("Name", ""))
        if field:
            found = [r for r in found if getattr(r, field) in spec.get("Values", [])]
    return Answer(result={"CapacityReservations": [r.describe() for r in found]})


@answer("ec2", "CancelCapacityReservation")
def _cancel(request: AwsRequest) -> Answer:
    [reservation] = _find(request, [str(request.params.get("CapacityReservationId", ""))])
    reservation.state = "cancelled"
    return Answer(result={"Return": True})


# ---- instances in reservations ----------------------------------------------------------------------------


@answer("ec2", "DescribeInstances", first=True)
def _describe_instances(request: AwsRequest) -> Answer | None:
    """An instance in a reservation is described with it: `CapacityReservationId` ("The ID of the Capacity
    Reservation", EC2 API Reference, Instance), and a Capacity Block's with `InstanceLifecycle` `capacity-block`
    (InstanceLifecycleType; how Karpenter tells a block's instances, karpenter-provider-aws
    pkg/providers/instance/types.go `NewInstance`). The rest of the answer is whatever the other stand-ins, else moto,
    give (`ask_after`)."""
    with _lock:
        placed = {instance_id: (r.id, r.kind) for instance_id, r in _placed.items()}
    if not placed:
        return None
    answered = ask_after(_describe_instances, request).result or {}

    def shown(instance: dict[str, Any]) -> dict[str, Any]:
        found = placed.get(str(instance.get("InstanceId")))
        if found is None:
            return instance
        reservation, kind = found
        lifecycle = {"InstanceLifecycle": "capacity-block"} if kind == "capacity-block" else {}
        return {**instance, "CapacityReservationId": reservation, **lifecycle}

    return Answer(result={**answered, "Reservations": [
        {**r, "Instances": [shown(i) for i in r.get("Instances", [])]} for r in answered.get("Reservations", [])]})


@after("ec2", "TerminateInstances")
def _give_back(request: AwsRequest, answer: dict[str, Any]) -> None:
    """A terminated instance's place is its reservation's again: "When you stop or terminate an instance in a
    Capacity Block, it takes several minutes to clean up your instance ... Then, the available capacity in your
    Capacity Block will update to show another instance available to use" (EC2 User Guide, "Launch instances using
    Capacity Blocks"); an On-Demand Capacity Reservation is used by running instances alike ("Capacity Reservations
    ... are automatically used by running instances", "On-Demand Capacity Reservations"). Given back at once, not
    minutes later; once per instance, however often it is terminated."""
    with _lock:
        for item in answer.get("TerminatingInstances", []):
            instance_id = str(item.get("InstanceId"))
            reservation = _placed.get(instance_id)
            if reservation is not None and instance_id not in _released:
                _released.add(instance_id)
                reservation.available = min(reservation.total, reservation.available + 1)


# ---- launches ----------------------------------------------------------------------------------------------


_FLEET_TYPES = {"default": "on-demand-capacity-reservation", "capacity-block": "capacity-block"}
"""A reservation's `ReservationType` (DescribeCapacityReservations) → its word in CreateFleet's `ReservationTypes`."""


def _preference(request: AwsRequest, spec: dict[str, Any] | None) -> tuple[str, str | None]:
    """(preference, targeted reservation) a launch asks: the request's, else its template's, else `open`."""
    stated = request.params.get("CapacityReservationSpecification")
    if stated is None and spec is not None:
        stated = launch_template_data(request, spec).get("CapacityReservationSpecification")
    stated = stated or {}
    target = (stated.get("CapacityReservationTarget") or {}).get("CapacityReservationId")
    if target:
        return "targeted", str(target)
    return str(stated.get("CapacityReservationPreference") or "open"), None


def _take(reservation: Reservation, instance_ids: list[str]) -> None:
    """These instances now run in the reservation: it holds that many fewer."""
    with _lock:
        reservation.available = max(0, reservation.available - len(instance_ids))
        _placed.update((instance_id, reservation) for instance_id in instance_ids)


@answer("ec2", "CreateFleet")
def _fleet(request: AwsRequest) -> Answer | None:
    target = request.params.get("TargetCapacitySpecification", {})
    if target.get("DefaultTargetCapacityType") == "reserved-capacity":
        return _reserved_fleet(request)
    if target.get("DefaultTargetCapacityType") == "spot" or not _mine(request):
        return None
    # On-Demand: instances that may run in open reservations do, and use them up.
    status, result = request.forward()
    if status < 300:
        for item in result.get("Instances", []):
            chosen = item.get("LaunchTemplateAndOverrides") or {}
            override = chosen.get("Overrides") or {}
            zone = item.get("AvailabilityZone") or override.get("AvailabilityZone") or zone_of_subnet(
                request, item.get("SubnetId") or override.get("SubnetId"))
            _consume_open(request, chosen.get("LaunchTemplateSpecification"), str(item.get("InstanceType", "")),
                          zone, list(item.get("InstanceIds", [])))
    return _reply(request, status, result)


@answer("ec2", "RunInstances")
def _run(request: AwsRequest) -> Answer | None:
    if not _mine(request) or (request.params.get("InstanceMarketOptions") or {}).get("MarketType") == "spot":
        return None
    specs = launch_template_specs(request)
    preference, reservation_id = _preference(request, specs[0] if specs else None)
    instance_type = str(request.params.get("InstanceType") or "")
    if not instance_type and specs:
        instance_type = str(launch_template_data(request, specs[0]).get("InstanceType", ""))
    zone = (request.params.get("Placement") or {}).get("AvailabilityZone") or zone_of_subnet(
        request, request.params.get("SubnetId"))
    count = int(request.params.get("MinCount") or 1)
    if preference == "targeted" and reservation_id:
        [reservation] = _find(request, [reservation_id])
        if not reservation.matches(instance_type, zone or reservation.zone):
            raise Refusal("InvalidParameterCombination", f"The instance type '{instance_type}' and Availability "
                          f"Zone do not match Capacity Reservation '{reservation_id}'.")
        if reservation.available < count:
            raise Refusal("ReservationCapacityExceeded",
                          "The targeted Capacity Reservation does not have enough available capacity.")
        status, result = request.forward()
        if status < 300:
            _take(reservation, [i["InstanceId"] for i in result.get("Instances", [])])
        return _reply(request, status, result)
    status, result = request.forward()
    if status < 300 and preference == "open" and zone:
        _consume_open(request, specs[0] if specs else None, instance_type, zone,
                      [i["InstanceId"] for i in result.get("Instances", [])], preference)
    return _reply(request, status, result)


def _consume_open(request: AwsRequest, spec: dict[str, Any] | None, instance_type: str, zone: str | None,
                  instance_ids: list[str], preference: str | None = None) -> None:
    if preference is None:
        preference, _ = _preference(request, spec)
    if preference != "open" or not zone:
        return
    for reservation in _mine(request):
        if instance_ids and reservation.match == "open" and reservation.kind == "default" and \
                reservation.matches(instance_type, zone) and reservation.available:
            used, instance_ids = instance_ids[:reservation.available], instance_ids[reservation.available:]
            _take(reservation, used)


def _reserved_fleet(request: AwsRequest) -> Answer:
    """A `reserved-capacity` instant fleet: the targeted reservations of each type `ReservationTypes` names, type by
    type in its order, each type's in override priority order ("an ordered list: EC2 Fleet attempts to launch
    instances into each Capacity Reservation type in the order that you specify them before moving on to the next
    type", EC2 API Reference, ReservedCapacityOptionsRequest). A targeted reservation of a type not named is not
    used. A request naming no type may use any (the reference gives no default)."""
    params = request.params
    options = params.get("ReservedCapacityOptions") or {}
    targets = _find(request, list((options.get("CapacityReservationTarget") or {}).get("CapacityReservationIds", [])))
    kinds = list(options.get("ReservationTypes") or _FLEET_TYPES.values())
    wanted = int(params.get("TargetCapacitySpecification", {}).get("TotalTargetCapacity") or 0)
    errors: list[dict[str, Any]] = []
    plan: list[tuple[dict[str, Any], dict[str, Any], Reservation, int]] = []
    ranked = sorted(((config, override) for config in params.get("LaunchTemplateConfigs", [])
                     for override in config.get("Overrides") or [{}]),
                    key=lambda pair: float(pair[1].get("Priority") or 0))
    placed: list[tuple[dict[str, Any], dict[str, Any], list[Reservation]]] = []
    for config, override in ranked:
        instance_type = str(override.get("InstanceType", ""))
        zone = override.get("AvailabilityZone") or zone_of_subnet(request, override.get("SubnetId")) or ""
        matching = [r for r in targets if r.matches(instance_type, zone)]
        if not matching:
            errors.append(_error(config, override, "InvalidParameterCombination",
                                 f"No targeted Capacity Reservation matches instance type '{instance_type}' in "
                                 f"'{zone}'."))
            continue
        placed.append((config, override, matching))
    left = wanted
    for kind in kinds:
        for config, override, matching in placed:
            for reservation in (r for r in matching if _FLEET_TYPES.get(r.kind) == kind):
                take = min(left, reservation.available - sum(n for *_, r, n in plan if r is reservation))
                if take > 0:
                    plan.append((config, override, reservation, take))
                    left -= take
    instances: list[dict[str, Any]] = []
    for config, override, reservation, count in plan:
        status, result = request.forward(_on_demand(params, config, override, count))
        if status >= 300:
            return _reply(request, status, result)
        _take(reservation, [i for item in result.get("Instances", []) for i in item.get("InstanceIds", [])])
        lifecycle = "capacity-block" if reservation.kind == "capacity-block" else "on-demand"
        instances.extend({**item, "Lifecycle": lifecycle} for item in result.get("Instances", []))
    if left and placed:
        config, override, matching = placed[0]
        errors.append(_error(config, override, *_shortfall(matching, kinds)))
    return Answer(result={"FleetId": f"fleet-{secrets.token_hex(16)[:8]}-{secrets.token_hex(2)}-"
                                     f"{secrets.token_hex(2)}-{secrets.token_hex(2)}-{secrets.token_hex(6)}",
                          "Instances": instances, "Errors": errors})


def _shortfall(matching: list[Reservation], kinds: list[str]) -> tuple[str, str]:
    """(code, message) for what an override's reservations could not hold: as the last of them tried says it. A
    Capacity Block: "you will receive an Insufficient Capacity Exception for the capacity that exceeds the limits of
    your Capacity Block reservation" (EC2 User Guide, "Tutorial: Configure your EC2 Fleet to launch instances into
    Capacity Blocks"), `InsufficientInstanceCapacity` ("There is not enough capacity to fulfill your request", EC2
    API Reference, "Error codes for the Amazon EC2 API"); an On-Demand Capacity Reservation, or none of a type the
    request names, `ReservationCapacityExceeded`."""
    tried = [r for kind in kinds for r in matching if _FLEET_TYPES.get(r.kind) == kind]
    if tried and tried[-1].kind == "capacity-block":
        return "InsufficientInstanceCapacity", "There is not enough capacity to fulfill your request."
    return "ReservationCapacityExceeded", "The targeted Capacity Reservation does not have enough available capacity."


def _on_demand(params: dict[str, Any], config: dict[str, Any], override: dict[str, Any], count: int) -> dict[str, Any]:
    """The On-Demand instant fleet moto is asked for: `count` instances of one reserved offering."""
    asked = {k: v for k, v in params.items() if k not in ("ReservedCapacityOptions", "OnDemandOptions", "SpotOptions")}
    asked["LaunchTemplateConfigs"] = [{**config, "Overrides": [override]}]
    asked["TargetCapacitySpecification"] = {"TotalTargetCapacity": count, "DefaultTargetCapacityType": "on-demand"}
    asked.pop("ClientToken", None)
    return asked


def _error(config: dict[str, Any], override: dict[str, Any], code: str, message: str) -> dict[str, Any]:
    return {"LaunchTemplateAndOverrides": {"LaunchTemplateSpecification": config.get("LaunchTemplateSpecification"),
                                           "Overrides": override},
            "Lifecycle": "on-demand", "ErrorCode": code, "ErrorMessage": message}


def _reply(request: AwsRequest, status: int, result: dict[str, Any]) -> Answer:
    """moto's answer as it was (parsed and rendered again)."""
    if status >= 300:
        error = result.get("Error", {})
        raise Refusal(str(error.get("Code", "InternalError")), str(error.get("Message", "")), status)
    result = {k: v for k, v in result.items() if k != "ResponseMetadata"}
    return Answer(result=result)

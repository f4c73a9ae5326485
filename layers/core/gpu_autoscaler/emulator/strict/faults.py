"""Injected faults: what AWS answers when it is having a bad day, switched on by a test (chaos suite).

Off unless a test enables a rule (`throttling`). While one is on, a share of the named actions is refused
before any other rule or moto sees it, in AWS's own words:

- EC2 request throttling. Source: Amazon EC2 API Reference, "Error codes for the Amazon EC2 API"
  (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html), RequestLimitExceeded:
  "The maximum request rate permitted by the Amazon EC2 APIs has been exceeded for your account." HTTP 503
  ("Request throttling for the Amazon EC2 API", https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html).

- Insufficient capacity. EC2 has no free capacity in some pools (instance type × Availability Zone × Spot or
  On-Demand): `capacity_storm()` yields a `CapacityStorm` a test scripts (`take("g6", "spot")`, `give_back()`).
  An instant CreateFleet does not fail for it: "EC2 Fleet places a synchronous one-time request for your desired
  capacity. In the API response, it returns the instances that launched, along with errors for those instances
  that could not be launched" (EC2 User Guide, "EC2 Fleet request types", ec2-fleet-request-type.html); each error
  is a `CreateFleetError` (EC2 API Reference, API_CreateFleetError.html: `ErrorCode`, `ErrorMessage`, `Lifecycle`
  spot | on-demand, `LaunchTemplateAndOverrides`), one per override it could not launch, with the code
  `InsufficientInstanceCapacity` ("There is not enough capacity to fulfill your request", a server error:
  "Error codes for the Amazon EC2 API"). The message is EC2's words as a Fleet reports them (quoted in
  aws/karpenter-provider-aws#1233): "We currently do not have sufficient <type> capacity in the Availability
  Zone you requested (<zone>). Our system will be working on provisioning additional capacity. You can currently
  get <type> capacity by not specifying an Availability Zone in your request or choosing <zones>." The rest of
  the request launches as it would have (the stand-ins after this one, else moto, are asked without the refused
  overrides). RunInstances, which names one pool, is refused as a whole with that code and HTTP 500. moto never
  runs out of capacity: its CreateFleet always launches and answers no `Errors`. Reserved capacity (Capacity
  Reservations, Capacity Blocks) is held for its owner and is not touched by a storm.

Draws are seeded, so a scenario replays; each rule counts what it saw and refused.
"""

from __future__ import annotations

import random
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.strict.core import Answer, AwsRequest, Refusal, answer, check, on_reset
from gpu_autoscaler.emulator.strict.ec2 import (
    instant_fleet_refusing,
    launch_template_data,
    launch_template_specs,
    spot_instances_requested,
    zone_of_subnet,
)
from gpu_autoscaler.emulator.strict.ec2_api_idempotency import create_fleet_once_per_token

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["INSUFFICIENT_CAPACITY", "THROTTLED_EC2_ACTIONS", "CapacityStorm", "Throttling", "capacity_storm",
           "throttling"]

THROTTLED_EC2_ACTIONS = (
    "CreateFleet", "TerminateInstances", "DescribeInstances", "CreateTags", "DescribeInstanceTypes",
    "DescribeInstanceTypeOfferings", "DescribeSpotPriceHistory", "DescribeSubnets", "DescribeSecurityGroups",
    "DescribeLaunchTemplates", "DescribeLaunchTemplateVersions", "DescribeImages",
)
"""The EC2 actions the functions and the emulator call (a throttled account throttles them all)."""


@dataclass
class Throttling:
    rate: float
    seed: int
    seen: int = 0
    refused: int = 0
    _rng: random.Random = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def draw(self) -> bool:
        with self._lock:
            self.seen += 1
            refuse = self._rng.random() < self.rate
            self.refused += refuse
            return refuse


_active: list[Throttling] = []


@contextmanager
def throttling(rate: float, seed: int = 0) -> Iterator[Throttling]:
    """Within the block, refuse `rate` of the EC2 requests above with RequestLimitExceeded."""
    if not 0 <= rate <= 1:
        raise ValueError(f"rate must be within [0, 1], got {rate}")
    rule = Throttling(rate, seed)
    _active.append(rule)
    try:
        yield rule
    finally:
        _active.remove(rule)


@check("ec2", *THROTTLED_EC2_ACTIONS)
def _throttled(request: AwsRequest) -> None:
    for rule in list(_active):
        if rule.draw():
            raise Refusal("RequestLimitExceeded", "Request limit exceeded.", status=503)


# ---- insufficient capacity ---------------------------------------------------------------------------------

INSUFFICIENT_CAPACITY = "InsufficientInstanceCapacity"
STORM_CAPACITY_TYPES = ("spot", "on-demand")


@dataclass
class CapacityStorm:
    """Capacity pools EC2 has nothing left in, switched on and off by a test while the storm is installed.

    `take(family, capacity_type)` empties the family's pools of that capacity type (in every zone, or the `share`
    of them drawn from the seed, the same pools for the same seed); `give_back` refills them."""

    seed: int = 0
    share: float = 1.0
    seen: int = 0
    """Launch requests (CreateFleet, RunInstances) for Spot or On-Demand capacity seen while installed."""
    refused: int = 0
    """Launches refused: CreateFleet overrides answered `InsufficientInstanceCapacity`, RunInstances refused."""
    refused_by: dict[tuple[str, str], int] = field(default_factory=dict)
    """(instance type, capacity type) → launches refused."""
    _out: set[tuple[str, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not 0 <= self.share <= 1:
            raise ValueError(f"share must be within [0, 1], got {self.share}")

    def take(self, family: str, capacity_type: str) -> None:
        """No `capacity_type` capacity for the instance family `family` (`g6`) from now on."""
        if capacity_type not in STORM_CAPACITY_TYPES:
            raise ValueError(f"capacity type must be one of {STORM_CAPACITY_TYPES}, got {capacity_type!r}")
        with self._lock:
            self._out.add((family, capacity_type))

    def give_back(self, family: str | None = None, capacity_type: str | None = None) -> None:
        """Capacity back for the family and capacity type named (None: every one)."""
        with self._lock:
            self._out = {(f, c) for f, c in self._out
                         if (family is not None and f != family) or (capacity_type is not None and c != capacity_type)}

    @property
    def raging(self) -> bool:
        with self._lock:
            return bool(self._out)

    def empty(self, instance_type: str, zone: str, capacity_type: str) -> bool:
        """Whether this pool has no capacity now."""
        with self._lock:
            if (instance_type.split(".", 1)[0], capacity_type) not in self._out:
                return False
        return self.share >= 1 or random.Random(f"{self.seed}/{instance_type}/{zone}/{capacity_type}").random() \
            < self.share

    def count(self, refused: list[tuple[str, str]]) -> None:
        with self._lock:
            self.seen += 1
            self.refused += len(refused)
            for key in refused:
                self.refused_by[key] = self.refused_by.get(key, 0) + 1


_storms: list[CapacityStorm] = []


@on_reset
def _calm() -> None:
    _storms.clear()


@contextmanager
def capacity_storm(seed: int = 0, share: float = 1.0) -> Iterator[CapacityStorm]:
    """Within the block, the storm's empty pools answer `InsufficientInstanceCapacity`; none is empty at first."""
    storm = CapacityStorm(seed=seed, share=share)
    _storms.append(storm)
    try:
        yield storm
    finally:
        _storms.remove(storm)


def _empty(instance_type: str, zone: str, capacity_type: str) -> bool:
    return any(storm.empty(instance_type, zone, capacity_type) for storm in list(_storms))


def _count(refused: list[tuple[str, str]]) -> None:
    for storm in list(_storms):
        storm.count(refused)


def _zones(request: AwsRequest) -> list[str]:
    return sorted(str(z.name) for z in request.moto_backend().describe_availability_zones())


def _no_capacity_message(request: AwsRequest, instance_type: str, zone: str, capacity_type: str) -> str:
    others = [z for z in _zones(request) if z != zone and not _empty(instance_type, z, capacity_type)]
    message = (f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you requested "
               f"({zone}). Our system will be working on provisioning additional capacity.")
    if others:
        message += (f" You can currently get {instance_type} capacity by not specifying an Availability Zone in "
                    f"your request or choosing {', '.join(others)}.")
    return message


@answer("ec2", "CreateFleet", behind=create_fleet_once_per_token)
def _instant_fleet_short_of_capacity(request: AwsRequest) -> Answer | None:
    capacity_type = request.params.get("TargetCapacitySpecification", {}).get("DefaultTargetCapacityType")
    if not _storms or request.params.get("Type") != "instant" or capacity_type not in STORM_CAPACITY_TYPES:
        return None
    refused: list[tuple[str, str]] = []

    def refuse(override: dict[str, Any], data: dict[str, Any]) -> Refusal | None:
        instance_type = str(override.get("InstanceType") or data.get("InstanceType") or "")
        zone = str(override.get("AvailabilityZone") or zone_of_subnet(request, override.get("SubnetId")) or "")
        if not (instance_type and zone and _empty(instance_type, zone, capacity_type)):
            return None
        refused.append((instance_type, capacity_type))
        return Refusal(INSUFFICIENT_CAPACITY, _no_capacity_message(request, instance_type, zone, capacity_type))

    answered = instant_fleet_refusing(_instant_fleet_short_of_capacity, request, refuse)
    _count(refused)
    return answered


@check("ec2", "RunInstances")
def _run_short_of_capacity(request: AwsRequest) -> None:
    if not _storms:
        return
    specs = launch_template_specs(request)
    data = launch_template_data(request, specs[0]) if specs else {}
    instance_type = str(request.params.get("InstanceType") or data.get("InstanceType") or "")
    capacity_type = "spot" if spot_instances_requested(request) else "on-demand"
    zone = (request.params.get("Placement") or {}).get("AvailabilityZone") or zone_of_subnet(
        request, request.params.get("SubnetId"))
    # Without a zone EC2 chooses one: refused only if every zone is empty.
    zones = [str(zone)] if zone else _zones(request)
    if instance_type and zones and all(_empty(instance_type, z, capacity_type) for z in zones):
        _count([(instance_type, capacity_type)])
        raise Refusal(INSUFFICIENT_CAPACITY, _no_capacity_message(request, instance_type, zones[0], capacity_type),
                      status=500)
    _count([])

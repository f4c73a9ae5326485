"""What one EC2 CreateFleet (type `instant`) call asks for, and what it gave back.

Plain data between the domain (`domain.fleet` builds requests and reads results) and `ports.Compute` (the
EC2 adapter renders a request into the API call, the simulator acts it out). Limits of the API are checked
here, so a request that EC2 would refuse cannot be built.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpu_autoscaler.config import BlockDeviceMapping, CapacityType

__all__ = [
    "CAPACITY_ERROR_CODES",
    "CONFLICT_ERROR_CODES",
    "MAX_LAUNCH_CONFIGS",
    "CONFIGURATION_ERROR_CODES",
    "MAX_OVERRIDES",
    "PARAM_VALIDATION_ERROR",
    "SPOT_ROLE_ERROR",
    "SUBNET_FULL_ERROR",
    "THROTTLING_ERROR_CODES",
    "AllocationStrategy",
    "ErrorKind",
    "FleetError",
    "FleetOverride",
    "FleetRequest",
    "FleetResult",
    "LaunchConfig",
    "LaunchedInstance",
    "OwnedInstance",
    "ReservationOptions",
    "ReservationType",
    "SERVER_ERROR_CODES",
    "classify_error",
]

MAX_OVERRIDES = 60
"""Offerings (instance type × subnet) one request may name: enough choice for EC2, a bounded request."""
MAX_LAUNCH_CONFIGS = 50
"""CreateFleet accepts at most 50 `LaunchTemplateConfigs`; we use one per distinct user data."""

AllocationStrategy = Literal["price-capacity-optimized", "lowest-price", "prioritized"]
ReservationType = Literal["on-demand-capacity-reservation", "capacity-block"]

SUBNET_FULL_ERROR = "InsufficientFreeAddressesInSubnet"
"""The subnet has no free address for the instance: no launch of any type or capacity type gets one there until
addresses free up. The configuration has one subnet per zone, so every offering of the zone is marked unavailable
for the usual TTL (one record, `domain.fleet.read_result`), as Karpenter marks the subnet unavailable."""
CAPACITY_ERROR_CODES = frozenset({
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "UnfulfillableCapacity",
    "MaxSpotInstanceCountExceeded",
    "VcpuLimitExceeded",
    "ReservationCapacityExceeded",
    SUBNET_FULL_ERROR,
    "SpotMaxPriceTooLow",
    "Unsupported",
    "MaxFleetCountExceeded",
    "InstanceLimitExceeded",
})
"""EC2 cannot give this offering now (no capacity, a quota — instances, vCPUs, fleets —, a full reservation or
subnet, not offered there): the offering is marked unavailable for a while and the claim goes on with what is
left. A request-level one (no instance type named) marks every offering the request asked; a full subnet
(`SUBNET_FULL_ERROR`) every offering of its zone."""
NOT_OFFERED_ERROR = "InvalidFleetConfiguration"
NOT_OFFERED_MESSAGE = "not supported in your requested availability zone"
"""How EC2 refuses an override of a type its zone does not offer (as Spot): "Your requested instance type (X) is not
supported in your requested Availability Zone (Y)" (aws/karpenter-provider-aws#2243, #6483). That override's offering
is missing, as with `Unsupported` (`FleetError.kind`); any other `InvalidFleetConfiguration` stays fatal."""
SPOT_ROLE_ERROR = "AuthFailure.ServiceLinkedRoleCreationNotPermitted"
"""The account may not launch Spot at all (EC2 User Guide, "Service-linked role for Spot Instance requests": the
first Spot launch creates `AWSServiceRoleForEC2Spot`, which needs `iam:CreateServiceLinkedRole`)."""
CONFIGURATION_ERROR_CODES = frozenset({SPOT_ROLE_ERROR})
"""The account is not set up for this capacity type. Every offering of it is marked unavailable for the usual TTL
(one record, `domain.fleet.read_result`): as Karpenter marks the Spot capacity type unavailable on this error, since
any other Spot type would be refused alike. The claim falls back to another capacity type where the pool allows,
and the error is logged as a configuration problem for an operator to fix."""
PARAM_VALIDATION_ERROR = "ParamValidationError"
"""botocore refused to send the request (a member its service model lacks: an SDK older than the code). Not EC2's
answer, and no retry or other capacity type helps: the claim ends with the SDK named."""
THROTTLING_ERROR_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
SERVER_ERROR_CODES = frozenset({"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"})
"""EC2 failed the call on its side: "InternalError — An internal error has occurred. Retry your request",
"Unavailable — The server is overloaded and can't handle the request" (EC2 API Reference, "Error codes for the
Amazon EC2 API", server errors). Transient, so retried as throttling is (the adapter treats any HTTP 5xx alike);
never a refusal: Karpenter requeues every create error but insufficient capacity (kubernetes-sigs/karpenter,
nodeclaim/lifecycle/launch.go)."""
CONFLICT_ERROR_CODES = frozenset({"IdempotentParameterMismatch"})
"""The client token was used before with other parameters: that attempt is spent, the next one has its own."""


class ErrorKind(StrEnum):
    UNAVAILABLE = "unavailable"
    """This offering cannot be had now: mark it unavailable, go on with the others."""
    THROTTLED = "throttled"
    """The API asked us to slow down, or failed on its side (`SERVER_ERROR_CODES`): back off with jitter and ask
    again."""
    CONFLICT = "conflict"
    """The attempt's token is spent: try again under the next attempt's token."""
    FATAL = "fatal"
    """Anything else (invalid parameter, permissions, launch template): retrying will not help. When EC2 names
    the instance type it is about, only that type is dropped from the launch (`domain.fleet.read_result`)."""


def classify_error(code: str) -> ErrorKind:
    if code in CAPACITY_ERROR_CODES or code in CONFIGURATION_ERROR_CODES:
        return ErrorKind.UNAVAILABLE
    if code in THROTTLING_ERROR_CODES or code in SERVER_ERROR_CODES:
        return ErrorKind.THROTTLED
    if code in CONFLICT_ERROR_CODES:
        return ErrorKind.CONFLICT
    return ErrorKind.FATAL


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FleetOverride(_Frozen):
    """One offering the fleet may launch: an instance type in one subnet (so one zone)."""

    instance_type: str
    zone: str
    subnet_id: str
    priority: float | None = Field(default=None, ge=0)
    """Rank, 0 first: used by the `prioritized` strategies (reserved capacity); ignored by the others."""
    max_price: float | None = Field(default=None, gt=0)
    """USD/h cap for Spot; None pays the current Spot price (AWS advises against a cap)."""
    image_id: str | None = None
    """The AMI when it differs from the launch template's (the arm64 image for Graviton types)."""
    placement_group: str | None = None
    """A cluster placement group to launch into (an EFA gang's, in this override's zone)."""


class LaunchConfig(_Frozen):
    """Overrides that share one user data (one `LaunchTemplateConfigs` entry)."""

    user_data: str = ""
    """Raw (not base64) user data; the adapter encodes it. ≤ 16 KB raw, EC2's limit."""
    launch_template_id: str | None = None
    """This entry's template when it differs from the request's (an EFA template)."""
    launch_template_version: str | None = None
    """The version of `launch_template_id` to launch (with it, and only with it)."""
    overrides: tuple[FleetOverride, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _user_data_size(self) -> LaunchConfig:
        if len(self.user_data.encode()) > 16 * 1024:
            raise ValueError("user data exceeds EC2's 16 KB")
        if (self.launch_template_id is None) != (self.launch_template_version is None):
            raise ValueError("an entry's own launch template comes with its version")
        return self


class ReservationOptions(_Frozen):
    """Reserved capacity: launch only into these reservations, On-Demand Capacity Reservations first."""

    reservation_ids: tuple[str, ...] = Field(min_length=1)
    reservation_types: tuple[ReservationType, ...] = Field(min_length=1)
    """In the order EC2 should try them."""
    placements: tuple[tuple[str, str, str], ...] = ()
    """(instance type, zone, reservation id) of the reservations named, where known: what EC2's error about an
    override (a type in a zone) is about, so the record it leaves names the reservation (`domain.fleet`), and which
    reservation an instance of that type and zone runs in."""
    fallback_on_demand: bool = False
    """Let EC2 fill what the reservations cannot with On-Demand in the same call. Off by default: the
    service falls back itself, so the claim records what it really got and why."""

    def named_at(self, instance_type: str, zone: str) -> tuple[str, ...]:
        """The reservations named that hold this type in this zone (as far as `placements` knows)."""
        return tuple(dict.fromkeys(r for t, z, r in self.placements if (t, z) == (instance_type, zone)))


class FleetRequest(_Frozen):
    cluster: str
    pool: str
    claim_ids: tuple[str, ...] = Field(min_length=1)
    """The claims this request launches, one instance each; the k-th instance launched is the k-th claim's."""
    gang: str | None = None
    attempt: int = Field(default=0, ge=0)
    capacity_type: CapacityType
    allocation_strategy: AllocationStrategy
    target_capacity: int = Field(ge=1)
    min_target_capacity: int | None = Field(default=None, ge=1)
    """All or nothing: fewer than this and EC2 launches none (needs single zone or single type)."""
    single_availability_zone: bool = False
    single_instance_type: bool = False
    launch_template_id: str
    launch_template_version: str = "$Default"
    """A version number (`LaunchContext.template_versions`), so the same request replays the same launch."""
    launch_configs: tuple[LaunchConfig, ...] = Field(min_length=1, max_length=MAX_LAUNCH_CONFIGS)
    client_token: str = Field(min_length=1, max_length=64, pattern=r"^[\x21-\x7e]+$")
    tags: dict[str, str] = Field(default_factory=dict)
    """On every instance and volume the request launches (the launch template adds the ownership tag too)."""
    reservation: ReservationOptions | None = None
    block_device_mappings: tuple[BlockDeviceMapping, ...] = ()
    """The pool's volumes, on every override (what the pool sets is what the instance gets); empty: the
    launch template's."""

    @model_validator(mode="after")
    def _consistent(self) -> FleetRequest:
        if len(self.overrides) > MAX_OVERRIDES:
            raise ValueError(f"{len(self.overrides)} overrides; at most {MAX_OVERRIDES}")
        if self.target_capacity != len(self.claim_ids):
            raise ValueError("target capacity must be one instance per claim")
        if self.min_target_capacity is not None:
            if self.min_target_capacity > self.target_capacity:
                raise ValueError("min target capacity exceeds the target")
            if not (self.single_availability_zone or self.single_instance_type):
                raise ValueError("min target capacity needs single availability zone or single instance type")
        if (self.capacity_type == "reserved") != (self.reservation is not None):
            raise ValueError("reservation options go with capacity type 'reserved', and only with it")
        return self

    @property
    def overrides(self) -> tuple[FleetOverride, ...]:
        return tuple(o for config in self.launch_configs for o in config.overrides)

    @property
    def offerings(self) -> tuple[tuple[str, str, str], ...]:
        """(instance type, zone, capacity type) of every override, as `StateStore` keys offerings."""
        return tuple((o.instance_type, o.zone, self.capacity_type) for o in self.overrides)

    def zone_of_subnet(self, subnet_id: str) -> str | None:
        return next((o.zone for o in self.overrides if o.subnet_id == subnet_id), None)


class LaunchedInstance(_Frozen):
    instance_id: str
    instance_type: str
    zone: str
    capacity_type: CapacityType
    """What it was bought as: a reserved request's instances are `reserved` (in the reservation)."""
    subnet_id: str | None = None
    lifecycle: str = ""
    """EC2's own word (`spot`, `on-demand`, `capacity-block`, …)."""
    claim_id: str | None = None
    """The claim it was launched for, when the request named several."""
    reservation_id: str | None = None
    """The reservation it runs in: EC2's `CapacityReservationId` where the adapter read it, else the request's only
    reservation of its type and zone (`domain.fleet.read_result`); None for an instance in none."""


class FleetError(_Frozen):
    """One error of the call: for one override (type and zone known) or for the whole request."""

    code: str
    message: str = ""
    instance_type: str | None = None
    zone: str | None = None
    capacity_type: CapacityType | None = None

    @property
    def kind(self) -> ErrorKind:
        if self.code == NOT_OFFERED_ERROR and self.offering and NOT_OFFERED_MESSAGE in self.message.lower():
            return ErrorKind.UNAVAILABLE
        return classify_error(self.code)

    @property
    def refusal(self) -> bool:
        """EC2 refused for a reason no other offering, later retry or capacity mends, so an operator must act: a
        fatal error (a permission, a parameter, the launch template) or the account's configuration (the Spot
        service-linked role). Capacity and quotas (`CAPACITY_ERROR_CODES`) are Spot's normal weather; throttling
        and a spent token are retried."""
        return self.kind is ErrorKind.FATAL or self.code in CONFIGURATION_ERROR_CODES

    @property
    def offering(self) -> tuple[str, str, str] | None:
        if self.instance_type and self.zone and self.capacity_type:
            return (self.instance_type, self.zone, self.capacity_type)
        return None


class FleetResult(_Frozen):
    fleet_id: str | None = None
    instances: tuple[LaunchedInstance, ...] = ()
    errors: tuple[FleetError, ...] = ()

    @property
    def error_kinds(self) -> set[ErrorKind]:
        return {e.kind for e in self.errors}


class OwnedInstance(_Frozen):
    """An instance carrying this cluster's ownership tag, as DescribeInstances shows it (garbage collection and
    Capacity Block ends look at these)."""

    instance_id: str
    state: str
    """EC2's state name: pending, running, stopping, stopped, shutting-down, terminated."""
    launched_at: datetime | None = None
    claim_id: str | None = None
    """Its `gpu-autoscaler/claim` tag."""
    launch_token: str | None = None
    """Its `gpu-autoscaler/launch` tag: the ClientToken of the request for several claims it was launched by."""
    capacity_reservation_id: str | None = None
    """The reservation (On-Demand Capacity Reservation or Capacity Block) it runs in, if any."""

    @property
    def gone(self) -> bool:
        """It is ending or ended: nothing to terminate."""
        return self.state in ("shutting-down", "terminated")

    @property
    def serving(self) -> bool:
        """It can run its claim's pods. A stopping or stopped one cannot: its kubelet is down, its Node NotReady
        and tainted `node.cloudprovider.kubernetes.io/shutdown` (k8s.io/cloud-provider node lifecycle
        controller); the interruption function closes its claim on that state change, as Karpenter's
        interruption controller deletes the NodeClaim of a stopping or stopped instance."""
        return self.state in ("pending", "running")

    @property
    def terminated(self) -> bool:
        """It no longer exists: its Node may go. A `shutting-down` instance may still be running its containers'
        graceful shutdown (cloud-provider-aws: only `terminated` does not exist; Karpenter's instance provider
        counts `shutting-down` as existing)."""
        return self.state == "terminated"

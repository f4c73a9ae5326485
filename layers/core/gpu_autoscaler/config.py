"""The one configuration model: the `gpu-autoscaler` context key of cdk.json.

`cdk synth`, every command and every Lambda read it through `load_config`/`parse_config`, so an
invalid configuration fails the same way everywhere: one message naming the field and the reason.
"""

from __future__ import annotations

import ipaddress
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpu_autoscaler.models.durations import Duration
from gpu_autoscaler.models.requirements import Requirement
from gpu_autoscaler.models.resources import parse_quantity
from gpu_autoscaler.models.taints import Taint

__all__ = [
    "CONTEXT_KEY",
    "Ami",
    "Budget",
    "CapacityReservation",
    "CapacityType",
    "Config",
    "ConfigError",
    "Disruption",
    "GpuSharing",
    "NodePool",
    "Overhead",
    "PoolLimits",
    "Predictive",
    "ScalingWindow",
    "WarmCapacity",
    "load_config",
    "parse_config",
]

CONTEXT_KEY = "gpu-autoscaler"

CapacityType = Literal["reserved", "spot", "on-demand"]
CAPACITY_ORDER: tuple[CapacityType, ...] = ("reserved", "spot", "on-demand")


class _Model(BaseModel):
    """camelCase on the wire (cdk.json), snake_case in Python; unknown keys are an error."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class ConfigError(ValueError):
    """The configuration is invalid; `str()` names each field and its reason on one line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid gpu-autoscaler configuration: " + "; ".join(problems))


class KubernetesAccess(_Model):
    endpoint: str = Field(pattern=r"^https?://")
    certificate_authority: str | None = None
    """Base64 CA bundle; when absent, the Lambdas read it from EKS DescribeCluster."""
    service_cidr: str | None = None
    """The cluster's service IPv4 CIDR (DescribeCluster `kubernetesNetworkConfig.serviceIpv4Cidr`): the node
    bootstrap derives the cluster DNS address from it (nodeadm `cidr`, Bottlerocket `cluster-dns-ip`)."""

    @field_validator("service_cidr")
    @classmethod
    def _cidr(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.ip_network(value)
            except ValueError:
                raise ValueError(f"'{value}' is not a CIDR such as '10.100.0.0/16'") from None
        return value


class Network(_Model):
    subnets: dict[str, str] = Field(min_length=1)
    """Availability zone → subnet id: one subnet per zone we may launch in."""
    security_groups: list[str] = Field(min_length=1)

    @field_validator("subnets")
    @classmethod
    def _subnet_ids(cls, subnets: dict[str, str]) -> dict[str, str]:
        for zone, subnet in subnets.items():
            if not subnet.startswith("subnet-"):
                raise ValueError(f"'{subnet}' for zone {zone} is not a subnet id")
        return subnets


class Ami(_Model):
    family: Literal["AL2023", "Bottlerocket"]
    version: str
    x86_64: str = Field(pattern=r"^ami-[0-9a-f]+$")
    arm64: str | None = Field(default=None, pattern=r"^ami-[0-9a-f]+$")


class CapacityReservation(_Model):
    id: str = Field(pattern=r"^cr-[0-9a-f]+$")
    type: Literal["default", "capacity-block"] = "default"
    """`capacity-block` for EC2 Capacity Blocks for ML, which launch with market type capacity-block."""
    instance_type: str | None = None
    availability_zone: str | None = None
    instance_count: int | None = Field(default=None, ge=0)
    """Optional: what the reservation holds, used only where DescribeCapacityReservations cannot be called
    (the emulator); on AWS the API's answer wins."""


class PoolLimits(_Model):
    gpus: int | None = Field(default=None, ge=0)
    price_per_hour: float | None = Field(default=None, ge=0)


class GpuSharing(_Model):
    mode: Literal["none", "time-slicing", "mig"] = "none"
    replicas: int = Field(default=1, ge=1, le=64)
    """time-slicing: how many pods share one physical GPU."""
    mig_profile: str | None = None
    """mig: the profile each GPU is partitioned into (single strategy), e.g. `1g.10gb`."""

    @model_validator(mode="after")
    def _mode_fields(self) -> GpuSharing:
        if self.mode != "time-slicing" and self.replicas != 1:
            raise ValueError("replicas only applies to mode 'time-slicing'")
        if self.mode == "mig" and not self.mig_profile:
            raise ValueError("mode 'mig' needs migProfile, e.g. '1g.10gb'")
        return self


DisruptionReason = Literal["Empty", "Underutilized", "Drifted"]


class Budget(_Model):
    nodes: str = Field(pattern=r"^\d+%?$")
    """A count (`3`) or a share of the pool's nodes (`10%`)."""
    schedule: str | None = None
    """Karpenter's five-field cron (`0 9 * * mon-fri`, UTC) or a macro (`@daily`), or `cron(...)` as windows use."""
    duration: Duration | None = None
    reasons: list[DisruptionReason] | None = None
    """The budget bounds only these reasons; absent, every reason."""

    @model_validator(mode="after")
    def _schedule_with_duration(self) -> Budget:
        if (self.schedule is None) != (self.duration is None):
            raise ValueError("schedule and duration go together")
        if self.schedule is not None:
            from gpu_autoscaler.domain.budgets import parse_budget_schedule
            from gpu_autoscaler.domain.windows import CronError

            try:
                parse_budget_schedule(self.schedule)
            except CronError as error:
                raise ValueError(str(error)) from None
        return self


class Disruption(_Model):
    consolidation_policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized"] = "WhenEmptyOrUnderutilized"
    """Karpenter's: remove only empty nodes, or also nodes whose pods fit elsewhere or on a cheaper node."""
    consolidate_after: Duration = timedelta(minutes=5)
    """How long a node must have been empty before it is removed (and old, before it is consolidated)."""
    min_node_age: Duration = timedelta(minutes=10)
    """No voluntary disruption of a node younger than this: its pods may still be on their way to it."""
    spot_to_spot: bool = False
    budgets: list[Budget] = Field(default_factory=lambda: [Budget(nodes="10%")])
    rebalance: Literal["ignore", "replace"] = "replace"
    """On a rebalance recommendation: ignore it, or launch a replacement and then drain."""
    rebalance_drain_after: Duration = timedelta(minutes=10)
    """Drain a rebalanced node once its replacement is Ready, or after this long at most."""


class Overhead(_Model):
    """Resources each node spends before pods: daemonsets and kube-reserved, as quantity strings."""

    daemonsets: dict[str, str] = Field(default_factory=lambda: {"cpu": "200m", "memory": "256Mi"})
    kube_reserved: dict[str, str] = Field(default_factory=lambda: {"cpu": "100m", "memory": "1Gi"})


class NodePool(_Model):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    weight: int = Field(default=0, ge=0, le=100)
    capacity_types: list[CapacityType] = Field(default_factory=lambda: list[CapacityType](["on-demand"]),
                                              min_length=1)
    requirements: list[Requirement] = Field(default_factory=list)
    capacity_reservations: list[CapacityReservation] = Field(default_factory=list)
    limits: PoolLimits = Field(default_factory=PoolLimits)
    taints: list[Taint] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    gpu_sharing: GpuSharing = Field(default_factory=GpuSharing)
    disruption: Disruption = Field(default_factory=Disruption)
    efa: bool = False
    """Gangs in this pool need EFA: one instance type per gang, EFA-capable types only."""
    lead_time: Duration = timedelta(minutes=8)
    """Node boot plus image pull: how early warm capacity must be asked for."""
    ephemeral_storage: str = "100Gi"
    """Root volume size of the pool's nodes: their `ephemeral-storage` capacity, as a quantity."""
    termination_grace_period: Duration | None = None
    """Karpenter's NodePool `spec.template.spec.terminationGracePeriod`: how long a voluntary drain (consolidation,
    drift, rebalance) of one of the pool's nodes may be held by PodDisruptionBudgets and do-not-disrupt pods,
    counted from its cordon; then the pods are deleted (each early enough to get its own grace period) and the
    node goes. Unset: a voluntary drain waits for them however long it takes."""

    @field_validator("ephemeral_storage")
    @classmethod
    def _storage_quantity(cls, value: str) -> str:
        if parse_quantity(value) <= 0:
            raise ValueError(f"'{value}' must be a positive quantity such as '100Gi'")
        return value

    @model_validator(mode="after")
    def _reserved_needs_reservations(self) -> NodePool:
        if "reserved" in self.capacity_types and not self.capacity_reservations:
            raise ValueError("capacityTypes has 'reserved' but capacityReservations is empty")
        return self


class WarmCapacity(_Model):
    gpus: int | None = Field(default=None, ge=1)
    instance_types: dict[str, int] | None = None
    """Instance type → count, when a window wants specific nodes rather than a GPU total."""

    @model_validator(mode="after")
    def _one_of(self) -> WarmCapacity:
        if (self.gpus is None) == (self.instance_types is None):
            raise ValueError("give exactly one of gpus or instanceTypes")
        return self


_CRON = re.compile(r"^cron\((\S+ ){5}\S+\)$")


class ScalingWindow(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    schedule: str
    """EventBridge Scheduler cron expression, `cron(min hour day-of-month month day-of-week year)`."""
    timezone: str = "UTC"
    duration: Duration
    node_pool: str
    warm: WarmCapacity

    @field_validator("schedule")
    @classmethod
    def _cron(cls, schedule: str) -> str:
        if not _CRON.match(schedule):
            raise ValueError(f"'{schedule}' is not an EventBridge cron expression like 'cron(0 9 ? * MON-FRI *)'")
        return schedule

    @field_validator("timezone")
    @classmethod
    def _iana(cls, timezone: str) -> str:
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"'{timezone}' is not an IANA time zone") from None
        return timezone


class Predictive(_Model):
    enabled: bool = False
    lead_time: Duration = timedelta(minutes=8)
    history: Duration = timedelta(days=14)
    quantile: float = Field(default=0.9, gt=0, lt=1)
    max_warm_gpus: int = Field(default=0, ge=0)
    max_warm_price_per_hour: float | None = Field(default=None, ge=0)


class Timeouts(_Model):
    unavailable_offering_ttl: Duration = timedelta(minutes=3)
    registration_ttl: Duration = timedelta(minutes=15)
    pod_assignment_ttl: Duration = timedelta(minutes=30)
    scheduling_grace: Duration = timedelta(minutes=2)
    """How long after its node registered a claim still covers the pods it was made for: a pod still pending
    after that lost its room to other pods the scheduler put there, and is planned again."""
    interruption_drain: Duration = timedelta(minutes=30)
    """A rebalance drain's deadline after `rebalanceDrainAfter`: a drain not started by then (its replacement
    never initialized) leaves the node. Budgets are never overridden by it (see `terminationGracePeriod`)."""
    consolidation_validation: Duration = timedelta(seconds=15)
    """How long a consolidation decision must still hold before it is carried out (Karpenter's 15 s); it is
    looked at again by the first consolidate tick this long after the one that took it."""
    consolidation_drain: Duration = timedelta(minutes=30)
    """Deadline of a consolidation's (voluntary) drain: a drain whose replacements are not initialized by then
    leaves the node. Budgets are never overridden by it (see the pool's `terminationGracePeriod`)."""


class Config(_Model):
    cluster_name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    kubernetes: KubernetesAccess
    network: Network
    node_role: str = Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
    ami: Ami
    node_pools: list[NodePool] = Field(min_length=1)
    scaling_windows: list[ScalingWindow] = Field(default_factory=list)
    predictive: Predictive = Field(default_factory=Predictive)
    overhead: Overhead = Field(default_factory=Overhead)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    vcpu_quotas: dict[str, int] = Field(default_factory=dict)
    """Quota overrides where Service Quotas cannot be read: `<family>/<capacity type>` → vCPUs."""
    prefix_delegation: bool = False
    """VPC CNI prefix delegation on: max pods from /28 prefixes rather than single IPs."""

    @model_validator(mode="after")
    def _cross_references(self) -> Config:
        names = [p.name for p in self.node_pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"node pool names must be unique; repeated: {', '.join(duplicates)}")
        for window in self.scaling_windows:
            if window.node_pool not in names:
                raise ValueError(f"scaling window '{window.name}' names unknown node pool '{window.node_pool}'")
        return self

    def pool(self, name: str) -> NodePool:
        for pool in self.node_pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no node pool named '{name}'")

    @property
    def zones(self) -> list[str]:
        return sorted(self.network.subnets)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


def parse_config(data: Any) -> Config:
    """Validate a configuration object, raising `ConfigError` with every problem named."""
    if not isinstance(data, dict):
        raise ConfigError([f"the configuration must be a JSON object, got {type(data).__name__}"])
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_describe(error) for error in exc.errors()]) from None


def _describe(error: Any) -> str:
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    message = error["msg"].removeprefix("Value error, ")
    return f"{path}: {message}" if path else message


def load_config(path: Path | str | None = None) -> Config:
    """Read a JSON file holding the configuration object, or `cdk.json` holding it under its context key."""
    file = Path(path) if path else Path("cdk.json")
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError([f"{file}: no such file (give --config FILE, or run where cdk.json is)"]) from None
    except json.JSONDecodeError as exc:
        raise ConfigError([f"{file}: not valid JSON ({exc})"]) from None
    if isinstance(data, dict) and "context" in data and CONTEXT_KEY in data.get("context", {}):
        data = data["context"][CONTEXT_KEY]
    elif file.name == "cdk.json":
        raise ConfigError([f"{file}: no context key '{CONTEXT_KEY}'"])
    return parse_config(data)

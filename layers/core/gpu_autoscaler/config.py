"""The one configuration model: the `gpu-autoscaler` context key of cdk.json.

`cdk synth`, every command and every Lambda read it through `load_config`/`parse_config`, so an
invalid configuration fails the same way everywhere: one message naming the field and the reason.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpu_autoscaler.models.durations import Duration
from gpu_autoscaler.models.images import parse_image_reference
from gpu_autoscaler.models.labels import (
    CLAIM_LABEL,
    NODE_LABEL_KEYS,
    WELL_KNOWN,
    kubelet_may_set,
    label_key_problem,
    label_value_problem,
)
from gpu_autoscaler.models.requirements import Requirement
from gpu_autoscaler.models.resources import parse_quantity
from gpu_autoscaler.models.taints import Taint

__all__ = [
    "CONTEXT_KEY",
    "Ami",
    "BlockDeviceMapping",
    "Budget",
    "CapacityReservation",
    "CapacityType",
    "Config",
    "ConfigError",
    "Disruption",
    "EbsVolume",
    "FunctionNetwork",
    "GpuSharing",
    "MeasuredLeadTime",
    "NodePool",
    "Overhead",
    "PoolLimits",
    "Predictive",
    "ScalingWindow",
    "WarmCapacity",
    "config_digest",
    "load_config",
    "parse_config",
]

CONTEXT_KEY = "gpu-autoscaler"

logger = logging.getLogger(__name__)

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
    eks_access: bool = True
    """Whether the stack grants access through the EKS API: an access entry for each function that calls the
    Kubernetes API (`infra.access_entries`), and the agent's EKS Pod Identity association (`infra.agent`). Access
    entries need the cluster's authentication mode `API` or `API_AND_CONFIG_MAP` (EKS User Guide,
    grant-k8s-access.adoc); false for a cluster still on `CONFIG_MAP`, or a self-managed one, whose owner maps the
    roles in aws-auth and associates the agent's role (or uses IRSA) instead (README, Deploy)."""

    @field_validator("endpoint")
    @classmethod
    def _https_unless_loopback(cls, endpoint: str) -> str:
        """The functions send their EKS bearer token on every request, a presigned sts:GetCallerIdentity anyone who
        reads it may replay for 15 minutes (aws-iam-authenticator pkg/token/token.go): plain HTTP only to an API
        server on this machine, the emulator's (which serves http://127.0.0.1)."""
        if endpoint.startswith("http://") and not _loopback(urlsplit(endpoint).hostname or ""):
            raise ValueError(f"'{endpoint}': plain http:// would send the cluster token in clear; use https:// "
                             f"(http:// is for a local API server: localhost, 127.0.0.1, ::1)")
        return endpoint

    @field_validator("service_cidr")
    @classmethod
    def _cidr(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.ip_network(value)
            except ValueError:
                raise ValueError(f"'{value}' is not a CIDR such as '10.100.0.0/16'") from None
        return value


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _aws_id(prefix: str, kind: str) -> AfterValidator:
    def check(value: str) -> str:
        if not re.fullmatch(rf"{prefix}-[0-9a-f]+", value):
            raise ValueError(f"'{value}' is not a {kind} id ({prefix}-…)")
        return value
    return AfterValidator(check)


class FunctionNetwork(_Model):
    """Where the functions that call the Kubernetes API run: in the cluster's VPC, so a cluster whose API endpoint
    is private only (Security Hub EKS.1, Control Tower CT.EKS.PR.1) is reachable. The subnets are private ones with
    a route to AWS's APIs, by NAT or VPC endpoints (README, Deploy, "A private API endpoint"); the security groups
    must be admitted by the cluster's on 443. At most 16 subnets and 5 groups: Lambda's `VpcConfig` limits."""

    vpc_id: Annotated[str, _aws_id("vpc", "VPC")]
    subnets: list[Annotated[str, _aws_id("subnet", "subnet")]] = Field(min_length=1, max_length=16)
    security_groups: list[Annotated[str, _aws_id("sg", "security group")]] = Field(min_length=1, max_length=5)


class Network(_Model):
    subnets: dict[str, str] = Field(min_length=1)
    """Availability zone → subnet id: one subnet per zone we may launch in."""
    security_groups: list[str] = Field(min_length=1)
    functions: FunctionNetwork | None = None
    """The VPC placement of packer, interruption, drain and consolidate; absent, every function runs outside any
    VPC and reaches the cluster over its public endpoint."""

    @field_validator("subnets")
    @classmethod
    def _subnet_ids(cls, subnets: dict[str, str]) -> dict[str, str]:
        for zone, subnet in subnets.items():
            if not subnet.startswith("subnet-"):
                raise ValueError(f"'{subnet}' for zone {zone} is not a subnet id")
        return subnets


_PINNED_AMI = r"^ami-[0-9a-f]+$"
_SSM_AMI = r"^resolve:ssm:/\S+$"
LATEST = "latest"


class Ami(_Model):
    """The node image, pinned by id. A new AMI drifts every node of the fleet, so following the latest
    release is an explicit choice: `version: "latest"` with EC2's `resolve:ssm:<parameter>` image ids
    (the public AMI parameters EKS and Bottlerocket publish), resolved by EC2 at each launch."""

    family: Literal["AL2023", "Bottlerocket"]
    version: str = Field(min_length=1)
    x86_64: str = Field(pattern=f"{_PINNED_AMI}|{_SSM_AMI}")
    arm64: str | None = Field(default=None, pattern=f"{_PINNED_AMI}|{_SSM_AMI}")

    def images(self) -> dict[str, str]:
        """Architecture (`x86_64`, `arm64`) → image id: what a node of each architecture boots. The fleet launches
        from it and drift compares with it, one reading for both."""
        return {"x86_64": self.x86_64, **({"arm64": self.arm64} if self.arm64 else {})}

    @model_validator(mode="after")
    def _pinned_unless_latest(self) -> Ami:
        ids = [i for i in (self.x86_64, self.arm64) if i]
        follows = [i for i in ids if i.startswith("resolve:ssm:")]
        if follows and self.version != LATEST:
            raise ValueError(f"'{follows[0]}' follows the latest AMI: say so with version '{LATEST}' "
                             "(or pin an ami- id)")
        if self.version == LATEST and len(follows) != len(ids):
            raise ValueError(f"version '{LATEST}' needs resolve:ssm:<parameter> image ids; pinned ami- ids "
                             "take the AMI's release version")
        return self


VolumeType = Literal["gp2", "gp3", "io1", "io2", "st1", "sc1", "standard"]
GIB = 1024**3
_VOLUME_SIZES_GIB: dict[str, tuple[int, int]] = {
    "gp2": (1, 16384), "gp3": (1, 16384), "io1": (4, 16384), "io2": (4, 65536),
    "st1": (125, 16384), "sc1": (125, 16384), "standard": (1, 1024),
}
"""EC2 API Reference, LaunchTemplateEbsBlockDeviceRequest `VolumeSize`: supported sizes per volume type."""
_IOPS: dict[str, tuple[int, int]] = {"gp3": (3000, 16000), "io1": (100, 64000), "io2": (100, 256000)}
"""Same page, `Iops`: only gp3, io1 and io2 take it; io1 and io2 require it."""
_THROUGHPUT_MIBS = (125, 1000)
"""Same page, `Throughput`: gp3 only."""


class EbsVolume(_Model):
    """Karpenter's EC2NodeClass `blockDeviceMappings[].ebs`, checked against EC2's documented limits."""

    volume_size: str | int | None = None
    """A quantity (`200Gi`) or GiB; may be left out with `snapshotId` (the snapshot's size)."""
    volume_type: VolumeType = "gp3"
    iops: int | None = Field(default=None, ge=1)
    throughput: int | None = Field(default=None, ge=1)
    """MiB/s."""
    encrypted: bool = True
    delete_on_termination: bool = True
    snapshot_id: str | None = Field(default=None, pattern=r"^snap-[0-9a-f]+$")
    """A snapshot to restore: a data volume pre-seeded with container images starts nodes without pulls."""

    @property
    def size_gib(self) -> int | None:
        if self.volume_size is None:
            return None
        if isinstance(self.volume_size, int):
            return self.volume_size
        return -(-int(parse_quantity(self.volume_size)) // GIB)

    @model_validator(mode="after")
    def _ec2_limits(self) -> EbsVolume:
        kind = self.volume_type
        size = self.size_gib
        if size is None and self.snapshot_id is None:
            raise ValueError("give volumeSize, snapshotId or both")
        if size is not None:
            low, high = _VOLUME_SIZES_GIB[kind]
            if not low <= size <= high:
                raise ValueError(f"volumeSize {size} GiB is outside {low}-{high} GiB, what {kind} allows")
        if self.iops is not None:
            if kind not in _IOPS:
                raise ValueError(f"iops applies to gp3, io1 and io2 volumes, not {kind}")
            low, high = _IOPS[kind]
            if not low <= self.iops <= high:
                raise ValueError(f"iops {self.iops} is outside {low}-{high}, what {kind} allows")
        elif kind in ("io1", "io2"):
            raise ValueError(f"{kind} volumes need iops")
        if self.throughput is not None:
            if kind != "gp3":
                raise ValueError(f"throughput applies to gp3 volumes only, not {kind}")
            if not _THROUGHPUT_MIBS[0] <= self.throughput <= _THROUGHPUT_MIBS[1]:
                raise ValueError(f"throughput {self.throughput} MiB/s is outside 125-1000, what gp3 allows")
        return self


class BlockDeviceMapping(_Model):
    """Karpenter's EC2NodeClass `blockDeviceMappings[]`: one EBS volume of the node."""

    device_name: str = Field(pattern=r"^/dev/(sd[a-z]{1,2}|xvd[a-z]{1,2}|nvme\d+n\d+)$")
    ebs: EbsVolume


class CapacityReservation(_Model):
    id: str = Field(pattern=r"^cr-[0-9a-f]+$")
    type: Literal["default", "capacity-block"] = "default"
    """`capacity-block` for EC2 Capacity Blocks for ML. Like `instanceType` and `availabilityZone`, used only where
    DescribeCapacityReservations cannot be called: elsewhere the API's `ReservationType` wins (`domain.fleet`)."""
    instance_type: str | None = None
    availability_zone: str | None = None
    instance_count: int | None = Field(default=None, ge=0)
    """Optional: what the reservation holds, used only where DescribeCapacityReservations cannot be called
    (the emulator); on AWS the API's answer wins."""


class PoolLimits(_Model):
    gpus: int | None = Field(default=None, ge=0)
    price_per_hour: float | None = Field(default=None, ge=0)

    @property
    def bounded(self) -> bool:
        return self.gpus is not None or self.price_per_hour is not None


class GpuSharing(_Model):
    mode: Literal["none", "time-slicing", "mig"] = "none"
    replicas: int = Field(default=1, ge=1, le=64)
    """time-slicing: how many pods share one physical GPU, at least 2 (the NVIDIA device plugin refuses a
    time-slicing config of fewer, k8s-device-plugin api/config/v1/replicas.go, and its node advertises no GPUs), and
    stated: the default is no sharing. At most 64: the plugin ConfigMap shipped in `agent/deploy/gpu-operator/` has
    an entry `time-slicing-<N>` for every N from 2 to 64, which an AL2023 node names by its label (a test keeps the
    two equal). 1 in every other mode (checked below), so it is read without asking the mode."""
    mig_profile: str | None = None
    """mig: the profile every GPU is partitioned into, e.g. `1g.10gb` (`1g.10gb+me` with the media engine)."""
    mig_strategy: Literal["single", "mixed"] = "mixed"
    """mig: how the NVIDIA device plugin names the slices — `mixed`: `nvidia.com/mig-<profile>` with `+` as `.`
    (`nvidia.com/mig-1g.10gb.me`); `single`:
    `nvidia.com/gpu` (pods ask for a slice as for a GPU). The node's device plugin config is chosen to match."""

    @model_validator(mode="after")
    def _mode_fields(self) -> GpuSharing:
        if self.mode != "time-slicing" and self.replicas != 1:
            raise ValueError("replicas only applies to mode 'time-slicing'")
        if self.mode == "time-slicing" and self.replicas < 2:
            raise ValueError("mode 'time-slicing' needs replicas, at least 2 (how many pods share one GPU; the NVIDIA "
                             "device plugin refuses fewer)")
        if self.mode == "mig" and not self.mig_profile:
            raise ValueError("mode 'mig' needs migProfile, e.g. '1g.10gb'")
        if self.mig_strategy != "mixed" and self.mode != "mig":
            raise ValueError("migStrategy only applies to mode 'mig'")
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
    """How long a node must have been empty before it is removed, and, for one with pods, how long since its last
    pod event (a pod bound to it or gone from it; its creation while none is known) before it is consolidated —
    Karpenter's "time to wait to consolidate a node after a pod has been added or removed from the node"."""
    min_node_age: Duration = timedelta(minutes=10)
    """No voluntary disruption of a node younger than this: its pods may still be on their way to it."""
    empty_keep_lead_times: float = Field(default=2.0, ge=0)
    """An empty node stays at least this many of its pool's `leadTime` (and `consolidateAfter`) before it is
    removed: removing it and buying it back for the next pod costs a boot billed idle plus that pod's wait, each
    about a lead time, so keeping it that long costs at most what removing it too early would (the ski-rental
    break-even). 0: `consolidateAfter` alone, as Karpenter does."""
    underutilized_below: float | None = Field(default=0.5, gt=0, le=1)
    """A node with pods is weighed by the underutilized search only while its pods request less than this share of
    its GPUs (on a node without GPUs, of its CPU or its memory, whichever is more used): Cluster Autoscaler's
    `--scale-down-gpu-utilization-threshold` and `--scale-down-utilization-threshold`, 0.5 both. Moving the pods
    of a half-used GPU node onto others' free room saves its price only until the next pods arrive, which then
    wait for a node to boot: replaying three Alibaba traces with the search every minute, weighing every node
    launched 1.4–1.7 times the nodes and ran fewer pods on each (docs/economics-rounds.md, the eighth round). None:
    every node with pods is weighed, as Karpenter does."""
    into_sunk_room: bool = True
    """Whether a node at or over `underutilizedBelow` is still deleted when its pods all fit in sunk room: free room on
    nodes that stay (kept by the underutilized search, or themselves busy) whose own pods no cheaper new nodes would
    hold (a p3dn.24xlarge held by a V100 pod: seven GPUs paid for as long as that pod runs, whoever uses them). The
    threshold keeps the room the packer bought for the next arrivals; sunk room was bought for no one. False:
    Cluster Autoscaler's rule alone (a node over its threshold is never scaled down)."""
    spot_to_spot: bool = False
    """Whether consolidation may replace Spot nodes (Karpenter's `SpotToSpotConsolidation` feature gate): by
    cheaper Spot only, a single node only from at least 15 cheaper types. Off, as Karpenter's default, Spot nodes in
    a pool that may launch Spot are only deleted when their pods fit on the nodes that stay, never replaced, not by
    On-Demand either."""
    budgets: list[Budget] = Field(default_factory=lambda: [Budget(nodes="10%")])
    rebalance: Literal["ignore", "replace"] = "replace"
    """On a rebalance recommendation: ignore it, or launch a replacement and then drain."""
    rebalance_drain_after: Duration = timedelta(minutes=10)
    """Drain a rebalanced node once its replacement is Ready, or after this long at most."""

    @model_serializer(mode="wrap")
    def _with_every_node_weighed(self, handler: SerializerFunctionWrapHandler,
                                 info: SerializationInfo) -> dict[str, Any]:
        """`underutilizedBelow: null` written even where nulls are left out: it is the one setting whose null is not
        its default (0.5), and the configuration the Lambdas read (`Config.to_json`, the SSM parameter) leaves nulls
        out, so a pool set to weigh every node would weigh as Cluster Autoscaler in the account."""
        out: dict[str, Any] = handler(self)
        if self.underutilized_below is None and info.exclude_none:
            out[to_camel("underutilized_below") if info.by_alias else "underutilized_below"] = None
        return out


class Overhead(_Model):
    """Resources each node spends before pods, as quantity strings.

    `daemonsets`: the requests of the pods every node runs (the packer keeps room for them). The kubelet's
    reservations default to an EKS AMI's own (`domain/packing/reserved.py`); what is set here replaces the
    default key by key, and the user data states the result to every node so it offers what was planned."""

    daemonsets: dict[str, str] = Field(default_factory=lambda: {"cpu": "200m", "memory": "256Mi"})
    kube_reserved: dict[str, str] = Field(default_factory=dict)
    """Over the EKS default: cpu by the core-count ladder, memory 11Mi × max pods + 255Mi, ephemeral-storage 1Gi."""
    system_reserved: dict[str, str] = Field(default_factory=dict)
    eviction_hard: dict[str, str] = Field(default_factory=dict)
    """Over the EKS default: memory.available 100Mi, nodefs.available 10%, nodefs.inodesFree 5%."""

    @field_validator("kube_reserved", "system_reserved", "daemonsets")
    @classmethod
    def _quantities(cls, values: dict[str, str]) -> dict[str, str]:
        for name, quantity in values.items():
            try:
                parse_quantity(quantity)
            except ValueError:
                raise ValueError(f"{name}: '{quantity}' is not a Kubernetes quantity") from None
        return values

    @field_validator("eviction_hard")
    @classmethod
    def _thresholds(cls, values: dict[str, str]) -> dict[str, str]:
        for signal, threshold in values.items():
            try:
                float(threshold[:-1]) if threshold.endswith("%") else parse_quantity(threshold)
            except ValueError:
                raise ValueError(f"{signal}: '{threshold}' is neither a quantity nor a percentage") from None
        return values


_PRE_PULL_CHARACTERS = 8192


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
    spare_room_worth: float = Field(default=0.8, ge=0, lt=1)
    """When a batch of pending pods fits one node, a node's spare room (free GPUs with CPU and memory beside them)
    counts at this share of its part of the node's price: a dearer type is bought for the pods that arrive next
    when that makes it the better buy (`domain.packing.room`). 0: the cheapest node for the batch alone."""
    lead_time: Duration = timedelta(minutes=8)
    """Node boot plus image pull: how early warm capacity must be asked for."""
    ephemeral_storage: str = "100Gi"
    """Size of the volume the pool's nodes keep ephemeral storage on (AL2023's root, Bottlerocket's data volume), as a
    quantity. Their `ephemeral-storage` capacity is the filesystem on it: planned as this less 2 % and 1 GiB
    (`domain.packing.filesystem`)."""
    pre_pull_images: list[str] = Field(default_factory=list, max_length=50)
    """Images pulled during boot, before the kubelet starts (AL2023): each pinned by tag or digest. Bottlerocket
    has no such setting; there a data-volume snapshot (`gpu-autoscaler snapshot`) puts images on disk."""
    soci: bool = False
    """The SOCI snapshotter in parallel pull/unpack mode (AL2023 nodeadm `FastImagePull`, Bottlerocket
    `settings.container-runtime.snapshotter = "soci"`): large images pull and unpack in parallel."""

    @field_validator("labels")
    @classmethod
    def _labels_the_kubelet_registers(cls, labels: dict[str, str]) -> dict[str, str]:
        """A pool's labels reach the node through the kubelet's `--node-labels`: a label it may not set would stop
        the node from joining, and one that restates a well-known label would contradict the instance's own."""
        refused = sorted(k for k in labels if not kubelet_may_set(k))
        if refused:
            raise ValueError(f"labels {refused}: the kubelet may not set labels in the kubernetes.io or k8s.io "
                             "namespaces (NodeRestriction) except node.kubernetes.io/… and kubelet.kubernetes.io/…; "
                             "use your own prefix")
        reserved = sorted(k for k in labels if k in WELL_KNOWN or k == CLAIM_LABEL)
        if reserved:
            raise ValueError(f"labels {reserved}: set on every node from its instance type, pool and claim; "
                             "select on them with requirements instead")
        return labels

    ami: Ami | None = None
    """The pool's own node image (the global `ami` shape); absent, the global one."""
    block_device_mappings: list[BlockDeviceMapping] = Field(default_factory=list)
    """The pool's volumes (Karpenter's EC2NodeClass shape); absent, one volume of `ephemeralStorage` (and
    Bottlerocket's OS volume). Whatever is set here is what each instance of the pool is launched with."""

    termination_grace_period: Duration | None = None
    """Karpenter's NodePool `spec.template.spec.terminationGracePeriod`: how long a voluntary drain (consolidation,
    drift, rebalance) of one of the pool's nodes may be held by PodDisruptionBudgets and do-not-disrupt pods,
    counted from its cordon; then the pods are deleted (each early enough to get its own grace period) and the
    node goes. Unset: a voluntary drain waits for them however long it takes."""

    @model_validator(mode="after")
    def _labels_and_taints_a_kubelet_accepts(self) -> NodePool:
        """The kubelet checks `--node-labels` and `--register-with-taints` (Bottlerocket's node-labels / node-taints)
        before it starts (kubernetes `ValidateKubeletFlags`: IsQualifiedName keys, IsValidLabelValue values;
        `pkg/util/taints.ParseTaints`: the same for taints, one per key and effect) and exits on a bad one: every
        instance of the pool would boot, never join, and be billed until the registration timeout. Karpenter refuses
        the same in a NodePool at admission."""
        problems = [f"label {key}={value}: {problem}" for key, value in self.labels.items()
                    for problem in (label_key_problem(key), label_value_problem(value)) if problem]
        problems += [f"taint {taint.key}={taint.value}:{taint.effect}: {problem}" for taint in self.taints
                     for problem in (label_key_problem(taint.key), label_value_problem(taint.value)) if problem]
        seen = [(taint.key, taint.effect) for taint in self.taints]
        problems += [f"taints {key}:{effect}: one taint per key and effect (the kubelet refuses duplicates)"
                     for key, effect in sorted(set(seen)) if seen.count((key, effect)) > 1]
        if problems:
            raise ValueError(f"node pool '{self.name}': " + "; ".join(problems)
                             + " (a kubelet refuses to start on it: the pool's nodes would never join)")
        return self

    @model_validator(mode="after")
    def _requirements_a_node_can_meet(self) -> NodePool:
        """A requirement on a label no node of the pool carries holds for no instance type: the pool could never
        launch, and the packer would say so only once pods wait. Negative operators hold without the label."""
        carried = NODE_LABEL_KEYS | set(self.labels)
        for requirement in self.requirements:
            if requirement.operator in ("In", "Exists", "Gt", "Lt") and requirement.key not in carried:
                raise ValueError(
                    f"requirement {requirement.key}: no node of pool {self.name} carries this label, so no instance "
                    f"type meets it; select on the labels nodes carry ({', '.join(sorted(NODE_LABEL_KEYS))}), or set "
                    "it in the pool's labels")
        return self

    @field_validator("ephemeral_storage")
    @classmethod
    def _storage_quantity(cls, value: str) -> str:
        if parse_quantity(value) <= 0:
            raise ValueError(f"'{value}' must be a positive quantity such as '100Gi'")
        return value

    @field_validator("pre_pull_images")
    @classmethod
    def _image_references(cls, images: list[str]) -> list[str]:
        for image in images:
            if not parse_image_reference(image).pinned:
                raise ValueError(f"'{image}' names no tag or digest: pin it (an implicit 'latest' drifts)")
        repeated = sorted({i for i in images if images.count(i) > 1})
        if repeated:
            raise ValueError(f"repeated: {', '.join(repeated)}")
        if sum(len(i) for i in images) > _PRE_PULL_CHARACTERS:
            raise ValueError(f"the references add up to more than {_PRE_PULL_CHARACTERS} characters: EC2 user data "
                             "is at most 16 KB, and the node's bootstrap needs the rest")
        return images

    @field_validator("block_device_mappings")
    @classmethod
    def _distinct_devices(cls, mappings: list[BlockDeviceMapping]) -> list[BlockDeviceMapping]:
        devices = [m.device_name for m in mappings]
        repeated = sorted({d for d in devices if devices.count(d) > 1})
        if repeated:
            raise ValueError(f"device {repeated[0]} is mapped more than once")
        return mappings

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
        """Refused here what EventBridge Scheduler's CreateSchedule refuses, rather than at the deploy (or, in the
        emulator, at each of prewarm's ticks)."""
        if not _CRON.match(schedule):
            raise ValueError(f"'{schedule}' is not an EventBridge cron expression like 'cron(0 9 ? * MON-FRI *)'")
        from gpu_autoscaler.domain.windows import CronError, CronExpression

        try:
            CronExpression.parse(schedule)
        except CronError as error:
            raise ValueError(str(error)) from None
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


class MeasuredLeadTime(_Model):
    """Lead time from measured boots: once a pool has `minSamples` boots (launch → GPUs allocatable) recorded
    within `history`, their `quantile` replaces the pool's fixed `leadTime` for pre-warm and windows."""

    enabled: bool = True
    min_samples: int = Field(default=5, ge=1)
    quantile: float = Field(default=0.9, gt=0, le=1)
    """0.5 for the median; the default p90 has nine boots in ten done in time."""
    history: Duration = timedelta(days=14)
    """How long a boot is remembered (the samples' TTL): a new AMI or image shows within this."""


class Timeouts(_Model):
    unavailable_offering_ttl: Duration = timedelta(minutes=3)
    registration_ttl: Duration = timedelta(minutes=15)
    """From a claim's launch (or creation, never launched) to its node registered, and again from its registration
    to the node initialized (Ready, the cloud controller manager's taint gone, its GPUs allocatable): a claim whose
    node has not, by then, is ended."""
    pod_assignment_ttl: Duration = timedelta(minutes=30)
    scheduling_grace: Duration = timedelta(minutes=2)
    """How long after its node was initialized (could take pods: `domain.initialization`) a claim still covers the
    pods it was made for: a pod still pending after that lost its room to other pods the scheduler put there, and
    is planned again. Not counted from the Node's registration: a GPU node takes minutes from there to GPUs."""
    interruption_drain: Duration = timedelta(minutes=30)
    """A rebalance drain's deadline after `rebalanceDrainAfter`: a drain not started by then (its replacement
    never initialized) leaves the node. Budgets are never overridden by it (see `terminationGracePeriod`)."""
    consolidation_validation: Duration = timedelta(seconds=15)
    """How long a consolidation decision must still hold before it is carried out (Karpenter's 15 s); it is
    looked at again by the first consolidate tick this long after the one that took it."""
    consolidation_drain: Duration = timedelta(minutes=30)
    """Deadline of a consolidation's (voluntary) drain: a drain whose replacements are not initialized by then
    leaves the node. Budgets are never overridden by it (see the pool's `terminationGracePeriod`)."""
    garbage_collection_grace: Duration = timedelta(minutes=5)
    """How old an instance of ours must be before the garbage collector terminates it for having no live claim,
    and how long a claim's instance may be missing from DescribeInstances before the claim is closed: longer than
    a launch takes to be recorded, and than EC2's eventual consistency (`services.garbage_collection`)."""


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
    measured_lead_time: MeasuredLeadTime = Field(default_factory=MeasuredLeadTime)
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
        windows = [w.name for w in self.scaling_windows]
        repeated = sorted({n for n in windows if windows.count(n) > 1})
        if repeated:  # each is one schedule, `window-<name>`, and holds its nodes under `window:<name>`
            raise ValueError(f"scaling window names must be unique; repeated: {', '.join(repeated)}")
        for window in self.scaling_windows:
            if window.node_pool not in names:
                raise ValueError(f"scaling window '{window.name}' names unknown node pool '{window.node_pool}'")
        for index, pool in enumerate(self.node_pools):
            sharing = pool.gpu_sharing
            if self.pool_ami(pool).family == "Bottlerocket" and sharing.mode == "mig" \
                    and sharing.mig_strategy != "single":
                raise ValueError(f"node pool '{pool.name}': Bottlerocket's device plugin advertises MIG slices with "
                                 "the single strategy (as nvidia.com/gpu); set gpuSharing.migStrategy to 'single'")
            _image_pull_supported(pool, self.pool_ami(pool))
            self._ephemeral_volume_fits(index, pool)
        return self

    def _ephemeral_volume_fits(self, index: int, pool: NodePool) -> None:
        """A pool that maps its own volumes must map the one kubelet's ephemeral storage lives on (AL2023's
        root, Bottlerocket's data volume), at least as large as the `ephemeralStorage` the packer plans with."""
        if not pool.block_device_mappings:
            return
        device = "/dev/xvdb" if self.pool_ami(pool).family == "Bottlerocket" else "/dev/xvda"
        mapping = next((m for m in pool.block_device_mappings if m.device_name == device), None)
        where = f"nodePools[{index}]"
        if mapping is None:
            raise ValueError(f"{where}.blockDeviceMappings: no {device}, the volume kubelet's ephemeral storage "
                             f"lives on ({self.pool_ami(pool).family})")
        size = mapping.ebs.size_gib
        if size is not None and size * GIB < parse_quantity(pool.ephemeral_storage):
            raise ValueError(f"{where}.ephemeralStorage: {pool.ephemeral_storage} exceeds the {size} GiB of "
                             f"{device}; set it to what the volume holds")

    def pool_ami(self, pool: NodePool) -> Ami:
        """The image a pool's nodes boot: its own, else the global one."""
        return pool.ami or self.ami

    def pool_images(self, pool: NodePool) -> dict[str, str]:
        """Architecture → the image a pool's nodes boot (`pool_ami`'s `images`)."""
        return self.pool_ami(pool).images()

    def pool(self, name: str) -> NodePool:
        for pool in self.node_pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no node pool named '{name}'")

    @property
    def records_pod_shapes(self) -> bool:
        """Whether the packer records each pod shape class's demand (`domain.pod_shapes`): pre-warm shapes by it
        the forecast's headroom and the nodes of a window that asks for a GPU count."""
        return self.predictive.enabled or any(w.warm.gpus is not None for w in self.scaling_windows)

    @property
    def zones(self) -> list[str]:
        return sorted(self.network.subnets)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


def config_digest(published: str) -> str:
    """The digest of the configuration JSON the stack publishes (`Config.to_json()`, the SSM parameter's value):
    the stack puts it in every function's environment, so that changing the configuration changes every function
    (`infra.functions`), and a function tells by it whether the parameter it read is the one it was deployed with."""
    return hashlib.sha256(published.encode()).hexdigest()[:16]


_FAST_IMAGE_PULL_AL2023 = "20250821"
"""First EKS AL2023 AMI release whose nodeadm knows the `FastImagePull` feature gate (amazon-eks-ami
commit 28454ab9, in tag v20250821; nodeadm/doc/examples.md "Enabling fast image pull")."""
_SOCI_BOTTLEROCKET = (1, 45, 0)
"""Bottlerocket's `settings.container-runtime.snapshotter` (`overlayfs` | `soci`) is in the 1.45.x settings
reference (bottlerocket.dev/en/os/1.45.x/api/settings/container-runtime); older releases are refused as not
known to have it."""


def _image_pull_supported(pool: NodePool, ami: Ami) -> None:
    """Refuse what the pool's AMI family cannot do, naming the way it can."""
    if pool.pre_pull_images and ami.family == "Bottlerocket":
        raise ValueError(
            f"node pool '{pool.name}': prePullImages needs AL2023 (Bottlerocket has no setting that pulls images "
            "at boot); on Bottlerocket build a data-volume snapshot with `gpu-autoscaler snapshot` and give its "
            "snapshotId in the pool's blockDeviceMappings"
        )
    if not pool.soci:
        return
    if ami.family == "AL2023":
        release = re.fullmatch(r"v?(\d{8})", ami.version)
        if release and release[1] < _FAST_IMAGE_PULL_AL2023:
            raise ValueError(f"node pool '{pool.name}': soci needs an EKS AL2023 AMI from "
                             f"v{_FAST_IMAGE_PULL_AL2023} on (nodeadm FastImagePull); ami.version is {ami.version}")
    else:
        release = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", ami.version)
        if release and tuple(int(part) for part in release.groups()) < _SOCI_BOTTLEROCKET:
            raise ValueError(f"node pool '{pool.name}': soci needs Bottlerocket 1.45.0 or later "
                             f"(settings.container-runtime.snapshotter); ami.version is {ami.version}")


def parse_config(data: Any, *, unknown_keys: Literal["forbid", "ignore"] = "forbid") -> Config:
    """Validate a configuration object, raising `ConfigError` with every problem named.

    A key no model knows is refused (a typo in cdk.json would otherwise be a setting silently not set), unless
    `unknown_keys` is "ignore": the functions' reading of the SSM parameter, which a newer version may have written
    (CloudFormation updates the parameter before the functions that reference it, DependsOn attribute: "Resource B
    is updated before resource A"; `Config.to_json` writes every field, defaults too). Then such keys are dropped
    with one warning naming them all, and every other problem is still refused."""
    if not isinstance(data, dict):
        raise ConfigError([f"the configuration must be a JSON object, got {type(data).__name__}"])
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
    unknown = [_path(error["loc"]) for error in errors if error["type"] == "extra_forbidden"]
    if unknown_keys == "forbid" or not unknown:
        raise ConfigError([_describe(error) for error in errors])
    try:
        config = Config.model_validate(data, extra="ignore")
    except ValidationError as exc:
        raise ConfigError([_describe(error) for error in exc.errors()]) from None
    logger.warning("the configuration was written by a newer gpu-autoscaler, or by hand: "
                   "ignoring keys this version does not know: %s", ", ".join(unknown))
    return config


def _path(loc: Any) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _describe(error: Any) -> str:
    path = _path(error["loc"])
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

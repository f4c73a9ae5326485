"""vCPU service quotas and pool limits: budgets a plan must stay within, counting what is already live.

EC2 limits running vCPUs per instance class and purchase option (EC2 User Guide, "On-Demand Instance quotas"
and "Spot Instance quotas"): "Running On-Demand G and VT instances", "Running On-Demand P instances" (every P
family), "All G and VT Spot Instance Requests", "All P4, P3 and P2 Spot Instance Requests", "All P5 Spot
Instance Requests". A quota is keyed here as `<group>/<capacity type>` (`g/spot`, `p/on-demand`, `p5/spot`), the
group being the class CloudWatch's `AWS/Usage` metrics name (`G/Spot`, `P/OnDemand`, `P5/Spot`): `g` for g*, gr*
and vt*; `p` for p* except that Spot P5 types (p5, p5e, p5en) are `p5`. `<family>/<capacity type>`
(`p4d/on-demand`) narrows a budget to one family and is checked as well (for the p5 family it is the P5 class
key itself). Spot types of later P generations have no quota of their own in that list: they get a class of
their own (`p6/spot`), unknown unless configured, and EC2's own refusal (`MaxSpotInstanceCountExceeded`, a
capacity error) is the backstop. Instances launched into a capacity reservation count against On-Demand.

A claim that is not launched yet may become any of its candidates, so it is charged the most any of them
would take: the largest vCPU count per quota key, the most GPUs and the highest price for pool limits.

The quotas are per account and region: every other instance of the class (a managed node group, another
cluster, a notebook) counts against them too. What those use is read from the quota's usage metric (CloudWatch
`AWS/Usage` `ResourceCount`, "collected every minute", CloudWatch User Guide, "AWS usage metrics"), which counts
the whole account, this cluster included: `vcpus_outside` takes out our instances the metric already shows, and
the ledger starts each key at that, our live claims charged on top. The metric lags: an instance of ours is taken
to be shown once it was launched `USAGE_METRIC_LAG` before the latest datapoint. What that gets wrong, and which
way: our instances launched within the lag (the metric may show them already) and ours terminated within it (it
still shows them) are counted twice, which only holds a launch back a few minutes; other workloads' launches
since the datapoint, or a metric later than the lag, are not counted, and there EC2's refusal
(`VcpuLimitExceeded`, taken as a capacity error) stays the backstop. The simpler max(ours, account usage)
under-counts in the usual case instead: right after our own launch, with others running, by all we launched.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING

from gpu_autoscaler.models.claims import launched_at

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from gpu_autoscaler.config import CapacityType, NodePool
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.quotas import UsageReading
    from gpu_autoscaler.ports import QuotaSource

__all__ = [
    "QUOTA_CODES",
    "USAGE_METRIC_LAG",
    "LimitLedger",
    "VcpuLedger",
    "quota_group",
    "quota_keys",
    "vcpu_budget",
    "vcpus_outside",
]

QUOTA_CODES: dict[str, str] = {
    "g/on-demand": "L-DB2E81BA",
    "p/on-demand": "L-417A185B",
    "g/spot": "L-3819A6DF",
    "p/spot": "L-7212CCBC",
    "p5/spot": "L-C4BD4855",
}
"""Service Quotas codes (service `ec2`) of the vCPU quotas GPU instances count against."""

USAGE_METRIC_LAG = timedelta(minutes=5)
"""How long before a usage datapoint an instance of ours must have been launched to be taken as counted in it."""

_GROUPS = (("vt", "g"), ("gr", "g"), ("g", "g"), ("p", "p"), ("dl", "dl"), ("inf", "inf"), ("trn", "trn"))
_LETTERS = re.compile(r"^[a-z]+")
_GENERATION = re.compile(r"^p(\d+)")


def quota_group(instance_type: InstanceType, capacity_type: CapacityType = "on-demand") -> str:
    letters = _LETTERS.match(instance_type.name)
    prefix = letters.group(0) if letters else instance_type.name
    for start, group in _GROUPS:
        if prefix.startswith(start):
            return _spot_p_class(instance_type) if group == "p" and capacity_type == "spot" else group
    return "standard"


def _spot_p_class(instance_type: InstanceType) -> str:
    """`p` for P2-P4 ("All P4, P3 and P2 Spot Instance Requests"), `p5` for P5, `p<n>` for a later generation."""
    generation = _GENERATION.match(instance_type.name)
    number = int(generation.group(1)) if generation else 0
    return "p" if number <= 4 else f"p{number}"


def quota_keys(instance_type: InstanceType, capacity_type: CapacityType) -> tuple[str, str]:
    """(group key, family key) of the quotas an instance of this type and capacity type counts against."""
    purchase = "on-demand" if capacity_type == "reserved" else capacity_type
    return f"{quota_group(instance_type, purchase)}/{purchase}", f"{instance_type.family}/{purchase}"


def vcpus_outside(usage: Mapping[str, UsageReading], claims: Iterable[NodeClaim], catalog: Catalog) -> dict[str, int]:
    """vCPUs the account's other instances use per quota key: its usage less this cluster's instances that the
    reading shows (launched `USAGE_METRIC_LAG` before it; see the module docstring for what that gets wrong).
    `claims`: the cluster's live claims, all of them (not a consolidation's view of them)."""
    shown: dict[str, int] = {}
    for claim in claims:
        instance_type = catalog.get(claim.instance_type) if claim.instance_id and claim.instance_type else None
        if instance_type is None:
            continue
        key = quota_keys(instance_type, claim.capacity_type)[0]
        reading = usage.get(key)
        if reading is not None and launched_at(claim) <= reading.at - USAGE_METRIC_LAG:
            shown[key] = shown.get(key, 0) + instance_type.vcpu
    return {key: max(0, reading.vcpus - shown.get(key, 0)) for key, reading in usage.items()}


def vcpu_budget(source: QuotaSource | None, claims: Iterable[NodeClaim], catalog: Catalog,
                ) -> tuple[Mapping[str, int] | None, dict[str, int] | None]:
    """(quotas, what the account's other instances use of them) for one pass; (None, None) with no source."""
    if source is None:
        return None, None
    return source.vcpu_quotas(), vcpus_outside(source.vcpu_usage(), claims, catalog)


class VcpuLedger:
    """vCPUs in use or planned per quota key, against the quotas that are known: `outside` (what the account's other
    instances use, `vcpus_outside`) first, then this cluster's live claims and plan (`used`)."""

    def __init__(self, quotas: Mapping[str, int], outside: Mapping[str, int] | None = None) -> None:
        self.quotas = dict(quotas)
        self.outside = {k: v for k, v in (outside or {}).items() if k in self.quotas and v > 0}
        self.used: dict[str, int] = {}

    def consumption(self, types: Sequence[InstanceType], capacity_type: CapacityType) -> dict[str, int]:
        out: dict[str, int] = {}
        for instance_type in types:
            for key in quota_keys(instance_type, capacity_type):
                if key in self.quotas:
                    out[key] = max(out.get(key, 0), instance_type.vcpu)
        return out

    def left(self, key: str) -> int:
        return self.quotas[key] - self.outside.get(key, 0) - self.used.get(key, 0)

    def full(self, key: str) -> str:
        """Why a node that would take vCPUs of `key` is not planned, for a reason text."""
        outside = self.outside.get(key, 0)
        others = f" here, {outside} by the account's other instances" if outside else ""
        return (f"the vCPU quota {key} ({self.quotas[key]} vCPUs, {self.used.get(key, 0)} in use or planned{others}) "
                "has no room for it")

    def admits_type(self, instance_type: InstanceType, capacity_type: CapacityType) -> bool:
        return all(
            instance_type.vcpu <= self.left(key)
            for key in quota_keys(instance_type, capacity_type)
            if key in self.quotas
        )

    def admits(self, consumption: Mapping[str, int]) -> bool:
        return all(vcpus <= self.left(key) for key, vcpus in consumption.items())

    def charge(self, consumption: Mapping[str, int]) -> None:
        for key, vcpus in consumption.items():
            self.used[key] = self.used.get(key, 0) + vcpus

    def blocking(self, types: Iterable[InstanceType], capacity_type: CapacityType) -> str | None:
        """The first quota key that leaves no room for the cheapest of these types, for a reason text."""
        for instance_type in types:
            for key in quota_keys(instance_type, capacity_type):
                if key in self.quotas and instance_type.vcpu > self.left(key):
                    return key
        return None


class LimitLedger:
    """One pool's `limits` (GPUs, USD/h) against its live claims and what this plan adds."""

    def __init__(self, pool: NodePool) -> None:
        self.pool = pool
        self.gpus = 0.0
        self.price = 0.0

    @property
    def bounded(self) -> bool:
        return self.pool.limits.bounded

    def admits(self, gpus: float, price: float) -> bool:
        limits = self.pool.limits
        if limits.gpus is not None and self.gpus + gpus > limits.gpus + 1e-9:
            return False
        return limits.price_per_hour is None or self.price + price <= limits.price_per_hour + 1e-9

    def charge(self, gpus: float, price: float) -> None:
        self.gpus += gpus
        self.price += price

    def describe(self) -> str:
        limits = self.pool.limits
        parts = []
        if limits.gpus is not None:
            parts.append(f"{limits.gpus} GPUs ({self.gpus:g} in use or planned)")
        if limits.price_per_hour is not None:
            parts.append(f"{limits.price_per_hour:g} USD/h ({self.price:.2f} in use or planned)")
        return f"pool {self.pool.name} is at its limit of " + " and ".join(parts)

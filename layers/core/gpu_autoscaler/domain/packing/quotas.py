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
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from gpu_autoscaler.config import CapacityType, NodePool
    from gpu_autoscaler.models.catalog import InstanceType

__all__ = [
    "QUOTA_CODES",
    "LimitLedger",
    "VcpuLedger",
    "quota_group",
    "quota_keys",
]

QUOTA_CODES: dict[str, str] = {
    "g/on-demand": "L-DB2E81BA",
    "p/on-demand": "L-417A185B",
    "g/spot": "L-3819A6DF",
    "p/spot": "L-7212CCBC",
    "p5/spot": "L-C4BD4855",
}
"""Service Quotas codes (service `ec2`) of the vCPU quotas GPU instances count against."""

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


class VcpuLedger:
    """vCPUs in use or planned per quota key, against the quotas that are known."""

    def __init__(self, quotas: Mapping[str, int]) -> None:
        self.quotas = dict(quotas)
        self.used: dict[str, int] = {}

    def consumption(self, types: Sequence[InstanceType], capacity_type: CapacityType) -> dict[str, int]:
        out: dict[str, int] = {}
        for instance_type in types:
            for key in quota_keys(instance_type, capacity_type):
                if key in self.quotas:
                    out[key] = max(out.get(key, 0), instance_type.vcpu)
        return out

    def left(self, key: str) -> int:
        return self.quotas[key] - self.used.get(key, 0)

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
        return self.pool.limits.gpus is not None or self.pool.limits.price_per_hour is not None

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

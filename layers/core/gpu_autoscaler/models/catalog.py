"""What can be launched: instance types and their offerings (type × zone × capacity type, with a price)."""

from __future__ import annotations

import re
from datetime import datetime
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from gpu_autoscaler.config import CapacityType
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.cached import CachedModel

__all__ = ["InstanceType", "Offering", "name_labels"]

_NAME = re.compile(r"^(?P<family>(?P<category>[a-z]+?)(?P<generation>\d+)[a-z0-9-]*)\.(?P<size>.+)$")


def name_labels(name: str) -> dict[str, str]:
    """The well-known labels an instance type's name alone says (type, family, category, generation, size): all
    that is known of a type the catalog does not hold."""
    m = _NAME.match(name)
    out = {L.INSTANCE_TYPE: name, L.INSTANCE_FAMILY: m.group("family") if m else name.split(".")[0]}
    if m:
        out[L.INSTANCE_CATEGORY] = m.group("category")
        out[L.INSTANCE_GENERATION] = m.group("generation")
        out[L.INSTANCE_SIZE] = m.group("size")
    return out


def _kebab(name: str) -> str:
    """`Radeon Pro V520` → `radeon-pro-v520`, as Karpenter's `lowerKabobCase`."""
    return name.lower().replace(" ", "-")


class InstanceType(CachedModel):
    """An EC2 instance type as the packer needs it; GPU numbers already corrected by the override table."""

    model_config = ConfigDict(frozen=True, ignored_types=(cached_property,))

    name: str
    vcpu: int
    memory_mib: int
    architecture: str = "x86_64"
    gpus: float = 0
    """Physical GPUs; a fraction for partitioned types (g6f.large: 0.125 of an L4)."""
    gpu_devices: int = 0
    """GPU devices the node advertises as `nvidia.com/gpu` (a partition counts as one device)."""
    gpu_model: str | None = None
    gpu_manufacturer: str | None = None
    gpu_memory_mib: int = 0
    """Total GPU memory of the instance."""
    efa: bool = False
    efa_interfaces: int = 0
    """EFA interfaces the type takes (`EfaInfo.MaximumEfaInterfaces`): one per network card on multi-card types."""
    max_pods: int = 110
    capacity_types: tuple[CapacityType, ...] = ("on-demand", "spot")

    @cached_property
    def family(self) -> str:
        return self.labels[L.INSTANCE_FAMILY]

    @cached_property
    def labels(self) -> dict[str, str]:
        """The well-known labels a node of this type carries, for requirement matching."""
        out = name_labels(self.name)
        out.update({L.ARCH: "arm64" if self.architecture == "arm64" else "amd64", L.INSTANCE_CPU: str(self.vcpu),
                    L.INSTANCE_MEMORY: str(self.memory_mib)})
        # As Karpenter's AWS provider writes them (pkg/providers/instancetype/types.go): names in lower kebab
        # case, memory of one GPU in MiB (EC2's `GpuInfo.Gpus[].MemoryInfo.SizeInMiB`).
        if self.gpu_model:
            out[L.INSTANCE_GPU_NAME] = _kebab(self.gpu_model)
            out[L.INSTANCE_GPU_COUNT] = str(self.gpu_devices)
            out[L.INSTANCE_GPU_MEMORY] = str(round(self.gpu_memory_mib / max(self.gpu_devices, 1)))
        if self.partitioned:
            out[L.INSTANCE_GPU_FRACTION] = f"{self.gpus / self.gpu_devices:g}"
        if self.gpu_manufacturer:
            out[L.INSTANCE_GPU_MANUFACTURER] = _kebab(self.gpu_manufacturer)
        return out

    @property
    def is_gpu(self) -> bool:
        return self.gpu_devices > 0

    @property
    def partitioned(self) -> bool:
        """Each device is a fraction of a GPU (g6f.large: one device, 1/8 of an L4)."""
        return self.is_gpu and self.gpus < self.gpu_devices


class Offering(BaseModel):
    """One place an instance type can be bought, and what it costs now."""

    model_config = ConfigDict(frozen=True)

    instance_type: str
    zone: str
    capacity_type: CapacityType
    price_per_hour: float = Field(ge=0)
    interruption_band: int | None = None
    """Spot Advisor frequency band 0–4 (<5% … >20%); None for on-demand and reserved."""
    reservation_id: str | None = None
    reservation_type: str | None = None
    available_count: int | None = None
    """Instances left in the reservation; None where it is not a reservation."""
    counted_at: datetime | None = None
    """When `available_count` was read from EC2: our launches into the reservation recorded after it are not in it
    (the solver takes them off). None where the count is not EC2's (not a reservation, or the configuration's)."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.instance_type, self.zone, self.capacity_type)

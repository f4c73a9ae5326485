"""DescribeInstanceTypes entries → `InstanceType`, with the GPU override table applied.

GPU facts are read from the real API fields: `GpuInfo.Gpus[]` (`Count`, `LogicalGpuCount`,
`GpuPartitionSize`, `MemoryInfo.SizeInMiB`, `Name`, `Manufacturer`) and `GpuInfo.TotalGpuMemoryInMiB`.
A partitioned GPU (g6f, gr6f: a slice of an L4) reports `Count` 0 with `LogicalGpuCount` 1 and
`GpuPartitionSize` 0.125–0.5: physical GPUs are then `LogicalGpuCount × GpuPartitionSize` and the node
advertises `LogicalGpuCount` devices. Types whose data is wrong or missing (`data/gpu_overrides.json`)
take the table's values; when the API disagrees with a non-zero answer of its own, that is logged so the
entry can be reviewed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.config import CAPACITY_ORDER
from gpu_autoscaler.domain.max_pods import max_pods
from gpu_autoscaler.models.catalog import InstanceType

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gpu_autoscaler.config import CapacityType

__all__ = [
    "GPU_OVERRIDES_FILE",
    "GpuFacts",
    "gpu_facts_from_api",
    "instance_type_from_api",
    "load_gpu_overrides",
]

logger = logging.getLogger(__name__)

GPU_OVERRIDES_FILE = "gpu_overrides.json"

_USAGE_CLASSES: dict[str, CapacityType] = {"on-demand": "on-demand", "spot": "spot", "capacity-block": "reserved"}


@dataclass(frozen=True)
class GpuFacts:
    gpus: float
    """Physical GPUs; a fraction for a partition."""
    gpu_devices: int
    """Devices advertised as `nvidia.com/gpu`: a partition is one device."""
    gpu_model: str | None
    gpu_manufacturer: str | None
    gpu_memory_mib: int
    reason: str = ""


def load_gpu_overrides(text: str | None = None) -> dict[str, GpuFacts]:
    """The maintained table of GPU corrections, by instance type (from the package unless `text` is given)."""
    raw = text if text is not None else (resources.files("gpu_autoscaler") / "data" / GPU_OVERRIDES_FILE).read_text()
    table = json.loads(raw)
    return {
        name: GpuFacts(
            gpus=float(entry["gpus"]),
            gpu_devices=int(entry["gpuDevices"]),
            gpu_model=entry["gpuModel"],
            gpu_manufacturer=entry.get("gpuManufacturer"),
            gpu_memory_mib=int(entry["gpuMemoryMiB"]),
            reason=entry.get("reason", ""),
        )
        for name, entry in table["overrides"].items()
    }


def gpu_facts_from_api(raw: Mapping[str, Any]) -> GpuFacts | None:
    """GPU facts as the API states them, partitions included; None when the entry has no GPU."""
    info = raw.get("GpuInfo") or {}
    gpus = info.get("Gpus") or []
    if not gpus:
        return None
    physical = 0.0
    devices = 0
    memory = 0
    for gpu in gpus:
        count = int(gpu.get("Count") or 0)
        logical = int(gpu.get("LogicalGpuCount") or count)
        partition = float(gpu.get("GpuPartitionSize") or 1.0)
        physical += count if count > 0 else logical * partition
        devices += logical
        memory += int((gpu.get("MemoryInfo") or {}).get("SizeInMiB") or 0) * logical
    first = gpus[0]
    return GpuFacts(
        gpus=physical,
        gpu_devices=devices,
        gpu_model=first.get("Name"),
        gpu_manufacturer=first.get("Manufacturer"),
        gpu_memory_mib=int(info.get("TotalGpuMemoryInMiB") or memory),
    )


def _network_limits(network: Mapping[str, Any]) -> tuple[int, int]:
    """(ENIs, IPv4 per ENI) as the VPC CNI sees them: only the default network card's interfaces count."""
    enis = int(network.get("MaximumNetworkInterfaces") or 1)
    default_card = int(network.get("DefaultNetworkCardIndex") or 0)
    for card in network.get("NetworkCards") or []:
        if int(card.get("NetworkCardIndex", -1)) == default_card and card.get("MaximumNetworkInterfaces"):
            enis = int(card["MaximumNetworkInterfaces"])
            break
    return enis, int(network.get("Ipv4AddressesPerInterface") or 1)


def _capacity_types(raw: Mapping[str, Any]) -> tuple[CapacityType, ...]:
    """Reserved always (an On-Demand Capacity Reservation can hold any type), then what the type supports."""
    supported = {_USAGE_CLASSES[c] for c in raw.get("SupportedUsageClasses") or [] if c in _USAGE_CLASSES}
    supported.add("reserved")
    return tuple(c for c in CAPACITY_ORDER if c in supported)


def instance_type_from_api(
    raw: Mapping[str, Any],
    overrides: Mapping[str, GpuFacts],
    prefix_delegation: bool = False,
    on_disagreement: Callable[[str, GpuFacts, GpuFacts], None] | None = None,
) -> InstanceType:
    """One DescribeInstanceTypes entry as the packer sees it, GPU data corrected by `overrides`."""
    name = raw["InstanceType"]
    facts = gpu_facts_from_api(raw)
    override = overrides.get(name)
    if override is not None:
        if facts is not None and facts.gpus > 0 and not _same(facts, override) and on_disagreement is not None:
            on_disagreement(name, facts, override)
        facts = override
    vcpus = int(raw["VCpuInfo"]["DefaultVCpus"])
    enis, ipv4 = _network_limits(raw.get("NetworkInfo") or {})
    architectures = (raw.get("ProcessorInfo") or {}).get("SupportedArchitectures") or ["x86_64"]
    return InstanceType(
        name=name,
        vcpu=vcpus,
        memory_mib=int(raw["MemoryInfo"]["SizeInMiB"]),
        architecture="arm64" if "arm64" in architectures else "x86_64",
        gpus=facts.gpus if facts else 0,
        gpu_devices=facts.gpu_devices if facts else 0,
        gpu_model=facts.gpu_model if facts else None,
        gpu_manufacturer=facts.gpu_manufacturer if facts else None,
        gpu_memory_mib=facts.gpu_memory_mib if facts else 0,
        efa=bool((raw.get("NetworkInfo") or {}).get("EfaSupported")),
        efa_interfaces=int(((raw.get("NetworkInfo") or {}).get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 0),
        max_pods=max_pods(enis, ipv4, vcpus, prefix_delegation),
        capacity_types=_capacity_types(raw),
    )


def _same(api: GpuFacts, table: GpuFacts) -> bool:
    return (
        abs(api.gpus - table.gpus) < 1e-9
        and api.gpu_devices == table.gpu_devices
        and api.gpu_model == table.gpu_model
        and api.gpu_memory_mib == table.gpu_memory_mib
    )

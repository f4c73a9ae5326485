"""Builders for catalog tests: domain models and raw DescribeInstanceTypes entries, with keyword overrides."""

from __future__ import annotations

from typing import Any

from gpu_autoscaler.models.catalog import InstanceType, Offering


def make_instance_type(**overrides: Any) -> InstanceType:
    values: dict[str, Any] = {"name": "g6.xlarge", "vcpu": 4, "memory_mib": 16384, "gpus": 1, "gpu_devices": 1,
                              "gpu_model": "L4", "gpu_manufacturer": "NVIDIA", "gpu_memory_mib": 22888, "max_pods": 58}
    values.update(overrides)
    return InstanceType(**values)


def make_offering(**overrides: Any) -> Offering:
    values: dict[str, Any] = {"instance_type": "g6.xlarge", "zone": "us-east-1a", "capacity_type": "on-demand",
                              "price_per_hour": 0.8048}
    values.update(overrides)
    return Offering(**values)


def make_gpu(**overrides: Any) -> dict[str, Any]:
    """One `GpuInfo.Gpus[]` entry as DescribeInstanceTypes returns it."""
    gpu: dict[str, Any] = {"Name": "L4", "Manufacturer": "NVIDIA", "Count": 1, "LogicalGpuCount": 1,
                           "GpuPartitionSize": 1.0, "MemoryInfo": {"SizeInMiB": 22888}}
    gpu.update(overrides)
    return gpu


def raw_instance_type(
    name: str = "g6.xlarge",
    *,
    gpus: list[dict[str, Any]] | None = None,
    total_gpu_memory: int | None = None,
    vcpus: int = 4,
    memory_mib: int = 16384,
    enis: int = 4,
    ipv4_per_eni: int = 15,
    cards: list[tuple[int, int]] | None = None,
    efa: bool = False,
    architectures: tuple[str, ...] = ("x86_64",),
    usage_classes: tuple[str, ...] = ("on-demand", "spot"),
) -> dict[str, Any]:
    """A DescribeInstanceTypes entry with the fields the adapter reads; `gpus=[]` drops GpuInfo entirely."""
    gpu_list = [make_gpu()] if gpus is None else gpus
    network: dict[str, Any] = {
        "MaximumNetworkInterfaces": enis,
        "Ipv4AddressesPerInterface": ipv4_per_eni,
        "EfaSupported": efa,
        "DefaultNetworkCardIndex": 0,
        "NetworkCards": [
            {"NetworkCardIndex": index, "MaximumNetworkInterfaces": count}
            for index, count in (cards if cards is not None else [(0, enis)])
        ],
    }
    raw: dict[str, Any] = {
        "InstanceType": name,
        "VCpuInfo": {"DefaultVCpus": vcpus},
        "MemoryInfo": {"SizeInMiB": memory_mib},
        "ProcessorInfo": {"SupportedArchitectures": list(architectures)},
        "NetworkInfo": network,
        "SupportedUsageClasses": list(usage_classes),
    }
    if gpu_list:
        total = total_gpu_memory
        if total is None:
            total = sum(g.get("MemoryInfo", {}).get("SizeInMiB", 0) * max(g.get("Count", 0), 1) for g in gpu_list)
        raw["GpuInfo"] = {"Gpus": gpu_list, "TotalGpuMemoryInMiB": total}
    return raw

"""Builders for fleet tests: the example configuration with keyword overrides, claims, a launch context."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.fleet import LaunchContext
from gpu_autoscaler.models.catalog import InstanceType
from gpu_autoscaler.models.claims import NodeClaim
from tests.conftest import example_config_data

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
TEMPLATE = "lt-0abc1234567890def"
CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="

TYPES = {
    "g6.xlarge": InstanceType(name="g6.xlarge", vcpu=4, memory_mib=16384, gpus=1, gpu_devices=1, gpu_model="L4",
                              gpu_manufacturer="NVIDIA", gpu_memory_mib=24576, max_pods=58),
    "g5.xlarge": InstanceType(name="g5.xlarge", vcpu=4, memory_mib=16384, gpus=1, gpu_devices=1, gpu_model="A10G",
                              gpu_manufacturer="NVIDIA", gpu_memory_mib=24576, max_pods=58),
    "g5g.xlarge": InstanceType(name="g5g.xlarge", vcpu=4, memory_mib=8192, architecture="arm64", gpus=1,
                               gpu_devices=1, gpu_model="T4g", gpu_manufacturer="NVIDIA", gpu_memory_mib=16384,
                               max_pods=58),
    "p5.48xlarge": InstanceType(name="p5.48xlarge", vcpu=192, memory_mib=2097152, gpus=8, gpu_devices=8,
                                gpu_model="H100", gpu_manufacturer="NVIDIA", gpu_memory_mib=655360, efa=True,
                                efa_interfaces=32, max_pods=100),
    "p4d.24xlarge": InstanceType(name="p4d.24xlarge", vcpu=96, memory_mib=1179648, gpus=8, gpu_devices=8,
                                 gpu_model="A100", gpu_manufacturer="NVIDIA", gpu_memory_mib=327680, efa=True,
                                 efa_interfaces=4, max_pods=737),
}


def make_config(**changes: Any) -> Config:
    """The example configuration; `changes` replace top-level keys, `pool_<name>` merges into that pool."""
    data = example_config_data()
    data["kubernetes"]["certificateAuthority"] = CA
    data["kubernetes"]["serviceCidr"] = "10.100.0.0/16"
    for key, value in changes.items():
        if key.startswith("pool_"):
            name = key.removeprefix("pool_").replace("_", "-")
            pool = next(p for p in data["nodePools"] if p["name"] == name)
            pool.update(value)
        else:
            data[key] = value
    return parse_config(data)


def make_claim(**changes: Any) -> NodeClaim:
    fields: dict[str, Any] = {
        "cluster": "ml-prod",
        "id": "gpu-burst-a1b2c",
        "pool": "gpu-burst",
        "capacity_type": "spot",
        "zones": ("us-east-1a", "us-east-1b"),
        "instance_types": ("g6.xlarge", "g5.xlarge"),
        "price_per_hour": 0.40,
        "pods": ("pod-1",),
        "created_at": NOW,
    }
    fields.update(changes)
    return NodeClaim(**fields)


def make_gang(size: int = 4, **changes: Any) -> list[NodeClaim]:
    base: dict[str, Any] = {
        "pool": "gpu-reserved", "capacity_type": "on-demand", "zones": ("us-east-1a", "us-east-1b"),
        "instance_types": ("p5.48xlarge", "p4d.24xlarge"), "price_per_hour": 55.04, "gang": "training/train-42",
    }
    base.update(changes)
    return [make_claim(id=f"gpu-reserved-g{i}", pods=(f"train-{i}",), **base) for i in range(size)]


def make_context(config: Config | None = None, *, known: bool = True) -> LaunchContext:
    config = config or make_config()
    return LaunchContext.from_config(config, TEMPLATE, instance_types=TYPES.values() if known else ())

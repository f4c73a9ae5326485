"""Builders for simulator tests: a small catalog of real GPU shapes, configurations and hand-made traces."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.catalog import Catalog
from gpu_autoscaler.models.catalog import InstanceType, Offering
from gpu_autoscaler.simulation.settings import SimulationSettings
from gpu_autoscaler.simulation.trace import Trace, TracePod

if TYPE_CHECKING:
    from pathlib import Path

ZONES = ("us-east-1a", "us-east-1b")
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}

# name: vCPU, memory MiB, GPUs, model, on-demand USD/h, spot USD/h, spot band
TYPES: dict[str, tuple[Any, ...]] = {
    "g4dn.xlarge": (4, 16384, 1, "T4", 0.526, 0.20, 0),
    "g4dn.12xlarge": (48, 196608, 4, "T4", 3.912, 1.60, 0),
    "g5.xlarge": (4, 16384, 1, "A10G", 1.006, 0.45, 0),
    "p4d.24xlarge": (96, 1179648, 8, "A100", 21.96, 7.25, 0),
}


def make_catalog(names: tuple[str, ...] = tuple(TYPES), *, spot: bool = True, band: int | None = None) -> Catalog:
    types, offerings = [], []
    for name in names:
        vcpu, memory, gpus, model, on_demand, spot_price, spot_band = TYPES[name]
        types.append(InstanceType(name=name, vcpu=vcpu, memory_mib=memory, gpus=gpus, gpu_devices=gpus,
                                  gpu_model=model, gpu_manufacturer="NVIDIA", gpu_memory_mib=16384 * gpus,
                                  efa=gpus >= 8, max_pods=58))
        for zone in ZONES:
            offerings.append(Offering(instance_type=name, zone=zone, capacity_type="on-demand",
                                      price_per_hour=on_demand))
            if spot:
                offerings.append(Offering(instance_type=name, zone=zone, capacity_type="spot",
                                          price_per_hour=spot_price,
                                          interruption_band=spot_band if band is None else band))
    return Catalog(types, offerings)


def make_pool(name: str = "gpu", **overrides: Any) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": name, "capacityTypes": ["on-demand"], "taints": [GPU_TAINT], "leadTime": "5m"}
    pool.update(overrides)
    return pool


def make_config(*pools: dict[str, Any], **overrides: Any) -> Config:
    data: dict[str, Any] = {
        "clusterName": "sim-test",
        "region": "us-east-1",
        "kubernetes": {"endpoint": "https://sim.invalid", "certificateAuthority": "LS0tLS1CRUdJTg==",
                       "serviceCidr": "10.100.0.0/16"},
        "network": {"subnets": {z: f"subnet-{i:04x}" for i, z in enumerate(ZONES)}, "securityGroups": ["sg-0001"]},
        "nodeRole": "arn:aws:iam::123456789012:role/sim",
        "ami": {"family": "AL2023", "version": "v1", "x86_64": "ami-0123456789abcdef0"},
        "nodePools": list(pools) or [make_pool()],
    }
    data.update(overrides)
    return parse_config(data)


def make_pod(index: int = 0, *, arrival: float = 0.0, duration: float | None = 3600.0, gpus: int = 1,
             milli: int = 1000, cpu: int = 2000, memory: int = 8192, deleted_at: float | None = None,
             gang: str | None = None, gang_size: int = 0, gpu_names: tuple[str, ...] = ()) -> TracePod:
    return TracePod(index=index, name=f"pod-{index}", arrival=arrival, duration=duration, deleted_at=deleted_at,
                    cpu_milli=cpu, memory_mib=memory, gpus=gpus, gpu_milli=milli, gpu_names=gpu_names, gang=gang,
                    gang_size=gang_size)


def make_trace(*pods: TracePod) -> Trace:
    ordered = sorted(pods, key=lambda p: (p.arrival, p.index))
    return Trace("hand-made.csv", "csv", tuple(ordered), len(ordered))


def settings(**overrides: Any) -> SimulationSettings:
    """No capacity errors unless asked: hand-made traces have exact answers."""
    values: dict[str, Any] = {"insufficient_capacity_rate": 0.0}
    values.update(overrides)
    return SimulationSettings(**values)


MIXED_CONFIG = make_config(
    make_pool(weight=10, capacityTypes=["spot", "on-demand"]),
    make_pool("gpu-shared", weight=1, capacityTypes=["spot", "on-demand"],
              taints=[{"key": "gpu-autoscaler/shared", "value": "true", "effect": "NoSchedule"}],
              gpuSharing={"mode": "time-slicing", "replicas": 4}),
    predictive={"enabled": True, "maxWarmGpus": 4},
)
"""A whole-GPU pool and a 4-replica time-slicing pool with pre-warm on: what the property tests replay."""
MIXED_CATALOG = make_catalog(band=4)

ALIBABA_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
                  "scheduled_time\n")


def write_alibaba(path: Path, rows: list[str]) -> Path:
    path.write_text(ALIBABA_HEADER + "".join(r + "\n" for r in rows))
    return path

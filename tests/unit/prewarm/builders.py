"""Builders for prewarm tests: a small priced catalog, configurations with windows, claims, demand series."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.catalog import Catalog
from gpu_autoscaler.models.catalog import InstanceType, Offering
from gpu_autoscaler.models.claims import ClaimState, NodeClaim

ZONES = ("us-east-1a", "us-east-1b")
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
MONDAY = datetime(2026, 1, 5, tzinfo=UTC)
"""A Monday in winter (New York on EST, UTC−5)."""

# name: vCPU, memory MiB, GPUs, devices, model, on-demand $/h
TYPES: dict[str, tuple[int, int, float, int, str, float]] = {
    "g6.xlarge": (4, 16384, 1, 1, "L4", 0.8048),
    "g6.12xlarge": (48, 196608, 4, 4, "L4", 4.6016),
    "g6.48xlarge": (192, 786432, 8, 8, "L4", 13.3504),
    "g6f.large": (2, 8192, 0.125, 1, "L4", 0.10),
    "p5.48xlarge": (192, 2097152, 8, 8, "H100", 55.04),
}

GPU_MEMORY_MIB = {"L4": 24576, "H100": 81920}
"""Per GPU: an H100's 80 GB, so NVIDIA's MIG table knows it."""

_ids = itertools.count()


def make_type(name: str) -> InstanceType:
    vcpu, memory, gpus, devices, model, _ = TYPES[name]
    return InstanceType(name=name, vcpu=vcpu, memory_mib=memory, gpus=gpus, gpu_devices=devices, gpu_model=model,
                        gpu_manufacturer="NVIDIA", gpu_memory_mib=int(GPU_MEMORY_MIB[model] * max(gpus, 0.125)),
                        max_pods=110)


def make_types() -> list[InstanceType]:
    return [make_type(n) for n in TYPES]


def make_catalog() -> Catalog:
    offerings = [
        Offering(instance_type=name, zone=zone, capacity_type="on-demand", price_per_hour=row[5])
        for name, row in TYPES.items() for zone in ZONES
    ]
    return Catalog(make_types(), offerings)


def make_window(**overrides: Any) -> dict[str, Any]:
    window: dict[str, Any] = {"name": "peak", "schedule": "cron(0 9 ? * MON-FRI *)", "timezone": "America/New_York",
                              "duration": "9h", "nodePool": "gpu", "warm": {"gpus": 8}}
    window.update(overrides)
    return window


def make_pool(name: str = "gpu", **overrides: Any) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": name, "capacityTypes": ["on-demand"], "taints": [GPU_TAINT],
                            "requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In",
                                              "values": ["g6", "g6f"]}]}
    pool.update(overrides)
    return pool


def make_config(*, windows: list[dict[str, Any]] | None = None, pools: list[dict[str, Any]] | None = None,
                **predictive: Any) -> Config:
    data: dict[str, Any] = {
        "clusterName": "test",
        "region": "us-east-1",
        "kubernetes": {"endpoint": "https://test.example.com"},
        "network": {"subnets": {z: f"subnet-{i:04x}" for i, z in enumerate(ZONES)}, "securityGroups": ["sg-0001"]},
        "nodeRole": "arn:aws:iam::123456789012:role/test",
        "ami": {"family": "AL2023", "version": "v1", "x86_64": "ami-0123456789abcdef0"},
        "nodePools": pools if pools is not None else [make_pool()],
        "scalingWindows": windows if windows is not None else [make_window()],
        "predictive": {"enabled": False, "leadTime": "8m", "history": "14d", "quantile": 0.9, "maxWarmGpus": 16,
                       **predictive},
    }
    return parse_config(data)


def make_claim(**overrides: Any) -> NodeClaim:
    values: dict[str, Any] = {
        "cluster": "test", "id": f"nc-{next(_ids)}", "pool": "gpu", "capacity_type": "on-demand",
        "zones": ZONES, "instance_types": ("g6.12xlarge",), "price_per_hour": 4.6016,
        "state": ClaimState.REGISTERED, "created_at": MONDAY - timedelta(days=1),
    }
    values.update(overrides)
    return NodeClaim(**values)


def office_hours_demand(days: int, *, start: datetime = MONDAY, base: float = 2, peak: float = 10,
                        noise: float = 0.0, seed: int = 7) -> np.ndarray:
    """GPUs per 5-minute bucket: `base`, plus `peak` on weekdays 09:00–17:00 UTC, plus Poisson noise."""
    buckets = np.arange(days * 288)
    hour = (buckets % 288) / 12
    weekday = (start.weekday() + buckets // 288) % 7
    busy = (hour >= 9) & (hour < 17) & (weekday < 5)
    demand = base + np.where(busy, peak, 0.0)
    if noise:
        demand = demand + np.random.default_rng(seed).poisson(noise, buckets.size)
    return demand.astype(float)

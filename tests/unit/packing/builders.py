"""Builders for packing tests: a small catalog modelled on real GPU types, pools, pods and claims."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.catalog import Catalog
from gpu_autoscaler.domain.packing import Solver
from gpu_autoscaler.models.catalog import InstanceType, Offering
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.pods import PendingPod

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
ZONES = ("us-east-1a", "us-east-1b")
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

# name: vCPU, memory MiB, GPUs, devices, model, total GPU MiB, EFA, max pods, on-demand $, spot $ (None: no spot)
TYPES: dict[str, tuple[Any, ...]] = {
    "g5.xlarge": (4, 16384, 1, 1, "A10G", 24576, False, 58, 1.006, 0.41),
    "g5.2xlarge": (8, 32768, 1, 1, "A10G", 24576, False, 58, 1.212, 0.51),
    "g5.12xlarge": (48, 196608, 4, 4, "A10G", 98304, True, 234, 5.672, 2.38),
    "g5.48xlarge": (192, 786432, 8, 8, "A10G", 196608, True, 345, 16.288, 4.72),
    "g6.xlarge": (4, 16384, 1, 1, "L4", 24576, False, 58, 0.8048, 0.40),
    "g6f.large": (2, 8192, 0.125, 1, "L4", 2861, False, 20, 0.202, None),
    "p4d.24xlarge": (96, 1179648, 8, 8, "A100", 327680, True, 737, 21.96, 7.25),
    "p4de.24xlarge": (96, 1179648, 8, 8, "A100", 655360, True, 737, 27.45, None),
    "p5.4xlarge": (16, 262144, 1, 1, "H100", 81920, True, 118, 6.88, None),
    "p5.48xlarge": (192, 2097152, 8, 8, "H100", 655360, True, 100, 55.04, 26.42),
}

_uids = itertools.count()


def make_type(name: str) -> InstanceType:
    vcpu, memory, gpus, devices, model, gpu_memory, efa, max_pods, _, _ = TYPES[name]
    return InstanceType(name=name, vcpu=vcpu, memory_mib=memory, gpus=gpus, gpu_devices=devices, gpu_model=model,
                        gpu_manufacturer="NVIDIA", gpu_memory_mib=gpu_memory, efa=efa, max_pods=max_pods)


def make_offerings(names: tuple[str, ...] = tuple(TYPES), zones: tuple[str, ...] = ZONES) -> list[Offering]:
    out = []
    for name in names:
        _, _, _, _, _, _, _, _, on_demand, spot = TYPES[name]
        for i, zone in enumerate(zones):
            out.append(Offering(instance_type=name, zone=zone, capacity_type="on-demand", price_per_hour=on_demand))
            if spot is not None:
                out.append(Offering(instance_type=name, zone=zone, capacity_type="spot",
                                    price_per_hour=round(spot * (1 + 0.1 * i), 4), interruption_band=1))
    return out


def make_catalog(names: tuple[str, ...] = tuple(TYPES), zones: tuple[str, ...] = ZONES,
                 extra: list[Offering] | None = None) -> Catalog:
    return Catalog([make_type(n) for n in names], make_offerings(names, zones) + (extra or []))


def make_pool(name: str = "gpu", **overrides: Any) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": name, "capacityTypes": ["spot", "on-demand"], "taints": [GPU_TAINT]}
    pool.update(overrides)
    return pool


def make_config(*pools: dict[str, Any], **overrides: Any) -> Config:
    data: dict[str, Any] = {
        "clusterName": "test",
        "region": "us-east-1",
        "kubernetes": {"endpoint": "https://test.example.com"},
        "network": {"subnets": {z: f"subnet-{i:04x}" for i, z in enumerate(ZONES)}, "securityGroups": ["sg-0001"]},
        "nodeRole": "arn:aws:iam::123456789012:role/test",
        "ami": {"family": "AL2023", "version": "v1", "x86_64": "ami-0123456789abcdef0"},
        "nodePools": list(pools) or [make_pool()],
    }
    data.update(overrides)
    return parse_config(data)


def make_pod(gpus: int | None = 1, cpu: str = "1", memory: str = "4Gi", tolerate: bool = True,
             **fields: Any) -> PendingPod:
    """A pending pod; `fields` are wire-format keys (`nodeSelector`, `podGroup`, `requests`…) and win."""
    n = next(_uids)
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    data: dict[str, Any] = {"uid": f"pod-{n}", "namespace": "test", "name": f"pod-{n}", "requests": requests}
    if tolerate:
        data["tolerations"] = [TOLERATE_GPU]
    data.update(fields)
    return PendingPod.model_validate(data)


def make_pods(count: int, **kwargs: Any) -> list[PendingPod]:
    return [make_pod(**kwargs) for _ in range(count)]


def make_gang(name: str, size: int, *, min_member: int | None = None, **kwargs: Any) -> list[PendingPod]:
    return [make_pod(podGroup={"name": name, "minMember": min_member or size}, **kwargs) for _ in range(size)]


def make_solver(config: Config | None = None, catalog: Catalog | None = None, **kwargs: Any) -> Solver:
    return Solver(config or make_config(), catalog or make_catalog(), FixedClock(NOW), **kwargs)


def make_claim(**overrides: Any) -> NodeClaim:
    values: dict[str, Any] = {
        "cluster": "test", "id": f"nc-{next(_uids)}", "pool": "gpu", "capacity_type": "on-demand",
        "zones": ("us-east-1a",), "instance_types": ("g5.12xlarge",), "price_per_hour": 5.672,
        "state": ClaimState.PENDING, "created_at": NOW,
    }
    values.update(overrides)
    return NodeClaim(**values)

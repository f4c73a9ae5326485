"""Seeded packing scenarios: realistic bursts of pending GPU pods against realistic node pools.

A burst is a handful of workloads, each many identical replicas (a Deployment, a Job, a gang): 1-GPU
inference, 2/4/8-GPU workers, time-sliced fractional pods, MIG slices, CPU- and memory-heavy GPU pods,
training gangs, and pods pinned by GPU model, zone, capacity type or GPU memory.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.models.pods import PendingPod

__all__ = ["RANDOM_SEED", "THEMES", "Scenario", "pools_config", "random_scenario", "random_scenarios", "scenario",
           "scenarios", "speed_pods"]

ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
SHARED_TAINT = {"key": "gpu-autoscaler/shared", "value": "true", "effect": "NoSchedule"}
MIG_TAINT = {"key": "gpu-autoscaler/mig", "value": "true", "effect": "NoSchedule"}
TRAINING_TAINT = {"key": "training", "value": "true", "effect": "NoSchedule"}
GUARANTEED_TAINT = {"key": "tier", "value": "guaranteed", "effect": "NoSchedule"}


def _tolerate(taint: dict[str, str]) -> dict[str, str]:
    return {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}


POOLS: dict[str, dict[str, Any]] = {
    "training": {
        "name": "training", "weight": 50, "capacityTypes": ["on-demand"], "efa": True,
        "requirements": [{"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["p"]}],
        "taints": [TRAINING_TAINT],
    },
    "guaranteed": {
        "name": "gpu-guaranteed", "weight": 20, "capacityTypes": ["on-demand"],
        "requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In",
                          "values": ["g5", "g6", "g6e", "p4d", "p5"]}],
        "labels": {"tier": "guaranteed"}, "taints": [GPU_TAINT, GUARANTEED_TAINT],
    },
    "burst": {
        "name": "gpu-burst", "weight": 10, "capacityTypes": ["spot", "on-demand"],
        "requirements": [{"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["g", "p"]},
                         {"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["4"]}],
        "taints": [GPU_TAINT],
    },
    "shared": {
        "name": "gpu-shared", "weight": 5, "capacityTypes": ["spot", "on-demand"],
        "requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["g5", "g6", "g6e"]}],
        "taints": [SHARED_TAINT], "gpuSharing": {"mode": "time-slicing", "replicas": 4},
    },
    "mig": {
        "name": "gpu-mig", "weight": 5, "capacityTypes": ["on-demand"],
        "requirements": [{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["a100", "h100"]}],
        "taints": [MIG_TAINT], "gpuSharing": {"mode": "mig", "migProfile": "1g.10gb"},
    },
}


def pools_config(names: tuple[str, ...] = tuple(POOLS), zones: tuple[str, ...] = ZONES, **extra: Any) -> Config:
    data: dict[str, Any] = {
        "clusterName": "bench",
        "region": "us-east-1",
        "kubernetes": {"endpoint": "https://bench.example.com"},
        "network": {"subnets": {z: f"subnet-{i:04x}" for i, z in enumerate(zones)}, "securityGroups": ["sg-0001"]},
        "nodeRole": "arn:aws:iam::123456789012:role/bench",
        "ami": {"family": "AL2023", "version": "v1", "x86_64": "ami-0123456789abcdef0"},
        "nodePools": [POOLS[n] for n in names],
    }
    data.update(extra)
    return parse_config(data)


# Workloads: rng → (pod spec without identity, gang size or None)

Spec = dict[str, Any]


def _inference(rng: random.Random) -> Spec:
    cpu = rng.choice([1, 2, 3, 4, 6, 8])
    memory = rng.choice([4, 8, 12, 16, 24, 32])
    return {"requests": {"cpu": str(cpu), "memory": f"{memory}Gi", "nvidia.com/gpu": "1"},
            "tolerations": [_tolerate(GPU_TAINT)]}


def _multi_gpu(rng: random.Random) -> Spec:
    gpus = rng.choice([2, 4, 8])
    return {"requests": {"cpu": str(gpus * rng.choice([2, 4, 8, 10])), "memory": f"{gpus * rng.choice([16, 32, 48])}Gi",
                         "nvidia.com/gpu": str(gpus)}, "tolerations": [_tolerate(GPU_TAINT)]}


def _cpu_heavy(rng: random.Random) -> Spec:
    return {"requests": {"cpu": str(rng.choice([14, 24, 30, 44])), "memory": f"{rng.choice([32, 64])}Gi",
                         "nvidia.com/gpu": "1"}, "tolerations": [_tolerate(GPU_TAINT)]}


def _memory_heavy(rng: random.Random) -> Spec:
    return {"requests": {"cpu": str(rng.choice([4, 8])), "memory": f"{rng.choice([100, 160, 220, 350])}Gi",
                         "nvidia.com/gpu": "1"}, "tolerations": [_tolerate(GPU_TAINT)]}


def _fractional(rng: random.Random) -> Spec:
    return {"requests": {"cpu": rng.choice(["500m", "1", "2", "3"]), "memory": f"{rng.choice([2, 4, 6, 8])}Gi",
                         "nvidia.com/gpu": "1"}, "tolerations": [_tolerate(SHARED_TAINT)]}


def _mig(rng: random.Random) -> Spec:
    return {"requests": {"cpu": str(rng.choice([1, 2, 4])), "memory": f"{rng.choice([8, 16, 24])}Gi",
                         "nvidia.com/mig-1g.10gb": str(rng.choice([1, 1, 2]))}, "tolerations": [_tolerate(MIG_TAINT)]}


def _constrained(rng: random.Random) -> Spec:
    spec = _inference(rng)
    choice = rng.randrange(6)
    if choice == 0:
        spec["nodeSelector"] = {"karpenter.k8s.aws/instance-gpu-name": rng.choice(["l4", "a10g", "l40s"])}
    elif choice == 1:
        spec["requiredNodeAffinity"] = [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [rng.choice(ZONES)]}]}]
    elif choice == 2:
        spec["nodeSelector"] = {"karpenter.sh/capacity-type": "on-demand"}
    elif choice == 3:
        spec["requiredNodeAffinity"] = [{"matchExpressions": [
            {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Gt", "values": ["30000"]}]}]
    elif choice == 4:
        spec["requiredNodeAffinity"] = [{"matchExpressions": [
            {"key": "karpenter.k8s.aws/instance-family", "operator": "NotIn", "values": ["g6", "gr6"]},
            {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["us-east-1c"]}]}]
    else:
        spec["nodeSelector"] = {"tier": "guaranteed"}
        spec["tolerations"] = [*spec["tolerations"], _tolerate(GUARANTEED_TAINT)]
    return spec


def _gang(rng: random.Random) -> Spec:
    gpus = rng.choice([2, 4, 8, 8])
    spec = {"requests": {"cpu": str(gpus * rng.choice([4, 8, 10])), "memory": f"{gpus * rng.choice([32, 64])}Gi",
                         "nvidia.com/gpu": str(gpus)},
            "tolerations": [_tolerate(GPU_TAINT), _tolerate(TRAINING_TAINT)]}
    return spec


WORKLOADS = {
    "inference": _inference, "multi-gpu": _multi_gpu, "cpu-heavy": _cpu_heavy, "memory-heavy": _memory_heavy,
    "fractional": _fractional, "mig": _mig, "constrained": _constrained, "gang": _gang,
}

THEMES: dict[str, dict[str, float]] = {
    "inference": {"inference": 4, "cpu-heavy": 1, "memory-heavy": 1},
    "multi-gpu": {"multi-gpu": 3, "inference": 1},
    "fractional": {"fractional": 3, "inference": 1},
    "mig": {"mig": 3, "inference": 1},
    "gangs": {"gang": 2, "inference": 1, "multi-gpu": 1},
    "constrained": {"constrained": 4, "inference": 1},
    "mixed": dict.fromkeys(WORKLOADS, 1.0),
}


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    theme: str
    config: Config
    pods: tuple[PendingPod, ...]

    @property
    def size(self) -> int:
        return len(self.pods)


def _pods_for(rng: random.Random, theme: str, size: int, prefix: str, mean_replicas: float | None = None,
              ) -> list[PendingPod]:
    weights = THEMES[theme]
    names = list(weights)
    pods: list[PendingPod] = []
    workload = 0
    while len(pods) < size:
        kind = rng.choices(names, [weights[n] for n in names])[0]
        spec = WORKLOADS[kind](rng)
        if kind == "gang":
            members = rng.choice([2, 4, 8, 16])
            spec["podGroup"] = {"name": f"job-{workload}", "minMember": members}
            replicas = members
        else:
            mean = mean_replicas if mean_replicas is not None else max(size / 4, 2)
            replicas = max(1, min(size - len(pods), int(rng.expovariate(1 / mean)) + 1))
        for r in range(replicas):
            pods.append(PendingPod.model_validate({
                **spec, "uid": f"{prefix}-{workload}-{r}", "namespace": "bench", "name": f"{kind}-{workload}-{r}",
            }))
        workload += 1
    return pods


SIZES = (20, 35, 50, 80, 100, 120, 150, 200, 250, 300, 400, 500)


def scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    theme = list(THEMES)[seed % len(THEMES)]
    size = SIZES[seed % len(SIZES)]
    pods = tuple(_pods_for(rng, theme, size, f"s{seed}"))
    return Scenario(f"s{seed:02d}-{theme}-{size}", seed, theme, pools_config(), pods)


def scenarios(count: int = 24) -> list[Scenario]:
    return [scenario(seed) for seed in range(count)]


def speed_pods(count: int, seed: int = 7, mean_replicas: float = 20.0) -> list[PendingPod]:
    """A large burst in the mixed theme: workloads of about `mean_replicas` replicas each (exponential)."""
    return _pods_for(random.Random(seed), "mixed", count, f"p{count}", mean_replicas)


# Randomised scenarios: the worst case found here before a user finds it

RANDOM_SEED = 1000
"""First seed of the default randomised scenarios (`--random N --seed S` plays seeds S … S + N − 1)."""
ALL_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f")
WIDE_POOL: dict[str, Any] = {
    "name": "gpu-any", "weight": 10, "capacityTypes": ["spot", "on-demand"],
    "requirements": [{"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["g", "p"]}],
    "taints": [GPU_TAINT],
}
"""Every GPU type of the region (older generations included), for the randomised scenarios."""
GPU_NAMES = ("t4", "a10g", "l4", "l40s", "a100", "h100", "rtx-pro-server-6000")
_GPUS = (1, 1, 1, 1, 2, 2, 4, 4, 8)
_CPU_PER_GPU = ("500m", "1", "2", "3", "4", "6", "8", "12", "16", "24")
_MEMORY_PER_GPU = (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 180)


def _cpu(per_gpu: str, gpus: int) -> str:
    return f"{int(per_gpu[:-1]) * gpus}m" if per_gpu.endswith("m") else str(int(per_gpu) * gpus)


def _random_class(rng: random.Random, shared: bool) -> Spec:
    """One workload: 1/2/4/8 GPUs (or a time-sliced share), CPU and memory drawn per GPU, maybe pinned by GPU."""
    if shared and rng.random() < 0.3:
        spec: Spec = {"requests": {"cpu": rng.choice(["250m", "500m", "1", "2", "4"]),
                                   "memory": f"{rng.choice([1, 2, 4, 8, 16])}Gi", "nvidia.com/gpu": "1"},
                      "tolerations": [_tolerate(SHARED_TAINT)]}
    else:
        gpus = rng.choice(_GPUS)
        spec = {"requests": {"cpu": _cpu(rng.choice(_CPU_PER_GPU), gpus),
                             "memory": f"{rng.choice(_MEMORY_PER_GPU) * gpus}Gi", "nvidia.com/gpu": str(gpus)},
                "tolerations": [_tolerate(GPU_TAINT)]}
    pin = rng.random()
    if pin < 0.2:
        spec["nodeSelector"] = {"karpenter.k8s.aws/instance-gpu-name": rng.choice(GPU_NAMES)}
    elif pin < 0.35:
        spec["requiredNodeAffinity"] = [{"matchExpressions": [
            {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In",
             "values": sorted(rng.sample(GPU_NAMES, rng.choice([2, 3])))}]}]
    elif pin < 0.42:
        # GPU memory: says how much GPU is enough, so fractional-GPU types are open to it.
        spec["requiredNodeAffinity"] = [{"matchExpressions": [
            {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Gt",
             "values": [str(rng.choice([2000, 10000, 20000, 40000]))]}]}]
    elif pin < 0.47:
        spec["nodeSelector"] = {"karpenter.sh/capacity-type": "on-demand"}
    return spec


def random_scenario(seed: int) -> Scenario:
    """A fresh burst over the whole us-east-1 catalog: 3–10 workloads drawn at random, one to three pools.

    Replay one with `packing-quality --scenarios 0 --random 1 --seed SEED`.
    """
    rng = random.Random(seed)
    main = rng.choice(["burst", "wide"])
    names = [main] + [n for n in ("shared", "guaranteed") if rng.random() < 0.4]
    pools = [WIDE_POOL if n == "wide" else POOLS[n] for n in names]
    shared = "shared" in names
    pods: list[PendingPod] = []
    for workload in range(rng.randint(3, 10)):
        spec = _random_class(rng, shared)
        if "guaranteed" in names and rng.random() < 0.2:
            spec["nodeSelector"] = {**spec.get("nodeSelector", {}), "tier": "guaranteed"}
            spec["tolerations"] = [*spec["tolerations"], _tolerate(GUARANTEED_TAINT)]
        replicas = min(int(rng.expovariate(1 / 15)) + 1, 80)
        pods.extend(PendingPod.model_validate({**spec, "uid": f"r{seed}-{workload}-{r}", "namespace": "bench",
                                               "name": f"w{workload}-{r}"}) for r in range(replicas))
    config = pools_config(zones=ALL_ZONES, nodePools=pools)
    return Scenario(f"r{seed}-{'+'.join(names)}-{len(pods)}", seed, "random", config, tuple(pods))


def random_scenarios(count: int, seed: int = RANDOM_SEED) -> list[Scenario]:
    return [random_scenario(seed + i) for i in range(count)]

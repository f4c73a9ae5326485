"""Pod shapes for pre-warm: warm headroom in whole pods of the sizes that arrive, not a GPU total.

A warm GPU helps only a pod that fits the node around it: a g4dn.xlarge held for the forecast is useless to
a pod asking for one GPU and 16 vCPU. So the packer records, beside each pool's GPU demand, the pending GPUs
of each *shape class* (its own demand series, `<pool>/<class>`), and pre-warm forecasts each class and
shapes its placeholder pods like the classes that come, so the packer picks the types those pods need.

A class is the pod's GPUs (devices it asks for, in the pool's terms: time-sliced replicas count as
devices) and its *tier*: the first rung of `LADDER` (vCPU and GiB per physical GPU, AWS's size ladder of
4 vCPU : 16 GiB per step, less what kubelet and the system reserve — `CPU_ROOM`, `MEMORY_ROOM`) that holds
the pod's CPU and memory per GPU. The placeholder of a class asks for exactly its rung (times its GPUs),
so a warm node that holds the placeholder holds every pod of the class. The classes of a pool are a fixed,
small set (`classes`), so pre-warm reads them without any index of what was recorded. Pods beyond the
ladder, MIG and DRA pods have no class: they count in the pool's total only.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.packing.fit import gpu_equivalent
from gpu_autoscaler.models.resources import CPU, GPU, MEMORY

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpu_autoscaler.config import NodePool

__all__ = ["DEVICE_CLASSES", "LADDER", "SEPARATOR", "class_devices", "classes", "placeholder_requests",
           "series_key", "shape_class", "split_gpus", "whole_pods"]

SEPARATOR = "/"
"""Between the pool and the class in a shape series' key (`gpu/1d-t2`); pool names cannot hold it."""
_GIB = 1024**3
LADDER = ((4, 16), (8, 32), (16, 64), (32, 128), (48, 192), (64, 256), (96, 384))
"""Rungs: (vCPU, GiB) per physical GPU — xlarge, 2xlarge, 4xlarge, 8xlarge, 12xlarge, 16xlarge, 24xlarge."""
CPU_ROOM = 0.9
MEMORY_ROOM = 0.8
"""What of a rung a pod may ask for: allocatable is capacity less kubelet, system and eviction reservations
(93–99 % of the vCPUs; 81–97 % of the memory, the least on a 16 GiB type allowing 110 pods)."""
_EPS = 1e-9
"""A forecast this close under a whole number of pods is that many pods (float arithmetic, not demand)."""
DEVICE_CLASSES = (1, 2, 4, 8)
"""Devices per pod, rounded up to one of these: a 3-GPU pod is warmed for as a 4-GPU one."""


def _rung(index: int) -> tuple[int, int]:
    cpu, gib = LADDER[index]
    return int(cpu * 1000 * CPU_ROOM), int(gib * _GIB * MEMORY_ROOM)


def _devices_per_pod(pool: NodePool) -> tuple[int, ...]:
    if pool.gpu_sharing.mode == "time-slicing":
        return tuple(d for d in DEVICE_CLASSES if d <= max(1, pool.gpu_sharing.replicas)) or (1,)
    return DEVICE_CLASSES


def classes(pool: NodePool) -> list[str]:
    """Every class a pod in this pool may have (none in a MIG pool)."""
    if pool.gpu_sharing.mode == "mig":
        return []
    return list(_classes(_devices_per_pod(pool)))


@functools.lru_cache(maxsize=16)
def _classes(devices: tuple[int, ...]) -> tuple[str, ...]:
    """The class names for these device counts: built once (pre-warm asks for every pool's on every tick)."""
    return tuple(f"{d}d-t{t}" for d in devices for t in range(len(LADDER)))


def series_key(pool: str, cls: str) -> str:
    return f"{pool}{SEPARATOR}{cls}"


def class_devices(cls: str) -> int:
    return int(cls.split("d-", 1)[0])


def shape_class(requests: Mapping[str, int], pool: NodePool) -> str | None:
    """The pod's class in this pool, from its canonical requests (millicores, bytes, devices); None if it has
    none (no `nvidia.com/gpu` devices, a MIG pool, more CPU or memory per GPU than the ladder holds)."""
    devices = requests.get(GPU, 0)
    if devices <= 0 or pool.gpu_sharing.mode == "mig":
        return None
    allowed = _devices_per_pod(pool)
    rounded = next((d for d in allowed if d >= devices), None)
    if rounded is None:
        return None
    gpus = gpu_equivalent({GPU: devices}, pool)
    cpu, memory = requests.get(CPU, 0) / gpus, requests.get(MEMORY, 0) / gpus
    for tier in range(len(LADDER)):
        rung_cpu, rung_memory = _rung(tier)
        if cpu <= rung_cpu and memory <= rung_memory:
            return f"{rounded}d-t{tier}"
    return None


def placeholder_requests(cls: str, pool: NodePool) -> dict[str, str]:
    """What a placeholder pod of the class asks for: its devices and its rung's CPU and memory for them."""
    devices = class_devices(cls)
    tier = int(cls.rsplit("-t", 1)[1])
    gpus = gpu_equivalent({GPU: devices}, pool)
    cpu, memory = _rung(tier)
    return {GPU: str(devices), CPU: f"{math.floor(cpu * gpus)}m", MEMORY: str(math.floor(memory * gpus))}


def split_gpus(gpus: int, weights: Iterable[tuple[str, float]], pool: NodePool) -> list[tuple[str, int]]:
    """`gpus` physical GPUs as whole pods of the classes, in proportion to their weights (largest remainder
    first; a class gets a pod only while its GPUs fit what is left, so a few GPUs may stay unasked for). Pairs
    (class, pods), heaviest first."""
    positive = sorted(((c, w) for c, w in weights if w > 0), key=lambda cw: (-cw[1], cw[0]))
    total = sum(w for _, w in positive)
    if gpus <= 0 or total <= 0:
        return []
    size = {c: gpu_equivalent({GPU: class_devices(c)}, pool) for c, _ in positive}
    counts = {c: int(gpus * w / total / size[c]) for c, w in positive}
    left = gpus - sum(counts[c] * size[c] for c, _ in positive)
    by_remainder = sorted(positive, key=lambda cw: -(gpus * cw[1] / total / size[cw[0]] - counts[cw[0]]))
    for c, _ in by_remainder:
        if size[c] <= left + 1e-9:
            counts[c] += 1
            left -= size[c]
    return [(c, counts[c]) for c, _ in positive if counts[c] > 0]


def whole_pods(forecasts: Mapping[str, float], pool: NodePool) -> dict[str, float]:
    """Each class's forecast GPUs as whole pods of the class, rounded down, in GPUs; classes forecast under one
    pod are left out. A warm node pays only for the pods that come to it, and a forecast under one pod is not
    one: a fifth of a pod is one pod pending in one bucket of the recent level, and 0.75 of a pod is the
    forecast's blend (`Forecaster.weekday_share`) of one pod pending at this time on a past same weekday with
    too few on all past days to reach the quantile. Rounded to the nearest, 379 of the 617 warm nodes `ours`
    bought on the default Alibaba trace came from exactly 0.75 of a pod, and 247 of those never held a pod;
    rounded down, the replays cost 2.3 % less with 10 % fewer launches (three traces, seeds 0-2;
    docs/economics-rounds.md, "What the seventh round found"), at 0.3 % of the pods run."""
    out: dict[str, float] = {}
    for cls, gpus in forecasts.items():
        size = gpu_equivalent({GPU: class_devices(cls)}, pool)
        pods = math.floor(gpus / size + _EPS) if size > 0 else 0
        if pods > 0:
            out[cls] = pods * size
    return out

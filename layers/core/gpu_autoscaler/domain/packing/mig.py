"""MIG: how many slices of each profile one GPU gives, by GPU model and memory.

A node pool in `mig` mode partitions every GPU of its nodes into one profile (the device plugin's
single-profile layout), so a node advertises `nvidia.com/mig-<profile>` = GPUs × slices per GPU. The
counts are NVIDIA's supported-profile tables for each data-centre GPU (MIG user guide); a GPU that is not
here does not support MIG (A10G, L4, L40S, T4, V100 …), and its nodes keep advertising whole GPUs.

The same GPU name comes in several memory sizes with different profile names (an A100 40 GB slices into
`1g.5gb`, an 80 GB one into `1g.10gb`), so a model is matched by name and by memory per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.models.catalog import InstanceType

__all__ = ["MIG_GPUS", "MigGpu", "compute_share", "first_offering", "mig_gpu", "mig_slices"]


@dataclass(frozen=True)
class MigGpu:
    model: str
    memory_gib: int
    """Nominal memory of one GPU."""
    profiles: Mapping[str, int]
    """Profile → instances of that profile one GPU holds when partitioned into that profile alone."""


def _gpu(model: str, memory_gib: int, profiles: dict[str, int]) -> MigGpu:
    return MigGpu(model, memory_gib, MappingProxyType(profiles))


MIG_GPUS: tuple[MigGpu, ...] = (
    _gpu("A30", 24, {"1g.6gb": 4, "1g.6gb+me": 1, "2g.12gb": 2, "2g.12gb+me": 1, "4g.24gb": 1}),
    _gpu("A100", 40, {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1,
                      "7g.40gb": 1}),
    _gpu("A100", 80, {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1,
                      "7g.80gb": 1}),
    _gpu("H100", 80, {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1,
                      "7g.80gb": 1}),
    _gpu("H100", 94, {"1g.12gb": 7, "1g.12gb+me": 1, "1g.24gb": 4, "2g.24gb": 3, "3g.47gb": 2, "4g.47gb": 1,
                      "7g.94gb": 1}),
    _gpu("H200", 141, {"1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1,
                       "7g.141gb": 1}),
    _gpu("B200", 180, {"1g.23gb": 7, "1g.23gb+me": 1, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1,
                       "7g.180gb": 1}),
)

_MIB_PER_GIB = 1024
_MEMORY_TOLERANCE = 0.1
"""Catalog memory figures differ from the nominal size by a few percent (an H200 shows 144,384 MiB)."""


def mig_gpu(model: str | None, memory_mib_per_gpu: float) -> MigGpu | None:
    """The MIG table entry for a GPU, or None when it does not support MIG."""
    if not model:
        return None
    name = model.upper()
    best: MigGpu | None = None
    for gpu in MIG_GPUS:
        if gpu.model != name:
            continue
        nominal = gpu.memory_gib * _MIB_PER_GIB
        if abs(memory_mib_per_gpu - nominal) <= _MEMORY_TOLERANCE * nominal and (
            best is None or abs(memory_mib_per_gpu - nominal) < abs(memory_mib_per_gpu - best.memory_gib * 1024)
        ):
            best = gpu
    return best


def mig_slices(instance_type: InstanceType, profile: str) -> int:
    """`nvidia.com/mig-<profile>` a node of this type advertises when its GPUs are partitioned into `profile`.

    Zero when the type's GPU does not support MIG or has no such profile; partitioned types (g6f) never do.
    """
    whole = int(instance_type.gpus) if float(instance_type.gpus).is_integer() else 0
    if whole <= 0:
        return 0
    gpu = mig_gpu(instance_type.gpu_model, instance_type.gpu_memory_mib / whole)
    if gpu is None:
        return 0
    return whole * gpu.profiles.get(profile, 0)


def _compute(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 1


_FIRST = {profile: gpu for gpu in reversed(MIG_GPUS) for profile in gpu.profiles}
"""Profile → the first GPU in the table that offers it: the profile names say which GPU (an A30's are its own; the
names GPUs share are all of seven-slice GPUs, though `1g.10gb` is four slices of an A100 40 GB and seven of an H100)."""


def first_offering(profile: str) -> MigGpu | None:
    """The first GPU in NVIDIA's table that offers `profile`: what the profile alone says of its GPU."""
    return _FIRST.get(profile)


def compute_share(profile: str) -> float:
    """The share of a GPU's compute one slice of `profile` is: `3g.40gb` is 3/7 of an H100, `2g.12gb` 2/4 of an
    A30 (7 for a profile the table does not know, as every MIG GPU but the A30 has)."""
    gpu = _FIRST.get(profile)
    return _compute(profile) / (max(_compute(p) for p in gpu.profiles) if gpu is not None else 7)

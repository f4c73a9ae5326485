"""Kubernetes resource quantities and resource vectors.

Quantities arrive as the strings Kubernetes uses (`500m`, `64Gi`, `1e3`), because the agent
copies them straight from the Pod. Inside, every resource is an integer in a canonical unit
(millicores for cpu, bytes for memory and storage, a count for everything else), so fits
and sums are exact and fast.
"""

from __future__ import annotations

import math
import re
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from decimal import Decimal, InvalidOperation

__all__ = [
    "CPU",
    "DRA_GPU",
    "DRA_PREFIX",
    "EFA",
    "NVIDIA_GPU_CLASS",
    "EPHEMERAL_STORAGE",
    "GPU",
    "HUGEPAGES_2MI",
    "MEMORY",
    "PODS",
    "QUANTITY_CEILING",
    "Resources",
    "is_gpu_resource",
    "mig_profile",
    "mig_resource",
    "parse_quantity",
]

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"
GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
DRA_PREFIX = "resource.k8s.io/"
"""How the packer names devices a pod asks for through DRA claims: `resource.k8s.io/<device class>`."""
NVIDIA_GPU_CLASS = "gpu.nvidia.com"
"""The NVIDIA DRA driver's DeviceClass of whole GPUs (one device per GPU)."""
DRA_GPU = DRA_PREFIX + NVIDIA_GPU_CLASS
EFA = "vpc.amazonaws.com/efa"
"""What the EFA device plugin advertises, one per EFA interface of the node (EKS User Guide, ml/node-efa.adoc)."""
HUGEPAGES_2MI = "hugepages-2Mi"
"""The kubelet's name for the node's pre-allocated 2 MiB huge pages, in bytes (kubernetes.io, "Manage HugePages")."""

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity string into its exact decimal value."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return Decimal(str(text))
    if not isinstance(text, str):
        raise ValueError(f"quantity must be a string, got {text!r}")
    raw = text.strip()
    if not raw:
        raise ValueError("empty quantity")
    for suffix, factor in _BINARY.items():
        if raw.endswith(suffix):
            return _number(raw[: -len(suffix)], text) * factor
    if raw[-1] in _DECIMAL and raw[-1] != "" and not raw[-1].isdigit():
        return _number(raw[:-1], text) * _DECIMAL[raw[-1]]
    return _number(raw, text)


def _number(digits: str, original: str) -> Decimal:
    try:
        value = Decimal(digits)
    except InvalidOperation:
        raise ValueError(f"'{original}' is not a Kubernetes quantity") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"'{original}' is not a non-negative Kubernetes quantity")
    return value


def is_gpu_resource(name: str) -> bool:
    """GPU devices the autoscaler provisions for: whole GPUs and MIG slices."""
    return name == GPU or name.startswith(MIG_PREFIX)


def mig_resource(profile: str) -> str:
    """The extended resource a MIG slice of `profile` is advertised as with the device plugin's `mixed` strategy.

    The plugin names it `mig-<profile>` with every `+` turned into `.` (k8s-device-plugin internal/rm/rm.go,
    AddDefaultResourcesToConfig): `1g.10gb+me` is `nvidia.com/mig-1g.10gb.me`, as `+` is not allowed in a
    Kubernetes resource name. Everything that names a slice goes through here, so the packer plans the name a
    node advertises and pods ask for.
    """
    return MIG_PREFIX + profile.replace("+", ".")


_MIG_NAME = re.compile(r"((?:\d+c\.)?\d+g\.\d+gb)\.(.+)")
"""A profile is `[<c>c.]<g>g.<gb>gb` with optional `+attributes` (go-nvlib MigProfileInfo.String): in a resource
name, whatever follows the memory size after a `.` was an attribute."""


def mig_profile(name: str) -> str | None:
    """The MIG profile a `nvidia.com/mig-…` resource is a slice of (`mig-1g.10gb.me` → `1g.10gb+me`), the inverse of
    `mig_resource`; None for any other resource."""
    if not name.startswith(MIG_PREFIX):
        return None
    text = name.removeprefix(MIG_PREFIX)
    attributed = _MIG_NAME.fullmatch(text)
    return f"{attributed[1]}+{attributed[2]}" if attributed else text


QUANTITY_CEILING = 2**46
"""Where a canonical quantity is held: no node holds as much of anything (64 TiB of memory or storage, 2^46
millicores; the largest EC2 instance has 32 TiB of memory and an EBS volume at most 64 TiB). kube-apiserver bounds a
request only from below (pkg/apis/core/validation `ValidateResourceQuantityValue`: non-negative, whole for integer
resources), so any pod may ask for `memory: 10E`, beyond the int64 the packer's arrays hold. Held here, such a request
fits no offering, its pending pod is reported with it (`PendingPod.beyond_any_node`), and a hundred thousand of them
still sum within an int64."""


def _canonical(name: str, value: Decimal) -> int:
    """Millicores for cpu, whole units (rounded up) for everything else; at most `QUANTITY_CEILING`."""
    return min(math.ceil(value * 1000) if name == CPU else math.ceil(value), QUANTITY_CEILING)


_PARSED: dict[tuple[str, str], int] = {}
_PARSED_LIMIT = 4096
"""A burst of pending pods is mostly replicas asking for the same few quantities: ten thousand pods parse
a few dozen distinct strings, so each is parsed once (up to this many kept)."""


def _canonical_quantity(name: str, quantity: str | int | float) -> int:
    if not isinstance(quantity, str):
        return _canonical(name, parse_quantity(quantity))
    key = (name, quantity)
    found = _PARSED.get(key)
    if found is None:
        found = _canonical(name, parse_quantity(quantity))
        if len(_PARSED) < _PARSED_LIMIT:
            _PARSED[key] = found
    return found


class Resources(Mapping[str, int]):
    """An immutable vector of resources in canonical integer units; missing means zero."""

    __slots__ = ("_hash", "_values")

    def __init__(self, values: Mapping[str, int] | None = None) -> None:
        self._values: dict[str, int] = {k: int(v) for k, v in (values or {}).items() if v}
        self._hash: int | None = None

    def __reduce__(self) -> tuple[type[Resources], tuple[dict[str, int]]]:
        """Pickled as its values: the kept hash is of this process's string hashes."""
        return Resources, (self._values,)

    @classmethod
    def from_quantities(cls, quantities: Mapping[str, str | int | float]) -> Resources:
        """From a Pod's `requests` map of quantity strings."""
        return cls({name: _canonical_quantity(name, q) for name, q in quantities.items()})

    def __getitem__(self, key: str) -> int:
        return self._values.get(key, 0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    # The Mapping mixins' answers, read off the dict instead of key by key through `__getitem__`: the packer and
    # the fit checks read requests millions of times a replay. `get` answers 0 for a missing key whatever the
    # default, as the mixin does (it asks `__getitem__`, which never raises); `in` is left to the mixin.

    def get(self, key: str, default: object = None) -> int:
        return self._values.get(key, 0)

    def keys(self) -> KeysView[str]:
        return self._values.keys()

    def items(self) -> ItemsView[str, int]:
        return self._values.items()

    def values(self) -> ValuesView[int]:
        return self._values.values()

    def __add__(self, other: Mapping[str, int]) -> Resources:
        out = dict(self._values)
        for k, v in other.items():
            out[k] = out.get(k, 0) + v
        return Resources(out)

    def __sub__(self, other: Mapping[str, int]) -> Resources:
        out = dict(self._values)
        for k, v in other.items():
            out[k] = out.get(k, 0) - v
        return Resources(out)

    def __mul__(self, factor: int) -> Resources:
        return Resources({k: v * factor for k, v in self._values.items()})

    def __eq__(self, other: object) -> bool:
        if type(other) is Resources:
            return self._values == other._values
        if isinstance(other, Mapping):
            return self._values == {k: v for k, v in other.items() if v}
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._values.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"Resources({self._values!r})"

    def fits_in(self, capacity: Mapping[str, int]) -> bool:
        """Every requested resource is within capacity (a resource absent from capacity is zero)."""
        return all(v <= capacity.get(k, 0) for k, v in self._values.items())

    def shortfall(self, capacity: Mapping[str, int]) -> list[str]:
        """The names of the resources that do not fit, for reasons a person reads."""
        return [k for k, v in self._values.items() if v > capacity.get(k, 0)]

    @property
    def gpus(self) -> int:
        return self[GPU]

    def as_dict(self) -> dict[str, int]:
        return dict(self._values)

"""Who may be given a fractional-GPU instance (g6f, gr6f: one device that is 1/8, 1/4 or 1/2 of an L4).

The device plugin advertises such a partition as one `nvidia.com/gpu`, so by resources alone a pod asking for
one GPU fits it — and gets an eighth of the GPU it expected. EC2 exposes these types with `GpuPartitionSize`
below 1 and `LogicalGpuCount` 1 in `DescribeInstanceTypes` GpuInfo (aws/karpenter-provider-aws#8324 and
#8368: Karpenter handed them to whole-GPU pods the same way, and proposed an opt-in label). So by default a
fractional type serves only pods or pools that ask for one:

- a pod that selects (nodeSelector or required node affinity) on the fraction label or on GPU memory — it
  has said how much GPU it needs — or names a fractional family or type with `In`;
- a pool whose requirements do the same: every pod it places may then go to a fraction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.models import labels as L

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable

    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.models.requirements import NodeSelectorTerm, Requirement

__all__ = ["OPT_IN_KEYS", "FractionalTypes"]

OPT_IN_KEYS = frozenset({L.INSTANCE_GPU_FRACTION, L.INSTANCE_GPU_MEMORY})
"""Selecting on either says how much GPU is enough, so a fraction that satisfies it is what was asked for."""


class FractionalTypes:
    """The catalog's partitioned types, and whether a selector or a pool asks for them."""

    def __init__(self, types: Iterable[InstanceType]) -> None:
        partitioned = [t for t in types if t.partitioned]
        self.names: frozenset[str] = frozenset(t.name for t in partitioned)
        self.families: frozenset[str] = frozenset(t.family for t in partitioned)

    def __bool__(self) -> bool:
        return bool(self.names)

    def _asks(self, key: str, operator: str, values: Collection[str]) -> bool:
        if key in OPT_IN_KEYS:
            return True
        if operator != "In":
            return False
        if key == L.INSTANCE_TYPE:
            return any(v in self.names for v in values)
        if key == L.INSTANCE_FAMILY:
            return any(v in self.families for v in values)
        return False

    def requirements_ask(self, requirements: Iterable[Requirement]) -> bool:
        return any(self._asks(r.key, r.operator, r.values) for r in requirements)

    def selector_asks(self, node_selector: Iterable[tuple[str, str]], affinity: Iterable[NodeSelectorTerm]) -> bool:
        """A pod's selector asks for a fraction when its node selector does, or every affinity term does."""
        if any(self._asks(k, "In", (v,)) for k, v in node_selector):
            return True
        terms = list(affinity)
        return bool(terms) and all(self.requirements_ask(t.match_expressions) for t in terms)

    def describe(self) -> str:
        return ", ".join(sorted(self.families))

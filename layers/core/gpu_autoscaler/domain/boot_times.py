"""Measured boot times: when a node's boot counts as a sample, and a pool's lead time from its samples.

A pool's lead time is how early warm capacity must be asked for (pre-warm's forecast target, and windows
warmed from start − lead time). The configuration's `leadTime` is a guess; once the pool has
`measuredLeadTime.minSamples` boots recorded (launch → GPUs allocatable, within `history`), their
`quantile` (p90 by default) replaces it. Pure: samples in, `LeadTime` out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from gpu_autoscaler.models.boot import BootSample
from gpu_autoscaler.models.resources import is_gpu_resource

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from gpu_autoscaler.config import MeasuredLeadTime, NodePool
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.cluster import ClusterNode

__all__ = ["BOOT_ATTRIBUTE", "MAX_BOOT", "LeadTime", "lead_time", "lead_time_of", "observe_boot", "quantile"]

BOOT_ATTRIBUTE = "bootSeconds"
"""NodeClaim attribute: launch → GPUs allocatable of its node, in seconds, recorded once, when the reconcile step
first sees it initialized (so a claim with it and no `initializedAt` is one from before that was recorded)."""
MAX_BOOT = timedelta(hours=1)
"""GPUs first seen later than this after launch are not a boot time (a claim registered before boot times were
recorded, a device plugin installed long after): no sample."""


def observe_boot(claim: NodeClaim, node: ClusterNode, launched_at: datetime, now: datetime) -> BootSample | None:
    """The claim's boot sample if its node is Ready with GPUs allocatable now, else None (not yet)."""
    if not node.ready or not any(is_gpu_resource(name) and count > 0 for name, count in node.allocatable.items()):
        return None
    if now - launched_at > MAX_BOOT or now < launched_at:
        return None
    ready_at = min(max(node.ready_since or now, launched_at), now)
    return BootSample(
        pool=claim.pool, instance_type=claim.instance_type or "unknown", claim_id=claim.id,
        instance_id=claim.instance_id, capacity_type=claim.capacity_type, zone=claim.zone,
        launched_at=launched_at, ready_at=ready_at, gpus_allocatable_at=now,
    )


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default); q in [0, 1]."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class LeadTime:
    """A pool's lead time and where it came from."""

    pool: str
    value: timedelta
    measured: bool
    """True: the quantile of `samples` measured boots; False: the configured `leadTime`."""
    samples: int
    median: timedelta | None = None
    p90: timedelta | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"seconds": self.value.total_seconds(),
                                  "source": "measured" if self.measured else "configured", "samples": self.samples}
        if self.median is not None and self.p90 is not None:
            out |= {"medianSeconds": self.median.total_seconds(), "p90Seconds": self.p90.total_seconds()}
        return out


def lead_time(pool: NodePool, samples: Sequence[BootSample], settings: MeasuredLeadTime) -> LeadTime:
    """The pool's measured lead time once it has enough samples (and measuring is on), else its `leadTime`."""
    return lead_time_of(pool, [s.to_gpus.total_seconds() for s in samples if s.pool == pool.name], settings)


def lead_time_of(pool: NodePool, seconds: Sequence[float], settings: MeasuredLeadTime) -> LeadTime:
    """`lead_time` from the pool's samples already reduced to seconds from launch to GPUs allocatable, in the
    samples' order (the simulator keeps them so, rather than building a timedelta per sample on every tick)."""
    if not seconds:
        return LeadTime(pool.name, pool.lead_time, measured=False, samples=0)
    median = timedelta(seconds=quantile(seconds, 0.5))
    p90 = timedelta(seconds=quantile(seconds, 0.9))
    if not settings.enabled or len(seconds) < settings.min_samples:
        return LeadTime(pool.name, pool.lead_time, measured=False, samples=len(seconds), median=median, p90=p90)
    value = timedelta(seconds=math.ceil(quantile(seconds, settings.quantile)))
    return LeadTime(pool.name, value, measured=True, samples=len(seconds), median=median, p90=p90)

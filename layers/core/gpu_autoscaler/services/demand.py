"""Demand history for the forecast: GPUs per pool per 5-minute bucket, written by the packer (pending pods it
saw) and by the reconcile step (pending plus running), into the same buckets.

The store keeps each bucket's peak, so the two writers never add up the same pods twice; one helper decides
the bucket and the TTL, so they never disagree on either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.domain.forecast import bucket_start
from gpu_autoscaler.domain.packing.fit import gpu_equivalent
from gpu_autoscaler.domain.pod_shapes import series_key, shape_class

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from datetime import datetime

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.models.resources import Resources
    from gpu_autoscaler.ports import StateStore

__all__ = ["pool_gpus", "record_demand", "shape_gpus"]


def pool_gpus(config: Config, requests: Iterable[tuple[str, Resources]]) -> dict[str, float]:
    """(pool, a pod's requests) pairs → physical GPUs per pool (a time-sliced or MIG request counts its share)."""
    out: dict[str, float] = {}
    pools = {p.name: p for p in config.node_pools}
    for name, resources in requests:
        pool = pools.get(name)
        if pool is not None:
            out[name] = out.get(name, 0.0) + gpu_equivalent(resources, pool)
    return out


def shape_gpus(config: Config, requests: Iterable[tuple[str, Resources]]) -> dict[str, float]:
    """The same pairs → physical GPUs per pod shape class (`domain.pod_shapes`), keyed `<pool>/<class>`: the
    series pre-warm shapes its headroom by. Pods without a class count in their pool's total only."""
    out: dict[str, float] = {}
    pools = {p.name: p for p in config.node_pools}
    for name, resources in requests:
        pool = pools.get(name)
        cls = shape_class(resources.as_dict(), pool) if pool is not None else None
        if pool is not None and cls is not None:
            key = series_key(name, cls)
            out[key] = out.get(key, 0.0) + gpu_equivalent(resources, pool)
    return out


def record_demand(store: StateStore, config: Config, demand: Mapping[str, float], now: datetime) -> None:
    """Write each pool's GPUs into the bucket holding `now`, kept for the configured forecast history."""
    bucket = bucket_start(now)
    for pool, gpus in sorted(demand.items()):
        store.record_demand(pool, bucket, gpus, config.predictive.history)

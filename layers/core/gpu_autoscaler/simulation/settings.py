"""What a simulation assumes beyond the configuration and the trace; every figure is written into the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.services.prewarm import PERIOD
from gpu_autoscaler.simulation.cloud import BAND_MONTHLY_RATE

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.models.catalog import InstanceType

__all__ = ["DEFAULT_SLOW_BOOT", "SimulationSettings"]

DEFAULT_SLOW_BOOT: dict[str, float] = {"p4d": 600.0, "p4de": 600.0, "p5": 600.0, "p5en": 600.0,
                                       "p6-b200": 600.0, "p6-b300": 600.0}
"""Families whose nodes take longer to be Ready (EFA, NVSwitch and fabric manager start-up), in seconds."""


@dataclass(frozen=True)
class SimulationSettings:
    """Everything the replay assumes beyond the configuration and the trace; written into the report."""

    seed: int = 0
    boot_seconds: float = 300.0
    """Launch to Ready: EC2 start, node join, GPU driver and device plugin, image pull."""
    boot_seconds_by_family: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_SLOW_BOOT))
    insufficient_capacity_rate: float = 0.02
    """Chance that one override of one CreateFleet call meets InsufficientInstanceCapacity."""
    spot_monthly_interruption: tuple[float, ...] = BAND_MONTHLY_RATE
    queue_delay: float = 2.0
    """Seconds from a message sent to its function acting (SQS to Lambda)."""
    pack_interval: float = 10.0
    """The agent's batching: pods that became pending within this many seconds reach the packer together."""
    resync_interval: float = 60.0
    """The agent re-reports a pod still pending this often (its resync)."""
    max_resync_interval: float = 6 * 3600.0
    """A pod the packer refused is re-reported at a doubling interval up to this (the real agent keeps to its
    resync; a pod that fits nowhere would otherwise cost a packing pass a minute for weeks)."""
    consolidation_interval: float = 60.0
    """The consolidate function's schedule: an empty node is looked at on the first minute it falls due."""
    underutilized_interval: float = 7200.0
    """How often the underutilized search (a packing pass per candidate node) runs, when the cluster changed.
    On the Alibaba trace the karpenter-like cost moved within ±3 %, with no trend, between 30 minutes and 4
    hours; every minute would cost more time than the rest of the run."""
    fixed_instance_type: str | None = None
    """The fixed node group's type; None: `policies.choose_fixed_type`."""

    def boot(self, instance_type: InstanceType) -> float:
        return self.boot_seconds_by_family.get(instance_type.family, self.boot_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "bootSeconds": self.boot_seconds,
            "bootSecondsByFamily": dict(self.boot_seconds_by_family),
            "insufficientCapacityRate": self.insufficient_capacity_rate,
            "spotMonthlyInterruptionByBand": list(self.spot_monthly_interruption),
            "queueDelaySeconds": self.queue_delay,
            "packIntervalSeconds": self.pack_interval,
            "resyncIntervalSeconds": self.resync_interval,
            "maxResyncIntervalSeconds": self.max_resync_interval,
            "consolidationIntervalSeconds": self.consolidation_interval,
            "underutilizedIntervalSeconds": self.underutilized_interval,
            "prewarmPeriodSeconds": PERIOD.total_seconds(),
            "fixedInstanceType": self.fixed_instance_type,
        }

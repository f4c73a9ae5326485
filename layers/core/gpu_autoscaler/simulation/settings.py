"""What a simulation assumes beyond the configuration and the trace; every figure is written into the report."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpu_autoscaler.models.boot import BOOT_SAMPLES
from gpu_autoscaler.services.prewarm import PERIOD
from gpu_autoscaler.simulation.cloud import BAND_MONTHLY_RATE

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    import numpy as np

    from gpu_autoscaler.models.catalog import InstanceType

__all__ = ["DEFAULT_SLOW_BOOT", "BootTimesError", "SimulationSettings", "read_boot_times"]

DEFAULT_SLOW_BOOT: dict[str, float] = {"p4d": 600.0, "p4de": 600.0, "p5": 600.0, "p5en": 600.0,
                                       "p6-b200": 600.0, "p6-b300": 600.0}
"""Families whose nodes take longer to be Ready (EFA, NVSwitch and fabric manager start-up), in seconds."""


class BootTimesError(ValueError):
    """The `--boot-times` file is not a JSON list of boot samples; the message names the file and the problem."""


def read_boot_times(path: Path) -> dict[str, tuple[float, ...]]:
    """Instance type → its measured boots (launch → GPUs allocatable, seconds), from a file of boot samples in the
    state store's shape (`models.boot.BootSample`, as `to_json` writes them)."""
    try:
        samples = BOOT_SAMPLES.validate_json(path.read_bytes())
    except OSError as error:
        raise BootTimesError(f"{path}: {error.strerror or error}") from None
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise BootTimesError(f"{path}: not a list of boot samples ({where}: {first['msg']})") from None
    by_type: dict[str, list[float]] = {}
    for sample in samples:
        by_type.setdefault(sample.instance_type, []).append(sample.to_gpus.total_seconds())
    return {name: tuple(sorted(seconds)) for name, seconds in sorted(by_type.items())}


@dataclass(frozen=True)
class SimulationSettings:
    """Everything the replay assumes beyond the configuration and the trace; written into the report."""

    seed: int = 0
    boot_seconds: float = 300.0
    """Launch to Ready: EC2 start, node join, GPU driver and device plugin, image pull."""
    boot_seconds_by_family: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_SLOW_BOOT))
    boot_times: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Instance type → measured boots (`--boot-times FILE`): each launch of the type draws one of them; types
    without samples keep the fixed figures above."""
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
    """A pod the packer refused is re-reported at a doubling interval up to this, on the interval's grid so that
    refused pods go together (the real agent keeps to its resync, every pending pod in one document; a pod that fits
    nowhere would otherwise cost a packing pass a minute for weeks)."""
    consolidation_interval: float = 60.0
    """The consolidate function's schedule: an empty node is looked at on the first minute it falls due."""
    underutilized_interval: float = 60.0
    """How often the underutilized search (a packing pass per candidate node) may run: the consolidate function's
    schedule. It runs when the cluster changed since the last one or a node has become weighable since (its
    consolidateAfter since its last pod event, its minNodeAge, a warm hold's end): on the same picture at the
    same eligibility it would decide the same. A longer interval is a speed setting that flatters consolidation:
    nodes are weighed hours after they could be, so fewer pods are moved (README, simulation)."""
    fixed_instance_type: str | None = None
    """The fixed node group's type; None: `policies.choose_fixed_type`."""

    def boot(self, instance_type: InstanceType, rng: np.random.Generator) -> float:
        """Launch to GPUs allocatable for one launch of this type."""
        measured = self.boot_times.get(instance_type.name)
        if measured:
            return float(measured[int(rng.integers(len(measured)))])
        return self.boot_seconds_by_family.get(instance_type.family, self.boot_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "bootSeconds": self.boot_seconds,
            "bootSecondsByFamily": dict(self.boot_seconds_by_family),
            "measuredBootSeconds": {name: {"samples": len(seconds), "median": statistics.median(seconds),
                                           "max": max(seconds)} for name, seconds in self.boot_times.items()},
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

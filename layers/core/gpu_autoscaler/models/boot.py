"""One measured node boot: launch → Node Ready → GPUs allocatable, per instance type and pool.

The reconcile step records one per claim (`services.reconcile`), the state store keeps them for
`measuredLeadTime.history`, pre-warm turns a pool's into its lead time (`domain.boot_times`), and the
simulator reads a file of them (`simulate --boot-times FILE`): one shape throughout, camelCase in JSON.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, TypeAdapter, model_validator
from pydantic.alias_generators import to_camel

__all__ = ["BOOT_SAMPLES", "BootSample"]


class BootSample(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, extra="ignore")
    """`extra` ignored: a file written by `to_json` carries the derived seconds too."""

    pool: str
    instance_type: str
    claim_id: str
    instance_id: str | None = None
    capacity_type: str | None = None
    zone: str | None = None
    launched_at: datetime
    """The claim's Launched transition: CreateFleet (instant) returned the instance."""
    ready_at: datetime
    """The Node's Ready condition `lastTransitionTime`."""
    gpus_allocatable_at: datetime
    """When reconcile first saw `nvidia.com/gpu` (or `nvidia.com/mig-*`) allocatable on the Node: no API field
    records it, so this is an upper bound, late by at most the reconcile period (one minute)."""

    @model_validator(mode="after")
    def _ordered(self) -> BootSample:
        if not self.launched_at <= self.ready_at <= self.gpus_allocatable_at:
            raise ValueError("launchedAt ≤ readyAt ≤ gpusAllocatableAt must hold")
        return self

    @property
    def to_ready(self) -> timedelta:
        return self.ready_at - self.launched_at

    @property
    def to_gpus(self) -> timedelta:
        """Launch to GPUs allocatable: how long capacity takes to be usable, the lead time's measure."""
        return self.gpus_allocatable_at - self.launched_at

    def to_json(self) -> dict[str, object]:
        return {**self.model_dump(mode="json", by_alias=True, exclude_none=True),
                "readySeconds": round(self.to_ready.total_seconds(), 3),
                "gpusAllocatableSeconds": round(self.to_gpus.total_seconds(), 3)}


BOOT_SAMPLES: TypeAdapter[list[BootSample]] = TypeAdapter(list[BootSample])
"""A JSON list of samples, as `to_json` writes them."""

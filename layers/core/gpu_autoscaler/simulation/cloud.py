"""EC2 as the simulator plays it: `ports.Compute` over simulated instances.

What the model holds, stated so the figures can be judged:

- CreateFleet (`create_fleet`): each override of a request may fail with InsufficientInstanceCapacity,
  independently, with the configured probability (seeded); the rest is EC2's answer to the strategy —
  Spot's price-capacity-optimized and On-Demand's lowest-price both take the cheapest override that has
  capacity here (the simulated pools have no depth to weigh), a gang takes one zone (and one type where
  asked) for all its instances or launches none. Prices are the catalog's (the bundled snapshots).
- Boot: an instance is a Ready node with its GPUs `boot_seconds` after launch, more for the big multi-GPU
  families, or one of its type's measured boots when `--boot-times FILE` gives them.
- Spot interruptions: each Spot instance draws its time to an interruption warning from an exponential
  distribution whose rate is its offering's Spot Advisor frequency band (share of instances interrupted
  per month: `BAND_MONTHLY_RATE`); the warning comes 2 minutes before EC2 reclaims the instance.
- Billing: from launch to termination, per second, at the offering's price.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpu_autoscaler.models.fleet import FleetError, FleetResult, LaunchedInstance

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np

    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.models.fleet import FleetOverride, FleetRequest

__all__ = ["BAND_MONTHLY_RATE", "MONTH", "SimulatedCloud", "SimulatedInstance", "interruption_hazard"]

MONTH = 30 * 86400.0
BAND_MONTHLY_RATE = (0.025, 0.075, 0.125, 0.175, 0.25)
"""Spot Advisor bands 0–4 (<5 %, 5–10 %, 10–15 %, 15–20 %, >20 % of instances interrupted in a month): the
middle of each band, and 25 % for the open-ended last one. An offering with no band counts as the last."""


def interruption_hazard(band: int | None, monthly: Sequence[float] = BAND_MONTHLY_RATE) -> float:
    """Interruptions per instance-second: the rate at which a share `p` of instances is hit within a month."""
    share = monthly[band if band is not None and 0 <= band < len(monthly) else len(monthly) - 1]
    return -math.log1p(-share) / MONTH


@dataclass
class SimulatedInstance:
    instance_id: str
    instance_type: InstanceType
    zone: str
    capacity_type: str
    price_per_hour: float
    launched_at: float
    claim_id: str | None
    pool: str
    interruption_band: int | None = None
    terminated_at: float | None = None

    @property
    def alive(self) -> bool:
        return self.terminated_at is None

    def seconds_up(self, until: float) -> float:
        """From launch to termination (or `until`, if still up)."""
        end = self.terminated_at if self.terminated_at is not None else until
        return max(0.0, end - self.launched_at)

    def cost(self, until: float) -> float:
        return self.price_per_hour * self.seconds_up(until) / 3600


class SimulatedCloud:
    """`Compute` for one simulated account: launches and terminates, and tells the engine when it does."""

    def __init__(
        self,
        catalog: Catalog,
        rng: np.random.Generator,
        now: Callable[[], float],
        *,
        insufficient_capacity_rate: float = 0.0,
        on_launch: Callable[[SimulatedInstance], None] | None = None,
        on_terminate: Callable[[SimulatedInstance], None] | None = None,
    ) -> None:
        self.catalog = catalog
        self.rng = rng
        self.now = now
        self.insufficient_capacity_rate = insufficient_capacity_rate
        self.on_launch = on_launch
        self.on_terminate = on_terminate
        self.instances: dict[str, SimulatedInstance] = {}
        self.create_fleet_calls = 0
        self.capacity_errors = 0
        self._serial = itertools.count(1)

    # Compute

    def create_fleet(self, request: FleetRequest) -> FleetResult:
        self.create_fleet_calls += 1
        capacity_type = "on-demand" if request.capacity_type == "reserved" else request.capacity_type
        ranked = sorted(
            enumerate(request.overrides),
            key=lambda item: (self._price(item[1], request.capacity_type), item[0]),
        )
        short = [o for _, o in ranked if self._short_of_capacity()]
        self.capacity_errors += len(short)
        failed = {(o.instance_type, o.zone) for o in short}
        open_ = [o for _, o in ranked if (o.instance_type, o.zone) not in failed]
        errors = tuple(
            FleetError(code="InsufficientInstanceCapacity",
                       message="We currently do not have sufficient capacity in the Availability Zone you requested.",
                       instance_type=o.instance_type, zone=o.zone, capacity_type=request.capacity_type)
            for o in short
        )
        chosen = self._choose(request, open_)
        if chosen is None:
            return FleetResult(fleet_id=f"fleet-{next(self._serial):08x}", errors=errors)
        launched = []
        for claim_id, override in zip(request.claim_ids, chosen, strict=True):
            instance = self._start(override, request, claim_id)
            launched.append(LaunchedInstance(
                instance_id=instance.instance_id, instance_type=override.instance_type, zone=override.zone,
                capacity_type=request.capacity_type, subnet_id=override.subnet_id,
                lifecycle="spot" if capacity_type == "spot" else "on-demand", claim_id=claim_id,
            ))
        return FleetResult(fleet_id=f"fleet-{next(self._serial):08x}", instances=tuple(launched), errors=errors)

    def terminate(self, instance_ids: Sequence[str], *, unknown_is_gone: bool = False) -> list[str]:
        done = []
        for instance_id in instance_ids:
            instance = self.instances.get(instance_id)
            if instance is None or not instance.alive:
                continue
            instance.terminated_at = self.now()
            done.append(instance_id)
            if self.on_terminate is not None:
                self.on_terminate(instance)
        return done

    def instance_states(self, instance_ids: Sequence[str]) -> dict[str, str]:
        return {i: "running" if self.instances[i].alive else "terminated" for i in instance_ids if i in self.instances}

    # Figures

    def alive(self) -> list[SimulatedInstance]:
        return [i for i in self.instances.values() if i.alive]

    def cost(self, until: float) -> float:
        return sum(i.cost(until) for i in self.instances.values())

    # Inside

    def _short_of_capacity(self) -> bool:
        return self.insufficient_capacity_rate > 0 and float(self.rng.random()) < self.insufficient_capacity_rate

    def _price(self, override: FleetOverride, capacity_type: str) -> float:
        price = self.catalog.price((override.instance_type, override.zone, capacity_type))
        return price if price is not None else math.inf

    def _choose(self, request: FleetRequest, open_: list[FleetOverride]) -> list[FleetOverride] | None:
        """One override per instance, or None when the request cannot be met (all or nothing for gangs)."""
        count = request.target_capacity
        if not open_:
            return None
        if request.min_target_capacity is None:
            return [open_[0]] * count
        # All or nothing in one zone (and one type where asked): the cheapest override that can hold them all.
        return [open_[0]] * count if request.single_availability_zone or request.single_instance_type else None

    def _start(self, override: FleetOverride, request: FleetRequest, claim_id: str) -> SimulatedInstance:
        offering = self.catalog.offering((override.instance_type, override.zone, request.capacity_type))
        instance = SimulatedInstance(
            instance_id=f"i-{next(self._serial):017x}",
            instance_type=self.catalog.instance_type(override.instance_type),
            zone=override.zone,
            capacity_type=request.capacity_type,
            price_per_hour=offering.price_per_hour if offering is not None else 0.0,
            launched_at=self.now(),
            claim_id=claim_id,
            pool=request.pool,
            interruption_band=offering.interruption_band if offering is not None else None,
        )
        self.instances[instance.instance_id] = instance
        if self.on_launch is not None:
            self.on_launch(instance)
        return instance

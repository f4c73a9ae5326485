"""EC2 capacity in memory, implementing `ports.Compute` for unit tests, the simulator and anyone's fakes.

It answers a `FleetRequest` the way an instant EC2 Fleet does, deterministically: overrides are tried in the
order given (the domain ranks them, best first); an offering listed in `no_capacity` answers
`InsufficientInstanceCapacity` (per override, as EC2 reports it); the first offering that can take the
whole target launches it (so a gang lands in one zone, of one type, or nowhere); reserved requests draw
on `reservations` when counts are given. Instances carry the request's tags, and termination acts only on
those carrying this cluster's ownership tag. Every call is recorded, and `fail_next` makes the next calls
raise (a `RequestThrottled`, say).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.fleet import TAG_LAUNCH, assign_claims, launched_capacity_type
from gpu_autoscaler.models.fleet import FleetError, FleetResult, LaunchedInstance, OwnedInstance
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.config import CapacityType
    from gpu_autoscaler.models.fleet import FleetOverride, FleetRequest

__all__ = ["MemoryCompute", "MemoryInstance"]


@dataclass
class MemoryInstance:
    instance_id: str
    instance_type: str
    zone: str
    capacity_type: CapacityType
    tags: dict[str, str]
    state: str = "running"
    launched_at: datetime | None = None
    user_data: str = ""
    claim_id: str | None = None
    reservation_id: str | None = None


@dataclass
class MemoryCompute:
    cluster: str
    clock: Clock | None = None
    no_capacity: set[tuple[str, str, str]] = field(default_factory=set)
    """(instance type, zone, capacity type) EC2 has nothing of now."""
    reservations: dict[str, int] = field(default_factory=dict)
    """Reservation id → instances it can still take; a reservation not listed takes any number."""
    fail_next: list[Exception] = field(default_factory=list)
    instances: dict[str, MemoryInstance] = field(default_factory=dict)
    requests: list[FleetRequest] = field(default_factory=list)
    terminations: list[list[str]] = field(default_factory=list)
    unknown_is_gone: list[bool] = field(default_factory=list)
    """Each termination's `unknown_is_gone`, in order."""
    described: list[list[str]] = field(default_factory=list)
    """The ids of each `instance_states` call (one DescribeInstances), in order."""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def create_fleet(self, request: FleetRequest) -> FleetResult:
        self.requests.append(request)
        if self.fail_next:
            raise self.fail_next.pop(0)
        errors: list[FleetError] = []
        user_data = {o: c.user_data for c in request.launch_configs for o in c.overrides}
        for override in request.overrides:
            if (override.instance_type, override.zone, request.capacity_type) in self.no_capacity:
                errors.append(self._error(request, override, "InsufficientInstanceCapacity"))
                continue
            reservation = self._reserve(request, request.target_capacity) if request.capacity_type == "reserved" \
                else None
            if request.capacity_type == "reserved" and reservation is None:
                errors.append(self._error(request, override, "ReservationCapacityExceeded"))
                continue
            launched = [self._launch(request, override, user_data[override], reservation)
                        for _ in range(request.target_capacity)]
            if len(request.claim_ids) > 1:
                launched = list(assign_claims(request.claim_ids, launched))
                for instance in launched:  # as the EC2 adapter does: each instance tagged with its claim
                    if instance.claim_id:
                        record = self.instances[instance.instance_id]
                        record.claim_id = instance.claim_id
                        record.tags.update({TAG_CLAIM: instance.claim_id,
                                            "Name": f"{self.cluster}/{instance.claim_id}"})
            return FleetResult(fleet_id=f"fleet-{next(self._ids):08x}", instances=tuple(launched),
                               errors=tuple(errors))
        return FleetResult(errors=tuple(errors))

    def _reserve(self, request: FleetRequest, count: int) -> str | None:
        """The first of the request's reservations that holds `count` more (drawn down), or None."""
        assert request.reservation is not None
        for reservation in request.reservation.reservation_ids:
            left = self.reservations.get(reservation)
            if left is None:
                return reservation
            if left >= count:
                self.reservations[reservation] = left - count
                return reservation
        return None

    def _launch(self, request: FleetRequest, override: FleetOverride, user_data: str,
                reservation: str | None) -> LaunchedInstance:
        instance_id = f"i-{next(self._ids):017x}"
        lifecycle = "spot" if request.capacity_type == "spot" else "on-demand"
        capacity_type = launched_capacity_type(request.capacity_type, lifecycle)
        claim = request.claim_ids[0] if len(request.claim_ids) == 1 else None
        self.instances[instance_id] = MemoryInstance(
            instance_id, override.instance_type, override.zone, capacity_type, dict(request.tags),
            launched_at=self.clock.now() if self.clock else None, user_data=user_data, claim_id=claim,
            reservation_id=reservation,
        )
        return LaunchedInstance(instance_id=instance_id, instance_type=override.instance_type, zone=override.zone,
                                capacity_type=capacity_type, subnet_id=override.subnet_id, lifecycle=lifecycle,
                                claim_id=claim, reservation_id=reservation)

    @staticmethod
    def _error(request: FleetRequest, override: FleetOverride, code: str) -> FleetError:
        return FleetError(code=code, message=f"no {override.instance_type} capacity in {override.zone}",
                          instance_type=override.instance_type, zone=override.zone,
                          capacity_type=request.capacity_type)

    def terminate(self, instance_ids: Sequence[str], *, unknown_is_gone: bool = False) -> list[str]:
        self.terminations.append(list(instance_ids))
        self.unknown_is_gone.append(unknown_is_gone)
        done = []
        for instance_id in dict.fromkeys(instance_ids):
            instance = self.instances.get(instance_id)
            if instance is None or instance.tags.get(TAG_CLUSTER) != self.cluster:
                continue
            instance.state = "terminated"
            done.append(instance_id)
        return done

    def instance_states(self, instance_ids: Sequence[str]) -> dict[str, str]:
        self.described.append(list(instance_ids))
        return {i: self.instances[i].state for i in instance_ids if i in self.instances}

    def owned_instances(self) -> list[OwnedInstance]:
        return [
            OwnedInstance(instance_id=i.instance_id, state=i.state, launched_at=i.launched_at,
                          claim_id=i.tags.get(TAG_CLAIM) or i.claim_id, launch_token=i.tags.get(TAG_LAUNCH),
                          capacity_reservation_id=i.reservation_id)
            for i in self.instances.values()
            if i.tags.get(TAG_CLUSTER) == self.cluster
        ]

    def add_foreign(self, instance_type: str, zone: str, tags: dict[str, str] | None = None) -> str:
        """An instance someone else launched (without our ownership tag, unless `tags` says otherwise)."""
        instance_id = f"i-{next(self._ids):017x}"
        self.instances[instance_id] = MemoryInstance(instance_id, instance_type, zone, "on-demand", dict(tags or {}))
        return instance_id

    def running(self) -> list[MemoryInstance]:
        return [i for i in self.instances.values() if i.state == "running"]

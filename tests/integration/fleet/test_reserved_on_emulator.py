"""Reserved launches end to end on the emulator: the fleet Lambda, the strict layer's Capacity Reservations
stand-in, and On-Demand claims that must leave the reserved pool's reservation alone (issue 14 defects 1, 2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.emulator.strict.ec2_capacity_reservations import Reservation, register_reservation
from gpu_autoscaler.models.claims import ClaimState
from tests.integration.fleet.helpers import new_claim
from tests.integration.fleet.test_fleet_on_moto import deliver, request

if TYPE_CHECKING:
    from types import ModuleType

    from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
    from gpu_autoscaler.emulator.aws import EmbeddedAws

RESERVATION = "cr-0123456789abcdef0"
"""The example configuration's reservation of the gpu-reserved pool."""


def available(aws: EmbeddedAws) -> int:
    [found] = aws.clients.client("ec2").describe_capacity_reservations(CapacityReservationIds=[RESERVATION])[
        "CapacityReservations"]
    return int(found["AvailableInstanceCount"])


def test_on_demand_claims_leave_the_reservation_and_reserved_claims_launch_into_it(
        aws: EmbeddedAws, fleet: ModuleType, store: DynamoStateStore) -> None:
    account = aws.clients.client("sts").get_caller_identity()["Account"]
    register_reservation(Reservation(id=RESERVATION, account=account, region="us-east-1",
                                     instance_type="p4d.24xlarge", zone="us-east-1c", total=1, available=1))
    new_claim(store, "gpu-reserved-od1", pool="gpu-reserved", capacity_type="on-demand",
              instance_types=("p4d.24xlarge",), zones=("us-east-1c",), price_per_hour=32.77)
    assert deliver(aws, fleet, request("gpu-reserved-od1"))[1] == {"batchItemFailures": []}
    on_demand = store.get_claim("gpu-reserved-od1")
    assert on_demand is not None and on_demand.state is ClaimState.LAUNCHED, on_demand and on_demand.reason
    assert available(aws) == 1  # the On-Demand launch said `none`: the reservation is still whole

    new_claim(store, "gpu-reserved-res1", pool="gpu-reserved", capacity_type="reserved",
              instance_types=("p4d.24xlarge",), zones=("us-east-1c",), price_per_hour=0.0,
              reservation_id=RESERVATION)
    assert deliver(aws, fleet, request("gpu-reserved-res1"))[1] == {"batchItemFailures": []}
    reserved = store.get_claim("gpu-reserved-res1")
    assert reserved is not None and reserved.state is ClaimState.LAUNCHED, reserved and reserved.reason
    assert reserved.capacity_type == "reserved"
    assert available(aws) == 0

"""Reservations read by the catalog from the emulator's Capacity Reservations stand-in (the strict layer), which
answers DescribeCapacityReservations as EC2 documents it: an unknown id fails the whole call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.adapters.aws.pricing import OnDemandPrices, PriceSnapshot, SpotPrices
from gpu_autoscaler.config import CapacityReservation, Config, parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    config: Config = parse_config(example_config_data())
    with EmbeddedAws(config) as embedded:
        yield embedded


def source(aws: EmbeddedAws, *reservation_ids: str) -> Ec2CatalogSource:
    ec2 = aws.clients.client("ec2")
    snapshot = PriceSnapshot.load()
    region = aws.config.region
    return Ec2CatalogSource(
        ec2, region, zones=aws.config.zones, reservations=[CapacityReservation(id=i) for i in reservation_ids],
        on_demand=OnDemandPrices(region, None, snapshot), spot=SpotPrices(region, ec2, snapshot),
    )


def reserve_and_use_one(aws: EmbeddedAws, ec2: Any) -> str:
    """A reservation of 3 p5.48xlarge in us-east-1a, one of them taken by an instance launched into it."""
    reservation = str(ec2.create_capacity_reservation(
        InstanceType="p5.48xlarge", InstancePlatform="Linux/UNIX", AvailabilityZone="us-east-1a", InstanceCount=3,
    )["CapacityReservation"]["CapacityReservationId"])
    ec2.run_instances(ImageId=aws.config.ami.x86_64, InstanceType="p5.48xlarge", MinCount=1, MaxCount=1,
                      SubnetId=aws.zone_subnets["us-east-1a"])  # no preference: open, so into the reservation
    return reservation


def test_an_unknown_reservation_id_leaves_the_others_read_from_ec2(aws: EmbeddedAws) -> None:
    ec2 = aws.clients.client("ec2")
    reservation = reserve_and_use_one(aws, ec2)
    offerings = source(aws, reservation, "cr-0fffffffffffffff0").offerings()
    reserved = [(o.key, o.reservation_id, o.available_count) for o in offerings if o.capacity_type == "reserved"]
    assert reserved == [(("p5.48xlarge", "us-east-1a", "reserved"), reservation, 2)]

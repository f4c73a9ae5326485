"""`Ec2CatalogSource` over a fake EC2 client: offerings per zone, prices, reservations, re-pricing."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.parsers import ResponseParserError

from gpu_autoscaler.adapters.aws.catalog import RESERVED_PRICE_DIVISOR, Ec2CatalogSource
from gpu_autoscaler.adapters.aws.pricing import OnDemandPrices, PriceSnapshot, SpotAdvice, SpotPrices
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.config import CapacityReservation
from tests.unit.catalog.builders import make_gpu, raw_instance_type
from tests.unit.catalog.fakes import FakeClient, client_error

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")


def fake_ec2(**answers: Any) -> FakeClient:
    defaults: dict[str, Any] = {
        "describe_instance_type_offerings": [{"InstanceTypeOfferings": [
            {"InstanceType": name, "Location": zone, "LocationType": "availability-zone"}
            for name, zones in {"g6.xlarge": ZONES, "g6f.large": ZONES[:2], "m5.large": ZONES,
                                "p5.48xlarge": ("us-east-1d",)}.items()
            for zone in zones
        ]}],
        "describe_instance_types": [{"InstanceTypes": [
            raw_instance_type("g6.xlarge"),
            raw_instance_type("g6f.large", vcpus=2, gpus=[make_gpu(Count=0, LogicalGpuCount=1, GpuPartitionSize=0.125,
                                                                   MemoryInfo={"SizeInMiB": 2861})]),
            raw_instance_type("p5.48xlarge", vcpus=192, gpus=[make_gpu(Name="H100", Count=8)]),
        ]}, {"InstanceTypes": [raw_instance_type("m5.large", gpus=[])]}],
        "describe_spot_price_history": [],
    }
    defaults.update(answers)
    return FakeClient(**defaults)


def reservation_item(reservation_id: str, **fields: Any) -> dict[str, Any]:
    """One reservation as DescribeCapacityReservations answers it: an active g6.xlarge one in us-east-1a."""
    return {"CapacityReservationId": reservation_id, "InstanceType": "g6.xlarge", "InstancePlatform": "Linux/UNIX",
            "AvailabilityZone": "us-east-1a", "Tenancy": "default", "State": "active", "ReservationType": "default",
            "AvailableInstanceCount": 1, "TotalInstanceCount": 4, **fields}


def snapshot() -> PriceSnapshot:
    return PriceSnapshot({"us-east-1": {"g6.xlarge": 0.8048, "g6f.large": 0.202, "p5.48xlarge": 55.04}},
                         {"us-east-1": {"g6.xlarge": SpotAdvice(50, 4)}}, "2026-07-20", "2026-11-22")


def make_source(ec2: FakeClient, clock: FixedClock | None = None, **overrides: Any) -> Ec2CatalogSource:
    clock = clock or FixedClock(NOW)
    values: dict[str, Any] = {
        "zones": ZONES,
        "on_demand": OnDemandPrices("us-east-1", None, snapshot()),
        "spot": SpotPrices("us-east-1", ec2, snapshot(), clock),
        "clock": clock,
        "overrides": {},
    }
    values.update(overrides)
    return Ec2CatalogSource(ec2, "us-east-1", **values)


def test_gpu_types_offered_in_the_configured_zones_only() -> None:
    ec2 = fake_ec2()
    source = make_source(ec2)
    assert [t.name for t in source.instance_types()] == ["g6.xlarge", "g6f.large"]
    offering_calls = [kw for op, kw in ec2.calls if op == "describe_instance_type_offerings"]
    assert offering_calls == [{"LocationType": "availability-zone",
                               "Filters": [{"Name": "location", "Values": list(ZONES)}]}]
    type_calls = [kw for op, kw in ec2.calls if op == "describe_instance_types"]
    assert type_calls == [{"Filters": [{"Name": "instance-type", "Values": ["g*", "p*"]}]}]


def test_offerings_per_zone_and_capacity_type() -> None:
    catalog = make_source(fake_ec2()).catalog()
    keys = {o.key: o for o in catalog.all_offerings()}
    assert set(keys) == {
        ("g6.xlarge", z, ct) for z in ZONES for ct in ("on-demand", "spot")
    } | {("g6f.large", z, "on-demand") for z in ZONES[:2]}
    spot = keys[("g6.xlarge", "us-east-1b", "spot")]
    assert spot.price_per_hour == pytest.approx(0.4024) and spot.interruption_band == 4
    assert keys[("g6f.large", "us-east-1a", "on-demand")].price_per_hour == 0.202
    assert catalog.instance_type("g6f.large").gpus == 0.125


def test_without_zones_every_zone_counts() -> None:
    source = make_source(fake_ec2(), zones=None)
    assert "p5.48xlarge" in {t.name for t in source.instance_types()}
    assert {o.zone for o in source.offerings() if o.instance_type == "p5.48xlarge"} == {"us-east-1d"}


def test_reservations_from_the_api_are_near_free_reserved_offerings() -> None:
    """Only active reservations are asked for (as Karpenter's query, pkg/providers/capacityreservation/types.go):
    an expired or cancelled one is not in the answer."""
    ec2 = fake_ec2(describe_capacity_reservations=[{"CapacityReservations": [
        reservation_item("cr-0aaa", AvailableInstanceCount=3, TotalInstanceCount=4)]}])
    source = make_source(ec2, reservations=[CapacityReservation(id="cr-0aaa"), CapacityReservation(id="cr-0bbb")])
    reserved = [o for o in source.offerings() if o.capacity_type == "reserved"]
    assert [(o.key, o.reservation_id, o.reservation_type, o.available_count) for o in reserved] == [
        (("g6.xlarge", "us-east-1a", "reserved"), "cr-0aaa", "default", 3)]
    assert reserved[0].price_per_hour == pytest.approx(0.8048 / RESERVED_PRICE_DIVISOR)
    call = next(kw for op, kw in ec2.calls if op == "describe_capacity_reservations")
    assert call == {"CapacityReservationIds": ["cr-0aaa", "cr-0bbb"],
                    "Filters": [{"Name": "state", "Values": ["active"]}]}


def test_an_unknown_reservation_id_is_skipped_and_the_others_are_read_from_the_api(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """EC2 fails the whole DescribeCapacityReservations call with InvalidCapacityReservationId.NotFound when one of
    its ids is unknown (a Capacity Block purged after its end, a typo). Karpenter asks per id and skips an unknown one
    (karpenter-provider-aws pkg/providers/capacityreservation/provider.go: "we only receive this error when requesting
    a single ID"). The configuration is no stand-in here: its count is the reservation's size, not what is left."""
    def answer(**kwargs: Any) -> list[dict[str, Any]]:
        ids = kwargs["CapacityReservationIds"]
        if "cr-0dead" in ids:
            raise client_error("InvalidCapacityReservationId.NotFound", "DescribeCapacityReservations")
        return [{"CapacityReservations": [reservation_item(i, AvailableInstanceCount=3) for i in ids]}]

    ec2 = fake_ec2(describe_capacity_reservations=answer)
    configured = [
        CapacityReservation(id="cr-0aaa", instance_type="g6.xlarge", availability_zone="us-east-1a", instance_count=8),
        CapacityReservation(id="cr-0dead", instance_type="g6.xlarge", availability_zone="us-east-1b", instance_count=2),
    ]
    source = make_source(ec2, reservations=configured)
    with caplog.at_level(logging.WARNING):
        reserved = [o for o in source.offerings() if o.capacity_type == "reserved"]
        source.catalog()
    assert [(o.reservation_id, o.available_count) for o in reserved] == [("cr-0aaa", 3)]
    asked = [kw["CapacityReservationIds"] for op, kw in ec2.calls if op == "describe_capacity_reservations"]
    assert asked == [["cr-0aaa", "cr-0dead"], ["cr-0aaa"], ["cr-0dead"]]
    warnings = [r.getMessage() for r in caplog.records if "cr-0dead" in r.getMessage()]
    assert len(warnings) == 1 and "InvalidCapacityReservationId.NotFound" in warnings[0]


def test_a_reservation_for_another_platform_or_tenancy_is_not_offered(caplog: pytest.LogCaptureFixture) -> None:
    """An instance runs in a reservation only if it "Has matching attributes (instance type, platform, Availability
    Zone, and tenancy)" (EC2 User Guide, "Launch instances into an existing Capacity Reservation"). Our nodes are
    Linux/UNIX (AL2023, Bottlerocket) with default tenancy: a Windows, RHEL or dedicated reservation would take no
    launch of ours, each planned into it failing."""
    ec2 = fake_ec2(describe_capacity_reservations=[{"CapacityReservations": [
        reservation_item("cr-0aaa"),
        reservation_item("cr-0bbb", InstancePlatform="Red Hat Enterprise Linux"),
        reservation_item("cr-0ccc", Tenancy="dedicated"),
        reservation_item("cr-0ddd", InstancePlatform="Windows", Tenancy="dedicated"),
    ]}])
    source = make_source(ec2, reservations=[CapacityReservation(id=i) for i in ("cr-0aaa", "cr-0bbb", "cr-0ccc",
                                                                                 "cr-0ddd")])
    with caplog.at_level(logging.WARNING):
        assert [o.reservation_id for o in source.offerings() if o.capacity_type == "reserved"] == ["cr-0aaa"]
        source.catalog()
    warned = {rid: [r.getMessage() for r in caplog.records if rid in r.getMessage()]
              for rid in ("cr-0aaa", "cr-0bbb", "cr-0ccc", "cr-0ddd")}
    assert warned["cr-0aaa"] == []
    assert [len(m) for m in warned.values()] == [0, 1, 1, 1]
    assert "platform Red Hat Enterprise Linux, not Linux/UNIX" in warned["cr-0bbb"][0]
    assert "tenancy dedicated, not default" in warned["cr-0ccc"][0]
    assert "platform Windows, not Linux/UNIX; tenancy dedicated, not default" in warned["cr-0ddd"][0]


def test_a_capacity_block_is_not_offered_in_its_last_forty_minutes() -> None:
    """EC2 warns once, 40 minutes before a Capacity Block ends, and terminates its instances from 30 minutes before
    (EC2 User Guide, "Capacity Blocks for ML"): a node launched into it meanwhile would get no warning. Karpenter
    takes such a block as expiring and offers it no more (`CapacityReservationFromEC2`). The reserved offerings are
    used for `reservation_ttl` (a minute) before they are read again, so a block expiring within that is left out
    already."""
    def block(reservation_id: str, ends_in: timedelta, kind: str = "capacity-block") -> dict[str, Any]:
        return {"CapacityReservationId": reservation_id, "InstanceType": "g6.xlarge", "AvailabilityZone": "us-east-1a",
                "State": "active", "ReservationType": kind, "AvailableInstanceCount": 1, "TotalInstanceCount": 1,
                "EndDateType": "limited", "EndDate": NOW + ends_in}

    ec2 = fake_ec2(describe_capacity_reservations=[{"CapacityReservations": [
        block("cr-0aaa", timedelta(hours=3)), block("cr-0bbb", timedelta(minutes=41)),
        block("cr-0ccc", timedelta(minutes=20), kind="default"), block("cr-0ddd", timedelta(minutes=41, seconds=1))]}])
    wanted = [CapacityReservation(id=i, type="capacity-block") for i in ("cr-0aaa", "cr-0bbb", "cr-0ccc", "cr-0ddd")]
    source = make_source(ec2, reservations=wanted, price_ttl=timedelta(minutes=10))
    reserved = [o.reservation_id for o in source.offerings() if o.capacity_type == "reserved"]
    assert reserved == ["cr-0aaa", "cr-0ccc", "cr-0ddd"]  # an On-Demand Capacity Reservation's end is not a block's


def test_an_interruptible_reservation_is_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """DescribeCapacityReservations' `Interruptible`: an interruptible Capacity Reservation's instances are terminated
    on a 2-minute warning whenever its owner reclaims the capacity (EC2 User Guide, "Interruptible Capacity
    Reservations"). The packer plans reserved capacity as uninterruptible and near free, so it would be preferred
    for every pod; and launching into it takes the `interruptible-capacity-reservation` type, which is not asked.
    Offered as it is, it would take launches it cannot keep: it is left out, and the log says why."""
    ec2 = fake_ec2(describe_capacity_reservations=[{"CapacityReservations": [
        {"CapacityReservationId": "cr-0aaa", "InstanceType": "g6.xlarge", "AvailabilityZone": "us-east-1a",
         "State": "active", "ReservationType": "default", "AvailableInstanceCount": 3, "Interruptible": True},
        {"CapacityReservationId": "cr-0bbb", "InstanceType": "g6.xlarge", "AvailabilityZone": "us-east-1a",
         "State": "active", "ReservationType": "default", "AvailableInstanceCount": 1, "Interruptible": False},
    ]}])
    source = make_source(ec2, reservations=[CapacityReservation(id="cr-0aaa"), CapacityReservation(id="cr-0bbb")])
    with caplog.at_level(logging.WARNING):
        reserved = [o.reservation_id for o in source.offerings() if o.capacity_type == "reserved"]
    assert reserved == ["cr-0bbb"]
    assert any("cr-0aaa" in r.getMessage() and "interruptible" in r.getMessage() for r in caplog.records)


def test_reservations_fall_back_to_the_configuration(caplog: pytest.LogCaptureFixture) -> None:
    ec2 = fake_ec2()
    ec2.fail("describe_capacity_reservations", ResponseParserError("<!doctype html> 500"))
    configured = [
        CapacityReservation(id="cr-0aaa", instance_type="g6.xlarge", availability_zone="us-east-1c", instance_count=2),
        CapacityReservation(id="cr-0ccc", type="capacity-block"),
    ]
    source = make_source(ec2, reservations=configured)
    with caplog.at_level(logging.WARNING):
        reserved = [o for o in source.offerings() if o.capacity_type == "reserved"]
    assert [(o.key, o.available_count) for o in reserved] == [(("g6.xlarge", "us-east-1c", "reserved"), 2)]
    assert any("skipped cr-0ccc" in r.getMessage() for r in caplog.records)


def test_reservations_outside_the_zones_or_types_are_ignored() -> None:
    ec2 = fake_ec2()
    ec2.fail("describe_capacity_reservations", NotImplementedError("moto"))
    source = make_source(ec2, reservations=[
        CapacityReservation(id="cr-01", instance_type="g6.xlarge", availability_zone="us-east-1f"),
        CapacityReservation(id="cr-02", instance_type="m5.large", availability_zone="us-east-1a"),
    ])
    assert [o for o in source.offerings() if o.capacity_type == "reserved"] == []


def test_prices_are_refreshed_after_the_ttl_and_types_are_not() -> None:
    clock = FixedClock(NOW)
    ec2 = fake_ec2()
    source = make_source(ec2, clock, price_ttl=timedelta(minutes=10))
    source.offerings()
    source.offerings()
    clock.advance(timedelta(minutes=11))
    source.offerings()
    count = {op: sum(1 for o, _ in ec2.calls if o == op) for op, _ in ec2.calls}
    assert count["describe_spot_price_history"] == 2
    assert count["describe_instance_types"] == 1


def test_reservations_are_read_each_minute_and_their_offerings_say_when() -> None:
    """A reservation's AvailableInstanceCount changes with every launch into it and every termination (freed after
    "several minutes to clean up", EC2 User Guide, capacity-blocks-launch.html): it is read again each minute, as
    Karpenter polls it (pkg/controllers/nodeclass/capacityreservation.go), not with the prices every 10 minutes.
    The offering says when it was read, so the solver can take off the launches recorded since."""
    counts = iter([2, 1])

    def answer(**kwargs: Any) -> list[dict[str, Any]]:
        return [{"CapacityReservations": [reservation_item("cr-0aaa", AvailableInstanceCount=next(counts))]}]

    clock = FixedClock(NOW)
    ec2 = fake_ec2(describe_capacity_reservations=answer)
    source = make_source(ec2, clock, reservations=[CapacityReservation(id="cr-0aaa")], price_ttl=timedelta(minutes=10))

    def reserved() -> tuple[int | None, datetime | None]:
        [offering] = [o for o in source.offerings() if o.capacity_type == "reserved"]
        return offering.available_count, offering.counted_at

    assert reserved() == (2, NOW)
    clock.advance(timedelta(seconds=59))
    assert reserved() == (2, NOW)
    clock.advance(timedelta(seconds=1))
    assert reserved() == (1, NOW + timedelta(minutes=1))
    assert sum(op == "describe_spot_price_history" for op, _ in ec2.calls) == 1  # prices are not read again
    assert {o.key for o in source.offerings()} == {o.key for o in make_source(fake_ec2()).offerings()} | {
        ("g6.xlarge", "us-east-1a", "reserved")}


def test_prefix_delegation_changes_max_pods() -> None:
    plain = make_source(fake_ec2()).catalog().instance_type("g6.xlarge").max_pods
    delegated = make_source(fake_ec2(), prefix_delegation=True).catalog().instance_type("g6.xlarge").max_pods
    assert (plain, delegated) == (58, 110)

"""The domain `Catalog`: indexing and the queries the packer asks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.domain.catalog import ANY, Catalog, UnknownInstanceType
from tests.unit.catalog.builders import make_instance_type, make_offering

if TYPE_CHECKING:
    from gpu_autoscaler.models.catalog import Offering


def small_catalog() -> Catalog:
    types = [
        make_instance_type(name="g6.xlarge"),
        make_instance_type(name="g6.12xlarge", vcpu=48, gpus=4, gpu_devices=4, gpu_memory_mib=91552),
        make_instance_type(name="g6f.large", vcpu=2, gpus=0.125, gpu_devices=1, gpu_memory_mib=2861),
        make_instance_type(name="m5.large", vcpu=2, gpus=0, gpu_devices=0, gpu_model=None, gpu_memory_mib=0),
    ]
    offerings = [
        make_offering(instance_type="g6.xlarge", zone="us-east-1a", capacity_type="on-demand", price_per_hour=0.8048),
        make_offering(instance_type="g6.xlarge", zone="us-east-1b", capacity_type="on-demand", price_per_hour=0.8048),
        make_offering(instance_type="g6.xlarge", zone="us-east-1a", capacity_type="spot", price_per_hour=0.41,
                      interruption_band=4),
        make_offering(instance_type="g6.xlarge", zone="us-east-1b", capacity_type="spot", price_per_hour=0.39,
                      interruption_band=4),
        make_offering(instance_type="g6.12xlarge", zone="us-east-1a", capacity_type="on-demand", price_per_hour=4.6016),
        make_offering(instance_type="g6.12xlarge", zone="us-east-1a", capacity_type="reserved",
                      price_per_hour=4.6016e-7, reservation_id="cr-1", available_count=2),
        make_offering(instance_type="g6f.large", zone="us-east-1c", capacity_type="on-demand", price_per_hour=0.202),
        make_offering(instance_type="m5.large", zone="us-east-1a", capacity_type="on-demand", price_per_hour=0.096),
    ]
    return Catalog(types, offerings)


def test_types_are_indexed_by_name() -> None:
    catalog = small_catalog()
    assert [t.name for t in catalog.instance_types()] == ["g6.12xlarge", "g6.xlarge", "g6f.large", "m5.large"]
    assert [t.name for t in catalog.gpu_types()] == ["g6.12xlarge", "g6.xlarge", "g6f.large"]
    assert catalog.instance_type("g6f.large").gpus == 0.125
    assert catalog.get("p5.48xlarge") is None
    assert "g6.xlarge" in catalog and "p5.48xlarge" not in catalog
    assert catalog.zones() == ("us-east-1a", "us-east-1b", "us-east-1c")


def test_unknown_types_are_a_typed_error() -> None:
    catalog = small_catalog()
    with pytest.raises(UnknownInstanceType, match="p5.48xlarge"):
        catalog.instance_type("p5.48xlarge")
    with pytest.raises(UnknownInstanceType):
        catalog.offerings_for("p5.48xlarge")
    with pytest.raises(UnknownInstanceType):
        catalog.offerings(instance_types=["p5.48xlarge"])


def test_an_offering_of_an_unknown_type_is_refused_at_build() -> None:
    with pytest.raises(UnknownInstanceType, match="p5.48xlarge"):
        Catalog([make_instance_type()], [make_offering(instance_type="p5.48xlarge")])


def test_offerings_for_one_type_are_cheapest_first() -> None:
    prices = [(o.zone, o.capacity_type, o.price_per_hour) for o in small_catalog().offerings_for("g6.xlarge")]
    assert prices == [("us-east-1b", "spot", 0.39), ("us-east-1a", "spot", 0.41),
                      ("us-east-1a", "on-demand", 0.8048), ("us-east-1b", "on-demand", 0.8048)]


def test_offerings_filter_by_zone_capacity_type_and_exclusions() -> None:
    catalog = small_catalog()
    found = catalog.offerings(zones={"us-east-1a"}, capacity_types={"spot", "on-demand"},
                              exclude={("g6.xlarge", "us-east-1a", "spot")})
    assert [o.key for o in found] == [("m5.large", "us-east-1a", "on-demand"),
                                      ("g6.xlarge", "us-east-1a", "on-demand"),
                                      ("g6.12xlarge", "us-east-1a", "on-demand")]
    assert {o.instance_type for o in catalog.offerings(gpu_only=True)} == {"g6.xlarge", "g6.12xlarge", "g6f.large"}
    assert [o.key for o in catalog.offerings(instance_types=["g6f.large", "g6.12xlarge"], capacity_types=["on-demand"])
            ] == [("g6f.large", "us-east-1c", "on-demand"), ("g6.12xlarge", "us-east-1a", "on-demand")]


def found(offering: Offering | None) -> Offering:
    """An offering the test knows the catalog has (its lookups answer None for none)."""
    assert offering is not None
    return offering


def test_cheapest_offering() -> None:
    catalog = small_catalog()
    cheapest = catalog.cheapest()
    assert cheapest is not None and cheapest.reservation_id == "cr-1"  # a reservation is already paid for
    assert found(catalog.cheapest(capacity_types=["on-demand", "spot"])).instance_type == "m5.large"
    assert found(catalog.cheapest("g6.xlarge", zones=["us-east-1a"], capacity_types=["spot"])).price_per_hour == 0.41
    assert catalog.cheapest("g6.xlarge", zones=["us-east-1c"]) is None


def test_offering_lookup_and_price_by_key() -> None:
    catalog = small_catalog()
    assert catalog.price(("g6.xlarge", "us-east-1b", "spot")) == 0.39
    assert found(catalog.offering(("g6.12xlarge", "us-east-1a", "reserved"))).reservation_id == "cr-1"
    assert catalog.price(("g6.xlarge", "us-east-1c", "spot")) is None


def test_without_drops_unavailable_offerings_and_keeps_types() -> None:
    catalog = small_catalog()
    smaller = catalog.without({("g6.xlarge", "us-east-1b", "spot"), ("g6.12xlarge", "us-east-1a", "reserved")})
    assert len(smaller.all_offerings()) == len(catalog.all_offerings()) - 2
    assert smaller.instance_types() == catalog.instance_types()
    assert found(smaller.cheapest("g6.xlarge")).price_per_hour == 0.41
    assert catalog.without(set()) is catalog


def test_a_record_for_a_whole_capacity_type_or_zone_excludes_all_of_it() -> None:
    catalog = small_catalog()
    assert not catalog.offerings(exclude={(ANY, ANY, "spot")}, capacity_types=["spot"])
    left = catalog.offerings(exclude={(ANY, "us-east-1a", "on-demand")}, capacity_types=["on-demand"])
    assert left and all(o.zone != "us-east-1a" for o in left)


def test_a_full_reservation_does_not_hide_another_of_the_same_type_and_zone() -> None:
    """A reservation's unavailable record names it, the reservation id where a capacity type stands: an On-Demand
    Capacity Reservation found full leaves a Capacity Block (or another ODCR) of the same type and zone on offer, as
    Karpenter marks only the reservation that failed (karpenter-provider-aws pkg/providers/instance/instance.go
    `updateUnavailableOfferingsCache`, capacity reservation provider `MarkUnavailable(ids)`). A record older code
    wrote, (type, zone, `reserved`), still stands for every reservation there until it expires."""
    p5 = make_instance_type(name="p5.48xlarge", vcpu=192, gpus=8, gpu_devices=8)
    odcr = make_offering(instance_type="p5.48xlarge", zone="us-east-1a", capacity_type="reserved",
                         price_per_hour=5.5e-6, reservation_id="cr-0aaa", reservation_type="default")
    block = make_offering(instance_type="p5.48xlarge", zone="us-east-1a", capacity_type="reserved",
                          price_per_hour=5.5e-6, reservation_id="cr-0bbb", reservation_type="capacity-block")
    catalog = Catalog([p5], [odcr, block])
    left = catalog.offerings(exclude={("p5.48xlarge", "us-east-1a", "cr-0aaa")})
    assert [o.reservation_id for o in left] == ["cr-0bbb"]
    assert not catalog.offerings(exclude={("p5.48xlarge", "us-east-1a", "reserved")})


def test_building_from_a_source() -> None:
    class Source:
        def instance_types(self) -> list:
            return [make_instance_type()]

        def offerings(self) -> list:
            return [make_offering()]

    assert [o.key for o in Catalog.from_source(Source()).all_offerings()] == [("g6.xlarge", "us-east-1a", "on-demand")]

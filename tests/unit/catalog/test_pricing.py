from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.adapters.aws.pricing import (
    OnDemandPrices,
    PriceSnapshot,
    PricesUnavailable,
    SpotAdvice,
    SpotPrices,
    parse_price_list_item,
    pricing_endpoint,
)
from gpu_autoscaler.clock import FixedClock
from tests.unit.catalog.fakes import FakeClient, client_error

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def make_snapshot(**overrides: object) -> PriceSnapshot:
    values: dict[str, object] = {
        "on_demand": {"us-east-1": {"g5.xlarge": 1.006, "g6.xlarge": 0.8048, "g6f.large": 0.202}},
        "advice": {"us-east-1": {"g5.xlarge": SpotAdvice(59, 4), "g6.xlarge": SpotAdvice(49, 4)},
                   "ca-central-1": {"p5.48xlarge": SpotAdvice(-62, 0)}},
        "on_demand_date": "2026-07-20",
        "advice_date": "2026-11-22",
    }
    values.update(overrides)
    return PriceSnapshot(**values)  # type: ignore[arg-type]


def price_list_item(instance_type: str, usd: str) -> str:
    return json.dumps({
        "product": {"attributes": {"instanceType": instance_type, "regionCode": "us-east-1"}},
        "terms": {"OnDemand": {"T1": {"priceDimensions": {"D1": {"unit": "Hrs", "pricePerUnit": {"USD": usd}}}}}},
    })


def spot_entry(instance_type: str, zone: str, price: str, hour: int = 9,
               product: str = "Linux/UNIX") -> dict[str, object]:
    return {"InstanceType": instance_type, "AvailabilityZone": zone, "SpotPrice": price,
            "ProductDescription": product, "Timestamp": NOW.replace(hour=hour)}


# The bundled snapshots


def test_bundled_snapshot_states_its_date_and_covers_us_east_1_gpu_types() -> None:
    snapshot = PriceSnapshot.load()
    assert snapshot.on_demand_date == "2026-07-20"
    assert snapshot.on_demand_regions == ("us-east-1",)
    prices = snapshot.on_demand("us-east-1")
    assert prices["g6f.large"] == 0.202
    assert prices["p5.48xlarge"] == 55.04
    assert all(name[0] in "gp" for name in prices)
    advice = snapshot.spot_advice("us-west-2")
    assert advice and all(0 <= a.interruption_band <= 4 for a in advice.values())
    assert snapshot.spot_advice("us-east-1")["g4dn.xlarge"] == SpotAdvice(64, 3)


def test_snapshot_refuses_a_region_it_does_not_cover() -> None:
    with pytest.raises(PricesUnavailable, match="eu-west-1.*covers only us-east-1"):
        PriceSnapshot.load().on_demand("eu-west-1")


# On-demand


def test_without_a_pricing_client_the_snapshot_is_used_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    prices = OnDemandPrices("us-east-1", None, make_snapshot())
    with caplog.at_level(logging.WARNING):
        first = prices.prices(["g5.xlarge", "g6f.large"])
        prices.prices(["g5.xlarge"])
    assert first == {"g5.xlarge": 1.006, "g6f.large": 0.202}
    assert prices.source == "snapshot 2026-07-20"
    assert [r.getMessage() for r in caplog.records if "Pricing API" in r.getMessage()] == [
        "no Pricing API client: on-demand prices for us-east-1 come from the bundled snapshot dated 2026-07-20"]


def test_pricing_api_answer_is_preferred_and_asked_for_with_filters() -> None:
    client = FakeClient(get_products=[{"PriceList": [price_list_item("g5.xlarge", "1.1000000000")]},
                                      {"PriceList": [price_list_item("g6.xlarge", "0.9")]}])
    prices = OnDemandPrices("us-east-1", client, make_snapshot()).prices(["g5.xlarge", "g6.xlarge"])
    assert prices == {"g5.xlarge": 1.1, "g6.xlarge": 0.9}
    (operation, call), = client.calls
    filters = {f["Field"]: (f["Type"], f["Value"]) for f in call["Filters"]}
    assert operation == "get_products" and call["ServiceCode"] == "AmazonEC2"
    assert filters["regionCode"] == ("TERM_MATCH", "us-east-1")
    assert filters["operatingSystem"] == ("TERM_MATCH", "Linux")
    assert filters["instanceType"] == ("ANY_OF", "g5.xlarge,g6.xlarge")


def test_types_the_api_does_not_price_come_from_the_snapshot() -> None:
    client = FakeClient(get_products=[{"PriceList": [price_list_item("g5.xlarge", "1.1")]}])
    source = OnDemandPrices("us-east-1", client, make_snapshot())
    assert source.prices(["g5.xlarge", "g6f.large", "p9.huge"]) == {"g5.xlarge": 1.1, "g6f.large": 0.202}
    assert source.source == "pricing-api + snapshot 2026-07-20"


def test_failing_pricing_api_falls_back_to_the_snapshot(caplog: pytest.LogCaptureFixture) -> None:
    client = FakeClient()
    client.fail("get_products", client_error())
    source = OnDemandPrices("us-east-1", client, make_snapshot())
    with caplog.at_level(logging.WARNING):
        assert source.prices(["g6.xlarge"]) == {"g6.xlarge": 0.8048}
        assert source.prices(["g6.xlarge"]) == {"g6.xlarge": 0.8048}
    assert len([r for r in caplog.records if "Pricing API unavailable" in r.getMessage()]) == 1


def test_a_region_without_api_or_snapshot_is_an_error_not_a_guess() -> None:
    client = FakeClient()
    client.fail("get_products", client_error())
    with pytest.raises(PricesUnavailable, match="no on-demand prices for eu-west-1"):
        OnDemandPrices("eu-west-1", client, make_snapshot()).prices(["g6.xlarge"])


def _unpriced(region: str, client: FakeClient | None, caplog: pytest.LogCaptureFixture) -> str:
    with caplog.at_level(logging.WARNING), pytest.raises(PricesUnavailable) as raised:
        OnDemandPrices(region, client, make_snapshot()).prices(["g6.xlarge"])
    assert "come from the bundled snapshot" not in caplog.text  # they do not: it has no prices for the region
    message = str(raised.value)
    assert message.startswith(f"no on-demand prices for {region}: ")
    assert "the bundled snapshot (dated 2026-07-20) covers only us-east-1" in message
    assert "not guessed from another region's" in message
    return message


def test_a_refused_price_list_call_says_which_permission_and_where(caplog: pytest.LogCaptureFixture) -> None:
    client = FakeClient()
    client.fail("get_products", client_error("AccessDeniedException"))
    message = _unpriced("eu-west-1", client, caplog)
    assert "pricing:GetProducts at eu-central-1 was refused (AccessDeniedException)" in message
    assert "allow pricing:GetProducts at eu-central-1" in message


def test_a_failed_price_list_call_is_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    client = FakeClient()
    client.fail("get_products", client_error("ThrottlingException"))
    message = _unpriced("ap-northeast-1", client, caplog)
    assert "pricing:GetProducts at ap-south-1 failed (ThrottlingException)" in message
    assert "asked again on the next call" in message


def test_a_price_list_that_prices_nothing_says_so(caplog: pytest.LogCaptureFixture) -> None:
    message = _unpriced("eu-west-1", FakeClient(get_products=[{"PriceList": []}]), caplog)
    assert "the Price List API at eu-central-1 priced none of them" in message
    assert "scripts/build_price_snapshots.py" in message


def test_govcloud_has_no_price_list_endpoint_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    message = _unpriced("us-gov-west-1", None, caplog)
    assert "its partition (aws-us-gov) has no Price List API endpoint" in message
    assert "scripts/build_price_snapshots.py" in message


def test_a_price_list_not_asked_says_so(caplog: pytest.LogCaptureFixture) -> None:
    message = _unpriced("eu-west-1", None, caplog)
    assert "the Price List API was not asked" in message


def test_a_region_the_api_prices_fully_needs_no_snapshot() -> None:
    client = FakeClient(get_products=[{"PriceList": [price_list_item("g6.xlarge", "0.95")]}])
    assert OnDemandPrices("eu-west-1", client, make_snapshot()).prices(["g6.xlarge"]) == {"g6.xlarge": 0.95}


def test_long_type_lists_are_split_under_the_filter_value_limit() -> None:
    names = [f"g{n}.{size}xlarge" for n in range(4, 10) for size in range(1, 30)]
    client = FakeClient(get_products=lambda **kw: [{"PriceList": [
        price_list_item(n, "1.0") for n in next(f["Value"] for f in kw["Filters"] if f["Field"] == "instanceType")
        .split(",")]}])
    prices = OnDemandPrices("us-east-1", client, make_snapshot()).prices(names)
    assert set(prices) == set(names)
    values = [next(f["Value"] for f in call["Filters"] if f["Field"] == "instanceType") for _, call in client.calls]
    assert len(values) > 1 and all(len(v) <= 1024 for v in values)


def test_bare_metal_types_are_asked_for_as_karpenter_asks_for_them() -> None:
    """Karpenter prices bare metal with a query of its own: tenancy Dedicated, productFamily "Compute Instance
    (bare metal)", the others with tenancy Shared, productFamily "Compute Instance" (karpenter-provider-aws
    pkg/providers/pricing/pricing.go, UpdateOnDemandPricing). The fake price list answers like that."""
    def answer(**kw: Any) -> list[dict[str, Any]]:
        filters = {f["Field"]: f["Value"] for f in kw["Filters"]}
        kind = (str(filters.get("tenancy")), str(filters.get("productFamily", "Compute Instance")))
        listed = {("Shared", "Compute Instance"): {"g5.xlarge": "1.1", "g4dn.xlarge": "0.6"},
                  ("Dedicated", "Compute Instance (bare metal)"): {"g4dn.metal": "8.6", "g5g.metal": "3.0"}}
        asked = filters["instanceType"].split(",")
        return [{"PriceList": [price_list_item(n, usd) for n, usd in listed.get(kind, {}).items() if n in asked]}]

    client = FakeClient(get_products=answer)
    prices = OnDemandPrices("eu-west-1", client, make_snapshot()).prices(["g5.xlarge", "g4dn.metal", "g5g.metal"])
    assert prices == {"g5.xlarge": 1.1, "g4dn.metal": 8.6, "g5g.metal": 3.0}
    asked = sorted(next(f["Value"] for f in kw["Filters"] if f["Field"] == "instanceType") for _, kw in client.calls)
    assert asked == ["g4dn.metal,g5g.metal", "g5.xlarge"]  # each type once, in the query of its kind


def test_price_list_items_without_a_positive_price_are_skipped() -> None:
    assert parse_price_list_item(price_list_item("g6.xlarge", "0.0000000000")) is None
    assert parse_price_list_item(json.dumps({"product": {"attributes": {}}})) is None
    assert parse_price_list_item(price_list_item("g6.xlarge", "0.8048")) == ("g6.xlarge", 0.8048)


# Where the Price List API is asked


@pytest.mark.parametrize(("region", "endpoint"), [
    ("us-east-1", "us-east-1"), ("us-west-2", "us-east-1"), ("ca-central-1", "us-east-1"),
    ("me-south-1", "us-east-1"), ("af-south-1", "us-east-1"), ("sa-east-1", "us-east-1"),
    ("eu-west-1", "eu-central-1"), ("eu-central-1", "eu-central-1"),
    ("ap-northeast-1", "ap-south-1"), ("ap-south-1", "ap-south-1"),
    ("cn-north-1", "cn-northwest-1"), ("cn-northwest-1", "cn-northwest-1"),
    ("us-gov-west-1", None), ("us-gov-east-1", None),
])
def test_the_price_list_is_asked_in_the_regions_partition(region: str, endpoint: str | None) -> None:
    """The Price List API answers for every region of its partition from a few endpoints: us-east-1, eu-central-1
    and ap-south-1 (aws), cn-northwest-1 (aws-cn), none in AWS GovCloud (US); of several, Karpenter's choice by
    the region's prefix (karpenter-provider-aws pkg/providers/pricing/pricing.go, NewAPI)."""
    assert pricing_endpoint(region) == endpoint


@pytest.mark.parametrize(("region", "endpoint"), [("eu-west-1", "eu-central-1"), ("cn-north-1", "cn-northwest-1"),
                                                  ("us-gov-west-1", None)])
def test_the_catalog_asks_the_price_list_where_the_partition_serves_it(
        region: str, endpoint: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, str]] = []
    make = AwsClients.client

    def client(self: AwsClients, service: str) -> Any:
        made.append((self.region, service))
        return make(self, service)

    monkeypatch.setattr(AwsClients, "client", client)
    Ec2CatalogSource.from_config(AwsClients(region))
    assert [r for r, service in made if service == "pricing"] == ([endpoint] if endpoint else [])


def test_china_regions_are_priced_in_cny_as_the_price_list_answers_there() -> None:
    """The Price List answers the China regions in CNY (no USD price), as Karpenter reads it (onDemandPage)."""
    item = json.dumps({
        "product": {"attributes": {"instanceType": "g5.xlarge", "regionCode": "cn-north-1"}},
        "terms": {"OnDemand": {"T1": {"priceDimensions": {"D1": {"unit": "Hrs", "pricePerUnit": {"CNY": "9.7"}}}}}},
    })
    client = FakeClient(get_products=[{"PriceList": [item]}])
    assert OnDemandPrices("cn-north-1", client, make_snapshot()).prices(["g5.xlarge"]) == {"g5.xlarge": 9.7}
    assert parse_price_list_item(item) is None  # no USD price: nothing in USD


# Spot


def test_latest_linux_spot_price_per_type_and_zone_is_used() -> None:
    ec2 = FakeClient(describe_spot_price_history=[{"SpotPriceHistory": [
        spot_entry("g5.xlarge", "us-east-1a", "0.41", hour=8),
        spot_entry("g5.xlarge", "us-east-1a", "0.40", hour=9),
        spot_entry("g5.xlarge", "us-east-1a", "0.10", hour=9, product="Windows"),
        spot_entry("g5.xlarge", "us-east-1b", "0.43"),
    ]}])
    spot = SpotPrices("us-east-1", ec2, make_snapshot(), FixedClock(NOW))
    quotes = spot.quotes([("g5.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1b")], {"g5.xlarge": 1.006})
    assert {k: (q.price_per_hour, q.interruption_band, q.estimated) for k, q in quotes.items()} == {
        ("g5.xlarge", "us-east-1a"): (0.40, 4, False),
        ("g5.xlarge", "us-east-1b"): (0.43, 4, False),
    }
    (_, call), = ec2.calls
    assert call["ProductDescriptions"] == ["Linux/UNIX"] and call["InstanceTypes"] == ["g5.xlarge"]


def test_without_history_spot_is_estimated_from_the_advisor() -> None:
    spot = SpotPrices("us-east-1", FakeClient(), make_snapshot(), FixedClock(NOW))
    quote = spot.quotes([("g6.xlarge", "us-east-1a")], {"g6.xlarge": 0.8048})[("g6.xlarge", "us-east-1a")]
    assert quote.estimated and quote.interruption_band == 4
    assert quote.price_per_hour == pytest.approx(0.8048 * (1 - 0.49))


def test_a_zone_without_history_where_other_zones_have_it_has_no_spot_offering(
        caplog: pytest.LogCaptureFixture) -> None:
    """DescribeSpotPriceHistory "returns the last price change before the start time" (EC2 API Reference), so
    every Spot pool has an entry: a zone missing from an answer that priced the type elsewhere has no Spot pool of it,
    and EC2 would refuse the override ("not supported in your requested Availability Zone", karpenter-provider-aws
    #2243). Karpenter likewise offers no Spot where live prices lack one (pricing.go `SpotPrice`)."""
    ec2 = FakeClient(describe_spot_price_history=[{"SpotPriceHistory": [
        spot_entry("g6.xlarge", zone, "0.3712") for zone in ("us-east-1a", "us-east-1b")]}])
    spot = SpotPrices("us-east-1", ec2, make_snapshot(), FixedClock(NOW))
    with caplog.at_level(logging.WARNING):
        quotes = spot.quotes([("g6.xlarge", z) for z in ("us-east-1a", "us-east-1b", "us-east-1c")],
                             {"g6.xlarge": 0.8048})
    assert sorted(quotes) == [("g6.xlarge", "us-east-1a"), ("g6.xlarge", "us-east-1b")]
    assert any("us-east-1c" in r.getMessage() and "g6.xlarge" in r.getMessage() for r in caplog.records)


def test_placeholder_spot_prices_are_discarded(caplog: pytest.LogCaptureFixture) -> None:
    # moto answers every type and zone with $0.00001.
    ec2 = FakeClient(describe_spot_price_history=[{"SpotPriceHistory": [
        spot_entry("g6.xlarge", "us-east-1a", "0.00001", product="Linux/UNIX (Amazon VPC)")]}])
    spot = SpotPrices("us-east-1", ec2, make_snapshot(), FixedClock(NOW))
    with caplog.at_level(logging.WARNING):
        quote = spot.quotes([("g6.xlarge", "us-east-1a")], {"g6.xlarge": 0.8048})[("g6.xlarge", "us-east-1a")]
    assert quote.estimated and quote.price_per_hour == pytest.approx(0.410448)
    assert any("below 5% of on-demand" in r.getMessage() for r in caplog.records)


def test_failing_history_falls_back_to_estimates() -> None:
    ec2 = FakeClient()
    ec2.fail("describe_spot_price_history", client_error("UnauthorizedOperation", "DescribeSpotPriceHistory"))
    spot = SpotPrices("us-east-1", ec2, make_snapshot(), FixedClock(NOW))
    quotes = spot.quotes([("g5.xlarge", "us-east-1a")], {"g5.xlarge": 1.006})
    assert quotes[("g5.xlarge", "us-east-1a")].estimated


def test_a_type_with_neither_history_nor_advice_gets_no_spot_quote() -> None:
    spot = SpotPrices("us-east-1", None, make_snapshot(), FixedClock(NOW))
    assert spot.quotes([("g6f.large", "us-east-1a")], {"g6f.large": 0.202}) == {}


def test_negative_advisor_savings_never_price_spot_above_on_demand() -> None:
    spot = SpotPrices("ca-central-1", None, make_snapshot(), FixedClock(NOW))
    quote = spot.quotes([("p5.48xlarge", "ca-central-1a")], {"p5.48xlarge": 60.0})[("p5.48xlarge", "ca-central-1a")]
    assert quote.price_per_hour == 60.0 and quote.interruption_band == 0


def test_on_demand_answers_are_reused_until_the_ttl() -> None:
    clock = FixedClock(NOW)
    client = FakeClient(get_products=[{"PriceList": [price_list_item("g6.xlarge", "0.9")]}])
    source = OnDemandPrices("us-east-1", client, make_snapshot(), clock=clock, ttl=timedelta(hours=12))
    source.prices(["g6.xlarge"])
    clock.advance(timedelta(hours=11))
    assert source.prices(["g6.xlarge"]) == {"g6.xlarge": 0.9}
    assert len(client.calls) == 1
    source.prices(["g6.xlarge", "g5.xlarge"])  # a type not asked before: fetch again
    clock.advance(timedelta(hours=13))
    source.prices(["g6.xlarge"])
    assert len(client.calls) == 3


def test_a_failed_pricing_call_is_retried_next_time() -> None:
    client = FakeClient()
    client.fail("get_products", client_error())
    source = OnDemandPrices("us-east-1", client, make_snapshot(), clock=FixedClock(NOW))
    source.prices(["g6.xlarge"])
    source.prices(["g6.xlarge"])
    assert len(client.calls) == 2


def test_a_partial_api_answer_outside_the_snapshot_regions_is_kept() -> None:
    client = FakeClient(get_products=[{"PriceList": [price_list_item("g6.xlarge", "0.95")]}])
    prices = OnDemandPrices("eu-west-1", client, make_snapshot()).prices(["g6.xlarge", "g6f.large"])
    assert prices == {"g6.xlarge": 0.95}

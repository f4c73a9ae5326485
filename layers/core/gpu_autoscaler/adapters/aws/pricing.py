"""Prices of GPU instance types: live from AWS where it answers, from bundled snapshots where it does not.

On-demand prices come from the AWS Price List API (`pricing:GetProducts`), asked at an endpoint of the priced
region's partition (`pricing_endpoint`; AWS GovCloud (US) has none); in the China regions it answers, and so
every price here is, in CNY. Bare metal types are asked for as Karpenter asks (tenancy Dedicated, productFamily
"Compute Instance (bare metal)"), the others with tenancy Shared. Spot prices come from
`ec2:DescribeSpotPriceHistory`: the latest Linux/UNIX price per instance type and zone. Where no live source
answers — the emulator (moto has no Pricing API and a placeholder spot price), a failed call, the simulator —
the snapshots built by `scripts/build_price_snapshots.py` stand in, each fallback logged once:

- on-demand: `data/ondemand-prices.json`, Karpenter's generated price table dated 2026-07-20. It covers
  us-east-1 only; for any other region `PricesUnavailable` is raised rather than guessing, because
  regional price ratios differ by family and a wrong price silently steers every packing decision.
- spot: on-demand × (1 − Spot Advisor savings %), from `data/spot-advisor.json` (every region). A type
  the advisor does not list gets no spot estimate, hence no spot offering.

The Spot Advisor's interruption band (0–4: <5% … >20%) rides along on every spot quote.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import botocore.session
from botocore.exceptions import BotoCoreError, ClientError, UnknownRegionError

from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.errors import GpuAutoscalerError

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

    from gpu_autoscaler.clock import Clock

__all__ = [
    "MIN_SPOT_FRACTION",
    "OnDemandPrices",
    "PriceSnapshot",
    "PricesUnavailable",
    "SpotAdvice",
    "SpotPrices",
    "SpotQuote",
    "WarnOnce",
    "describe_error",
    "price_currency",
    "pricing_endpoint",
]

logger = logging.getLogger(__name__)

_PRICING_DEFAULT = "us-east-1"

MIN_SPOT_FRACTION = 0.05
"""A spot price below 5% of on-demand is no market price (the Spot Advisor's deepest saving is 90%): it is
discarded and estimated instead. moto answers every DescribeSpotPriceHistory with $0.00001."""

LINUX_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
_HISTORY_BATCH = 100
_PRICING_VALUE_LIMIT = 1000
"""GetProducts takes filter values up to 1024 characters; an ANY_OF list of types is split below that."""
_VIRTUAL = ("Shared", "Compute Instance")
_BARE_METAL = ("Dedicated", "Compute Instance (bare metal)")
"""(tenancy, productFamily) of the price list entries Karpenter prices each kind of type by: bare metal has a
query of its own (karpenter-provider-aws pkg/providers/pricing/pricing.go, UpdateOnDemandPricing)."""

ON_DEMAND_TTL = timedelta(hours=12)
"""How long a fetched on-demand price list is reused (Karpenter refreshes its on-demand prices as rarely)."""

ON_DEMAND_SNAPSHOT = "ondemand-prices.json"
SPOT_ADVISOR_SNAPSHOT = "spot-advisor.json"


class PricesUnavailable(GpuAutoscalerError):
    """Neither AWS nor a bundled snapshot can price this region."""


@cache
def _partition(region: str) -> str | None:
    """`aws`, `aws-cn`, `aws-us-gov`, ...: the partition botocore's endpoint data puts `region` in."""
    try:
        return botocore.session.get_session().get_partition_for_region(region)
    except UnknownRegionError:
        return None


@cache
def pricing_endpoint(region: str) -> str | None:
    """The region whose Price List API endpoint prices `region`; None where its partition has none.

    The API is served from a few regions, each answering for every region of its partition; botocore's endpoint
    data lists them: us-east-1, eu-central-1 and ap-south-1 (aws), cn-northwest-1 (aws-cn), none in AWS GovCloud
    (US), whose credentials reach no other partition (Karpenter skips live on-demand pricing there). Of several,
    Karpenter's choice: ap-south-1 for ap-*, eu-central-1 for eu-*, else us-east-1 (karpenter-provider-aws
    pkg/providers/pricing/pricing.go, NewAPI).
    """
    partition = _partition(region)
    served = botocore.session.get_session().get_available_regions("pricing", partition) if partition else []
    if region in served:
        return region
    prefix = region.split("-", 1)[0]
    nearer = [r for r in served if r.split("-", 1)[0] == prefix]
    if nearer:
        return nearer[0]
    return _PRICING_DEFAULT if _PRICING_DEFAULT in served else next(iter(served), None)


def price_currency(region: str) -> str:
    """The currency the Price List answers `region` in: CNY in the China regions, USD elsewhere (Karpenter reads
    `pricePerUnit["CNY"]` for cn-* regions, onDemandPage). Spot prices there are in CNY too."""
    return "CNY" if _partition(region) == "aws-cn" else "USD"


def describe_error(error: BaseException) -> str:
    """A one-line account of why a call failed, for a log line (an emulator's 500 page would be noise)."""
    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = details.get("Code") or "error"
        return f"{code} (HTTP {status})" if status and str(status) != code else str(code)
    return type(error).__name__


class WarnOnce:
    """Logs each distinct fallback a single time per owner, so a Lambda's log shows it once per cold start."""

    def __init__(self, log: logging.Logger | None = None) -> None:
        self._log = log or logger
        self._seen: set[str] = set()

    def __call__(self, key: str, message: str, *args: object, level: int = logging.WARNING) -> bool:
        if key in self._seen:
            return False
        self._seen.add(key)
        self._log.log(level, message, *args)
        return True


@dataclass(frozen=True)
class SpotAdvice:
    savings_pct: int
    """Typical saving of spot versus on-demand, percent (may be negative in the source; clamped when used)."""
    interruption_band: int
    """0–4: <5%, 5–10%, 10–15%, 15–20%, >20% of instances interrupted per month."""


@dataclass(frozen=True)
class SpotQuote:
    price_per_hour: float
    interruption_band: int | None
    estimated: bool
    """True when estimated from the Spot Advisor rather than read from the spot price history."""


class PriceSnapshot:
    """The bundled price data: on-demand by region and type, and the Spot Advisor by region and type."""

    def __init__(
        self,
        on_demand: Mapping[str, Mapping[str, float]],
        advice: Mapping[str, Mapping[str, SpotAdvice]],
        on_demand_date: str = "",
        advice_date: str = "",
    ) -> None:
        self._on_demand = {region: dict(prices) for region, prices in on_demand.items()}
        self._advice = {region: dict(types) for region, types in advice.items()}
        self.on_demand_date = on_demand_date
        self.advice_date = advice_date

    @classmethod
    def load(cls) -> PriceSnapshot:
        """The snapshots shipped in the package (`gpu_autoscaler/data`)."""
        data = resources.files("gpu_autoscaler") / "data"
        on_demand = json.loads((data / ON_DEMAND_SNAPSHOT).read_text())
        advisor = json.loads((data / SPOT_ADVISOR_SNAPSHOT).read_text())
        advice = {
            region: {
                name: SpotAdvice(int(entry["savingsPct"]), int(entry["interruptionBand"]))
                for name, entry in types.items()
            }
            for region, types in advisor["regions"].items()
        }
        return cls(on_demand["regions"], advice, on_demand["date"], advisor["date"])

    @property
    def on_demand_regions(self) -> tuple[str, ...]:
        return tuple(sorted(self._on_demand))

    def covers(self, region: str) -> bool:
        return region in self._on_demand

    def on_demand(self, region: str) -> dict[str, float]:
        if region not in self._on_demand:
            raise PricesUnavailable(
                f"no on-demand prices for {region} in the bundled snapshot (dated {self.on_demand_date}): it covers "
                f"only {', '.join(self.on_demand_regions)}"
            )
        return dict(self._on_demand[region])

    def spot_advice(self, region: str) -> dict[str, SpotAdvice]:
        return dict(self._advice.get(region, {}))


class OnDemandPrices:
    """On-demand USD/hour by instance type for one region: the Pricing API first, the snapshot as fallback."""

    def __init__(
        self,
        region: str,
        pricing_client: Any | None = None,
        snapshot: PriceSnapshot | None = None,
        warn: WarnOnce | None = None,
        clock: Clock | None = None,
        ttl: timedelta = ON_DEMAND_TTL,
    ) -> None:
        self.region = region
        self.currency = price_currency(region)
        self._client = pricing_client
        self._snapshot = snapshot or PriceSnapshot.load()
        self._warn = warn or WarnOnce()
        self._clock = clock or SystemClock()
        self._ttl = ttl
        self._cached: tuple[datetime, frozenset[str], dict[str, float]] | None = None
        self.source = "none"
        """Where the last prices came from: `pricing-api`, `snapshot <date>`, or both."""

    def prices(self, instance_types: Collection[str]) -> dict[str, float]:
        """Prices of the given types; a type priced by neither source is left out (and logged once).

        An answer is reused for `ttl` when asked about the same types again: on-demand prices change
        a few times a year, and a GetProducts sweep costs seconds.
        """
        wanted = sorted(set(instance_types))
        now = self._clock.now()
        if self._cached is not None:
            at, asked, answer = self._cached
            if now - at < self._ttl and asked >= set(wanted):
                return {name: answer[name] for name in wanted if name in answer}
        answer, settled = self._fetch(wanted)
        # A failed Pricing API call is tried again next time rather than the fallback kept for hours.
        self._cached = (now, frozenset(wanted), answer) if settled else None
        return dict(answer)

    def _fetch(self, wanted: list[str]) -> tuple[dict[str, float], bool]:
        """The prices, and whether they are as good as this source gets (no failed call behind them)."""
        live: dict[str, float] = {}
        failure: ClientError | BotoCoreError | None = None
        if self._client is not None:
            try:
                live = self._from_api(self._client, wanted)
            except (ClientError, BotoCoreError) as error:
                failure = error
        missing = [name for name in wanted if name not in live]
        if not missing:
            self.source = "pricing-api"
            return live, True
        covered = self._snapshot.covers(self.region)
        if not live and not covered:
            raise self._unavailable(failure)
        if covered and failure is not None:
            self._warn(
                "pricing-api-failed",
                "Pricing API unavailable (%s): on-demand prices for %s come from the bundled snapshot dated %s",
                describe_error(failure), self.region, self._snapshot.on_demand_date,
            )
        elif covered and self._client is None:
            self._warn(
                "no-pricing-client",
                "no Pricing API client: on-demand prices for %s come from the bundled snapshot dated %s",
                self.region, self._snapshot.on_demand_date,
            )
        snapshot = self._snapshot.on_demand(self.region) if covered else {}
        found = {name: snapshot[name] for name in missing if name in snapshot}
        unpriced = [name for name in missing if name not in snapshot]
        if unpriced:
            self._warn(
                "unpriced:" + ",".join(unpriced),
                "no on-demand price for %s in %s: no on-demand offerings for them",
                ", ".join(unpriced), self.region,
            )
        snapshot_source = f"snapshot {self._snapshot.on_demand_date}"
        self.source = f"pricing-api + {snapshot_source}" if live else snapshot_source
        return {**live, **found}, failure is None

    def _unavailable(self, failure: ClientError | BotoCoreError | None) -> PricesUnavailable:
        """No price for the region from either source: what failed, and what would price it."""
        endpoint = pricing_endpoint(self.region)
        snapshot = (f"the bundled snapshot (dated {self._snapshot.on_demand_date}) covers only "
                    f"{', '.join(self._snapshot.on_demand_regions)}")
        supply = ("add the region's on-demand prices to the snapshot (data/ondemand-prices.json, which "
                  "scripts/build_price_snapshots.py builds from a CSV of region, instance type and price) and deploy "
                  "again")
        if failure is not None and describe_error(failure).startswith("AccessDenied"):
            what = f"pricing:GetProducts at {endpoint} was refused ({describe_error(failure)})"
            todo = (f"allow pricing:GetProducts at {endpoint} to this caller (a policy or SCP that holds requests "
                    f"to {self.region} must let it through), or {supply}")
        elif failure is not None:
            what = f"pricing:GetProducts at {endpoint} failed ({describe_error(failure)})"
            todo = "it is asked again on the next call"
        elif self._client is not None:
            what = f"the Price List API at {endpoint} priced none of them"
            todo = supply
        elif endpoint is None:
            what = f"its partition ({_partition(self.region)}) has no Price List API endpoint"
            todo = supply
        else:
            what = "the Price List API was not asked"
            todo = f"ask it (pricing:GetProducts at {endpoint}), or {supply}"
        return PricesUnavailable(f"no on-demand prices for {self.region}: {what}, and {snapshot}; {todo}. "
                                 "Prices are not guessed from another region's: they differ by family.")

    def _from_api(self, client: Any, instance_types: list[str]) -> dict[str, float]:
        prices: dict[str, float] = {}
        paginator = client.get_paginator("get_products")
        metal = [name for name in instance_types if _is_bare_metal(name)]
        virtual = [name for name in instance_types if not _is_bare_metal(name)]
        for names, (tenancy, family) in ((virtual, _VIRTUAL), (metal, _BARE_METAL)):
            for batch in _value_batches(names, _PRICING_VALUE_LIMIT):
                filters = [
                    {"Type": "TERM_MATCH", "Field": "regionCode", "Value": self.region},
                    {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
                    {"Type": "TERM_MATCH", "Field": "tenancy", "Value": tenancy},
                    {"Type": "TERM_MATCH", "Field": "productFamily", "Value": family},
                    {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
                    {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
                    {"Type": "TERM_MATCH", "Field": "marketoption", "Value": "OnDemand"},
                    {"Type": "ANY_OF", "Field": "instanceType", "Value": ",".join(batch)},
                ]
                for page in paginator.paginate(ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1"):
                    for item in page.get("PriceList", []):
                        parsed = parse_price_list_item(item, self.currency)
                        if parsed is not None:
                            name, price = parsed
                            prices[name] = min(price, prices.get(name, price))
        return prices


def _is_bare_metal(instance_type: str) -> bool:
    """A bare metal type: its size is `metal` or `metal-<n>xl` (g4dn.metal, m7i.metal-48xl)."""
    return instance_type.partition(".")[2].startswith("metal")


def parse_price_list_item(item: str | Mapping[str, Any], currency: str = "USD") -> tuple[str, float] | None:
    """(instance type, price/hour in `currency`) of one GetProducts PriceList entry; None for entries without a
    positive price in it."""
    product = json.loads(item) if isinstance(item, str) else item
    name = product.get("product", {}).get("attributes", {}).get("instanceType")
    if not name:
        return None
    prices = [
        float(dimension["pricePerUnit"][currency])
        for term in product.get("terms", {}).get("OnDemand", {}).values()
        for dimension in term.get("priceDimensions", {}).values()
        if currency in dimension.get("pricePerUnit", {})
    ]
    positive = [price for price in prices if price > 0]
    return (name, min(positive)) if positive else None


def _value_batches(values: list[str], limit: int) -> Iterable[list[str]]:
    batch: list[str] = []
    length = 0
    for value in values:
        if batch and length + len(value) + 1 > limit:
            yield batch
            batch, length = [], 0
        batch.append(value)
        length += len(value) + 1
    if batch:
        yield batch


class SpotPrices:
    """Spot USD/hour per instance type × zone: the latest price history, or an estimate from the Spot Advisor."""

    def __init__(
        self,
        region: str,
        ec2_client: Any | None = None,
        snapshot: PriceSnapshot | None = None,
        clock: Clock | None = None,
        warn: WarnOnce | None = None,
    ) -> None:
        self.region = region
        self._client = ec2_client
        self._snapshot = snapshot or PriceSnapshot.load()
        self._clock = clock or SystemClock()
        self._warn = warn or WarnOnce()

    def quotes(
        self, offered: Collection[tuple[str, str]], on_demand: Mapping[str, float]
    ) -> dict[tuple[str, str], SpotQuote]:
        """A quote for each offered (type, zone) that has a price; those without one are left out (logged once).

        The advisor estimates a type's price only where the history has none of it in any zone (the call failed,
        no client, or no answer for the type). A zone missing from an answer that priced the type elsewhere has no
        Spot pool of it: DescribeSpotPriceHistory "returns the last price change before the start time" (EC2 API
        Reference), so every pool has an entry, and EC2 refuses such an override ("Your requested instance type (X)
        is not supported in your requested Availability Zone (Y)", aws/karpenter-provider-aws#2243); Karpenter
        offers no Spot there either (karpenter-provider-aws pricing.go `SpotPrice`, offering `hasPrice`)."""
        advice = self._snapshot.spot_advice(self.region)
        history = self._history(sorted({name for name, _ in offered}))
        answered = {name for name, _ in history}
        quotes: dict[tuple[str, str], SpotQuote] = {}
        implausible: set[str] = set()
        unpriced: set[str] = set()
        no_pool: set[tuple[str, str]] = set()
        for name, zone in offered:
            advised = advice.get(name)
            band = advised.interruption_band if advised else None
            observed = history.get((name, zone))
            if observed is None and name in answered:
                no_pool.add((name, zone))
                continue
            reference = on_demand.get(name)
            if observed is not None and reference is not None and observed < reference * MIN_SPOT_FRACTION:
                implausible.add(name)
                observed = None
            if observed is not None:
                quotes[(name, zone)] = SpotQuote(observed, band, estimated=False)
            elif advised is not None and reference is not None:
                saving = min(max(advised.savings_pct, 0), 99) / 100
                quotes[(name, zone)] = SpotQuote(round(reference * (1 - saving), 6), band, estimated=True)
            else:
                unpriced.add(name)
        if implausible:
            self._warn(
                "spot-implausible",
                "spot price history below %d%% of on-demand for %d instance types in %s (e.g. %s): "
                "estimated from the Spot Advisor snapshot dated %s instead",
                int(MIN_SPOT_FRACTION * 100), len(implausible), self.region, min(implausible),
                self._snapshot.advice_date,
            )
        if no_pool:
            self._warn(
                "spot-no-pool:" + ",".join(f"{name}/{zone}" for name, zone in sorted(no_pool)),
                "no spot price history for %s in %s while other zones have it: no spot offerings there",
                ", ".join(f"{name} in {zone}" for name, zone in sorted(no_pool)), self.region,
            )
        if unpriced:
            self._warn(
                "spot-unpriced:" + ",".join(sorted(unpriced)),
                "no spot price history and no Spot Advisor entry for %s in %s: no spot offerings for them",
                ", ".join(sorted(unpriced)), self.region,
            )
        return quotes

    def _history(self, instance_types: list[str]) -> dict[tuple[str, str], float]:
        if self._client is None or not instance_types:
            return {}
        latest: dict[tuple[str, str], tuple[Any, float]] = {}
        start = self._clock.now() - timedelta(minutes=1)
        try:
            paginator = self._client.get_paginator("describe_spot_price_history")
            for i in range(0, len(instance_types), _HISTORY_BATCH):
                pages = paginator.paginate(
                    InstanceTypes=instance_types[i : i + _HISTORY_BATCH],
                    ProductDescriptions=["Linux/UNIX"],
                    StartTime=start,
                )
                for page in pages:
                    for entry in page.get("SpotPriceHistory", []):
                        if entry.get("ProductDescription") not in LINUX_PRODUCTS:
                            continue
                        key = (entry["InstanceType"], entry["AvailabilityZone"])
                        stamp = entry.get("Timestamp")
                        if key not in latest or (stamp is not None and stamp > latest[key][0]):
                            latest[key] = (stamp, float(entry["SpotPrice"]))
        except (ClientError, BotoCoreError) as error:
            self._warn(
                "spot-history-failed",
                "DescribeSpotPriceHistory failed (%s): spot prices in %s estimated from the Spot Advisor snapshot",
                describe_error(error), self.region,
            )
            return {}
        return {key: price for key, (_, price) in latest.items()}

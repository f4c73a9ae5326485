"""The catalog of us-east-1 built through boto3 against moto: real API shapes, bundled real type data."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest
from moto import mock_aws

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.catalog import Catalog

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="module")
def built() -> Iterator[tuple[Catalog, list[logging.LogRecord]]]:
    """One catalog for the module: moto's start-up dominates, the assertions are cheap."""
    from tests.conftest import example_config_data

    data = example_config_data()
    data["nodePools"][0]["capacityReservations"] = [
        {"id": "cr-0123456789abcdef0", "instanceType": "p5.48xlarge", "availabilityZone": "us-east-1a",
         "instanceCount": 2}]
    config: Config = parse_config(data)
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("gpu_autoscaler")
    level = logger.level
    logger.setLevel(logging.WARNING)  # a command run in this process earlier (CliRunner) may have quietened it
    logger.addHandler(handler)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1"}.items():
            patch.setenv(key, value)
        with mock_aws():
            source = Ec2CatalogSource.from_config(AwsClients("us-east-1"), config)
            catalog = source.catalog()
            catalog_again = Catalog(source.instance_types(), source.offerings())
    logger.removeHandler(handler)
    logger.setLevel(level)
    assert catalog_again.all_offerings() == catalog.all_offerings()
    yield catalog, records


def gpu(catalog: Catalog, name: str) -> tuple[Any, ...]:
    t = catalog.instance_type(name)
    return (t.gpus, t.gpu_devices, t.gpu_model, t.gpu_memory_mib)


def test_zero_gpu_types_are_corrected(built: tuple[Catalog, list[logging.LogRecord]]) -> None:
    catalog, _ = built
    assert gpu(catalog, "g6f.large") == (0.125, 1, "L4", 2861)
    assert gpu(catalog, "g6f.xlarge") == (0.125, 1, "L4", 2861)
    assert gpu(catalog, "g6f.2xlarge") == (0.25, 1, "L4", 5722)
    assert gpu(catalog, "g6f.4xlarge") == (0.5, 1, "L4", 11444)
    assert gpu(catalog, "gr6f.4xlarge") == (0.5, 1, "L4", 11444)
    assert gpu(catalog, "p5.4xlarge") == (1, 1, "H100", 81920)


def test_whole_gpu_types_come_from_the_api(built: tuple[Catalog, list[logging.LogRecord]]) -> None:
    catalog, _ = built
    assert gpu(catalog, "p5.48xlarge") == (8, 8, "H100", 655360)
    assert gpu(catalog, "g5.12xlarge") == (4, 4, "A10G", 91552)
    p5 = catalog.instance_type("p5.48xlarge")
    assert (p5.vcpu, p5.memory_mib, p5.efa, p5.max_pods) == (192, 2097152, True, 100)
    g5g = catalog.instance_type("g5g.xlarge")
    assert (g5g.architecture, g5g.gpu_model, g5g.max_pods) == ("arm64", "T4g", 58)
    assert all(t.is_gpu for t in catalog.instance_types())


def test_offerings_stay_in_the_configured_zones(built: tuple[Catalog, list[logging.LogRecord]]) -> None:
    catalog, _ = built
    assert catalog.zones() == ("us-east-1a", "us-east-1b", "us-east-1c")
    # p6-b200 is offered only in us-east-1c, g7e in a and c.
    assert {o.zone for o in catalog.offerings_for("p6-b200.48xlarge")} == {"us-east-1c"}
    assert {o.zone for o in catalog.offerings_for("g7e.2xlarge")} == {"us-east-1a", "us-east-1c"}


def test_on_demand_prices_come_from_the_snapshot(built: tuple[Catalog, list[logging.LogRecord]]) -> None:
    catalog, records = built
    assert catalog.price(("g6f.large", "us-east-1a", "on-demand")) == 0.202
    assert catalog.price(("p5.48xlarge", "us-east-1b", "on-demand")) == 55.04
    fallbacks = [r.getMessage() for r in records if "Pricing API unavailable" in r.getMessage()]
    assert len(fallbacks) == 1 and "snapshot dated 2026-07-20" in fallbacks[0]


def test_spot_is_estimated_and_carries_the_interruption_band(
    built: tuple[Catalog, list[logging.LogRecord]],
) -> None:
    catalog, _ = built
    spot = catalog.offering(("g4dn.xlarge", "us-east-1a", "spot"))
    assert spot is not None and spot.interruption_band == 3
    # on-demand 0.526 × (1 − 64%); AWS's observed us-east-1 prices are 0.18–0.20.
    assert spot.price_per_hour == pytest.approx(0.18936)
    assert catalog.offering(("g6f.large", "us-east-1a", "spot")) is None  # the advisor does not list g6f


def test_configured_reservation_becomes_a_reserved_offering(
    built: tuple[Catalog, list[logging.LogRecord]],
) -> None:
    catalog, records = built
    reserved = catalog.offerings(capacity_types=["reserved"])
    assert [(o.key, o.reservation_id, o.available_count) for o in reserved] == [
        (("p5.48xlarge", "us-east-1a", "reserved"), "cr-0123456789abcdef0", 2)]
    assert catalog.cheapest("p5.48xlarge") == reserved[0]
    assert any("DescribeCapacityReservations unavailable" in r.getMessage() for r in records)


def test_a_zero_gpu_answer_on_the_wire_is_corrected(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's data for p5.4xlarge is already right; make it answer as EC2 did (Count 0, nothing else)."""
    from moto.ec2.models.instance_types import InstanceTypeBackend

    entry = next(t for t in InstanceTypeBackend.instance_types if t["InstanceType"] == "p5.4xlarge")
    wrong = {"Gpus": [{"Name": "H100", "Manufacturer": "NVIDIA", "Count": 0, "MemoryInfo": {"SizeInMiB": 0}}],
             "TotalGpuMemoryInMiB": 0}
    monkeypatch.setitem(entry, "GpuInfo", wrong)
    with mock_aws():
        source = Ec2CatalogSource(AwsClients("us-east-1").client("ec2"), "us-east-1", zones=["us-east-1d"])
        catalog = source.catalog()
        unfixed = Ec2CatalogSource(AwsClients("us-east-1").client("ec2"), "us-east-1", zones=["us-east-1d"],
                                   overrides={})
        assert "p5.4xlarge" not in {t.name for t in unfixed.instance_types()}
    assert gpu(catalog, "p5.4xlarge") == (1, 1, "H100", 81920)
    assert catalog.price(("p5.4xlarge", "us-east-1d", "on-demand")) == 6.88

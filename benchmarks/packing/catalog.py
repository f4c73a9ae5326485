"""The real catalog of a region for benchmarks, read the way the `catalog` command reads it.

EC2's instance types and zone offerings come from moto's bundled copy of the real API data (in-process,
no network, no account) and prices from the bundled snapshots, through the same `Ec2CatalogSource` the
Lambdas use.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.catalog import Catalog

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["region_catalog"]


@cache
def _load(region: str, zones: tuple[str, ...] | None) -> Catalog:
    import boto3
    from moto import mock_aws

    from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource

    quiet = logging.getLogger("gpu_autoscaler")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with mock_aws():
            ec2 = boto3.client(
                "ec2", region_name=region, aws_access_key_id="testing", aws_secret_access_key="testing"
            )
            source = Ec2CatalogSource(ec2, region, zones=zones)
            return Catalog(source.instance_types(), source.offerings())
    finally:
        quiet.setLevel(level)


def region_catalog(region: str = "us-east-1", zones: Sequence[str] | None = None) -> Catalog:
    """Every GPU instance type and offering of `region` (all its zones unless `zones` is given)."""
    return _load(region, tuple(sorted(zones)) if zones else None)

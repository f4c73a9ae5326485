"""The offline catalog's disk cache: built once per set of inputs, rebuilt when one changes or is unreadable."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.cli.catalog_cache import cached_catalog
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.domain.catalog import Catalog
from tests.conftest import example_config_data
from tests.unit.packing.builders import TYPES, make_offerings, make_type

if TYPE_CHECKING:
    from pathlib import Path


def _config(**changes: object) -> Config:
    return parse_config({**example_config_data(), **changes})


class Builder:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> Catalog:
        self.calls += 1
        return Catalog([make_type(n) for n in TYPES], make_offerings())


@pytest.fixture(autouse=True)
def cache_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPU_AUTOSCALER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_second_run_reads_what_the_first_built() -> None:
    build = Builder()
    first = cached_catalog(_config(), build)
    second = cached_catalog(_config(), build)
    assert build.calls == 1
    assert second.instance_types() == first.instance_types()
    assert second.all_offerings() == first.all_offerings()


def test_other_zones_are_another_catalog() -> None:
    build = Builder()
    config = _config()
    cached_catalog(config, build)
    subnets = dict(list(config.network.subnets.items())[:1])
    cached_catalog(_config(network={**example_config_data()["network"], "subnets": subnets}), build)
    assert build.calls == 2


def test_a_corrupt_cache_is_rebuilt_not_an_error(cache_in: Path) -> None:
    build = Builder()
    cached_catalog(_config(), build)
    for path in cache_in.iterdir():
        path.write_text("{not json")
    assert len(cached_catalog(_config(), build).instance_types()) == len(TYPES)
    assert build.calls == 2

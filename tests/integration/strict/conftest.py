"""One embedded AWS (behind the strict layer) for the strict layer's tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="package")
def config() -> Config:
    return parse_config(example_config_data())


@pytest.fixture(scope="package")
def aws(config: Config) -> Iterator[EmbeddedAws]:
    with EmbeddedAws(config) as embedded:
        yield embedded


@pytest.fixture(scope="package")
def ec2(aws: EmbeddedAws) -> object:
    return aws.clients.client("ec2")

"""One embedded AWS and one warm fleet handler for the whole package: both modules act on the same table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from tests.conftest import ROOT, example_config_data

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType



@pytest.fixture(scope="package")
def config() -> Config:
    return parse_config(example_config_data())


@pytest.fixture(scope="package")
def aws(config: Config) -> Iterator[EmbeddedAws]:
    """The stack's resources, and the customer's EKS cluster (the emulator creates it): the configuration gives
    neither its certificate authority nor its service CIDR, so the fleet reads them from DescribeCluster."""
    with EmbeddedAws(config) as embedded:
        yield embedded


@pytest.fixture(scope="package")
def fleet(aws: EmbeddedAws) -> Iterator[ModuleType]:
    """The handler module imported as Lambda would, with the function's environment; kept warm for the package."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in aws.function_environment("fleet").items():
            patch.setenv(key, value)
        patch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
        path = Path(ROOT / "functions" / "fleet" / "handler.py")
        spec = importlib.util.spec_from_file_location("fleet_handler_under_test", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
        sys.modules.pop("fleet_handler_under_test", None)


@pytest.fixture(scope="package")
def store(aws: EmbeddedAws, config: Config) -> DynamoStateStore:
    return DynamoStateStore(aws.clients.client("dynamodb"), aws.resources.table_name, config.cluster_name,
                            clock=SystemClock())



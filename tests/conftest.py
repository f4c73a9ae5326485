"""Shared fixtures: the example configuration and small data builders with keyword overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from benchmarks import SHARED_DATA
from gpu_autoscaler.config import Config, parse_config
from tests import parallel

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent.parent
__all__ = ["ROOT", "SHARED_DATA", "example_config_data", "log_to_stdout"]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return parallel.workers()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadscope` (the default) with the scopes of `tests.parallel`; other modes as pytest-xdist has them."""
    return parallel.make_scheduler(config, log) if config.getvalue("dist") == "loadscope" else None


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may reach real AWS: fake credentials and a fixed region for every boto3 client."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture(scope="session")
def _catalog_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("catalog-cache")


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch: pytest.MonkeyPatch, _catalog_cache_dir: Path) -> None:
    """The commands' catalog cache goes to the session's temporary directory, never the user's ~/.cache."""
    monkeypatch.setenv("GPU_AUTOSCALER_CACHE_DIR", str(_catalog_cache_dir))


@pytest.fixture(autouse=True)
def _logger_levels() -> Iterator[None]:
    """Commands set process-wide log levels (`simulate` quiets `gpu_autoscaler` to ERROR), as a CLI process
    should; restored after each test so a later test's `caplog` still sees the warnings it checks."""
    import logging

    loggers = [logging.getLogger(), logging.getLogger("gpu_autoscaler")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


def example_config_data() -> dict[str, Any]:
    """The full example configuration from cdk.json, as a fresh mutable dict."""
    data: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]["gpu-autoscaler"]
    return data


@pytest.fixture
def config_data() -> dict[str, Any]:
    return example_config_data()


@pytest.fixture
def config() -> Config:
    return parse_config(example_config_data())


def log_to_stdout(function_module: Any) -> None:
    """Point a loaded handler's Powertools logger at the current `sys.stdout` (capsys's, in a test).

    Powertools loggers of one service share a standard-library logger, so every copy of a handler loaded
    earlier in the session (the emulator loads its own) left a handler bound to the stdout of its time."""
    import logging
    import sys

    for handler in function_module.logger._logger.handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sys.stdout)

"""The configuration as the functions read it: the SSM parameter the stack writes (`adapters.aws.configuration`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.aws.configuration import fetch_config
from gpu_autoscaler.config import config_digest
from gpu_autoscaler.settings import load_settings

if TYPE_CHECKING:
    import pytest

    from gpu_autoscaler.config import Config

PARAMETER = "/gpu-autoscaler/ml-prod/config"


class _Ssm:
    def __init__(self, value: str) -> None:
        self.value = value

    def get_parameter(self, Name: str) -> dict[str, Any]:  # noqa: N803 (boto3's spelling)
        assert Name == PARAMETER
        return {"Parameter": {"Name": Name, "Value": self.value}}


class _Clients:
    def __init__(self, value: str) -> None:
        self.ssm = _Ssm(value)

    def client(self, name: str) -> Any:
        assert name == "ssm"
        return self.ssm


def _read(value: str, **environment: str) -> Config:
    settings = load_settings({"TABLE_NAME": "t", "CONFIG_PARAMETER": PARAMETER, **environment})
    return fetch_config(_Clients(value), settings)  # type: ignore[arg-type]


def test_the_parameter_the_function_was_deployed_with_is_read_quietly(
        config: Config, caplog: pytest.LogCaptureFixture) -> None:
    published = config.to_json()
    with caplog.at_level(logging.WARNING):
        assert _read(published, CONFIG_DIGEST=config_digest(published)) == config
    assert not caplog.records


def test_a_parameter_of_another_deploy_is_read_with_a_warning(
        config: Config, caplog: pytest.LogCaptureFixture) -> None:
    """CloudFormation updates the parameter before the functions that reference it ("Resource B is updated before
    resource A", DependsOn attribute): a cold start between the two reads the next deploy's configuration."""
    published = config.to_json()
    with caplog.at_level(logging.WARNING):
        assert _read(published, CONFIG_DIGEST="0123456789abcdef") == config
    [record] = caplog.records
    assert PARAMETER in record.getMessage()
    assert config_digest(published) in record.getMessage() and "0123456789abcdef" in record.getMessage()

"""The configuration as the functions read it: the SSM parameter the stack writes (`adapters.aws.configuration`)."""

from __future__ import annotations

import json
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


def test_the_function_reads_a_parameter_written_by_a_newer_version(
        config: Config, caplog: pytest.LogCaptureFixture) -> None:
    """CloudFormation updates the parameter before the functions that reference it; a cold start of the old code
    in between (or a function a failed update left on it) reads the JSON the new version wrote, which holds every
    field that version added (`Config.to_json` writes defaults too). It failed the cold start ("Extra inputs are
    not permitted"): a queue's batch went back, a consolidation tick to the scheduler DLQ, the Errors alarms fired."""
    written = json.loads(config.to_json())
    assert "eksAccess" in written["kubernetes"], "defaults are written, so every new field lands in SSM"
    written["kubernetes"]["someFieldOfTheNextRelease"] = True
    with caplog.at_level(logging.WARNING):
        assert _read(json.dumps(written)) == config
    assert "kubernetes.someFieldOfTheNextRelease" in caplog.text

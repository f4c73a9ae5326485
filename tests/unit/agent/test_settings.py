from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpu_autoscaler_agent.__main__ import main, parser
from gpu_autoscaler_agent.settings import SQS_MAX_MESSAGE_BYTES, load_settings

ENV = {"CLUSTER_NAME": "ml-prod", "QUEUE_URL": "https://sqs.example/q.fifo"}


def test_the_environment_configures_the_agent_with_safe_defaults() -> None:
    settings = load_settings(ENV)
    assert (settings.cluster, settings.queue_url) == ("ml-prod", "https://sqs.example/q.fifo")
    assert settings.resync_seconds == 60 and settings.max_delay_seconds == 1.0
    assert settings.max_message_bytes == SQS_MAX_MESSAGE_BYTES
    assert settings.gpu_taint_keys == ("nvidia.com/gpu",)


def test_taint_keys_are_a_comma_separated_list() -> None:
    settings = load_settings({**ENV, "GPU_TAINT_KEYS": "nvidia.com/gpu, gpu-autoscaler/shared,"})
    assert settings.gpu_taint_keys == ("nvidia.com/gpu", "gpu-autoscaler/shared")


def test_flags_override_the_environment() -> None:
    args = vars(parser().parse_args(["--resync-seconds", "15", "--cluster", "other", "--health-port", "0"]))
    args.pop("once")
    settings = load_settings({**ENV, "RESYNC_SECONDS": "30"}, **args)
    assert (settings.resync_seconds, settings.cluster, settings.health_port) == (15.0, "other", 0)


@pytest.mark.parametrize("env", [{}, {**ENV, "MAX_MESSAGE_BYTES": str(SQS_MAX_MESSAGE_BYTES + 1)},
                                 {**ENV, "RESYNC_SECONDS": "0"}])
def test_bad_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        load_settings(env)


def test_the_command_reports_bad_settings_and_exits_2(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for variable in ("CLUSTER_NAME", "QUEUE_URL"):
        monkeypatch.delenv(variable, raising=False)
    assert main([]) == 2
    assert "cluster" in capsys.readouterr().err

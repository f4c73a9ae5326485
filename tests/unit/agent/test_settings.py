from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpu_autoscaler_agent.__main__ import main, parser
from gpu_autoscaler_agent.settings import SQS_MAX_MESSAGE_BYTES, load_settings

QUEUE = "https://sqs.eu-west-1.amazonaws.com/123456789012/ml-prod-gpu-autoscaler-pending-pods.fifo"
ENV = {"CLUSTER_NAME": "ml-prod", "QUEUE_URL": QUEUE}


def test_the_environment_configures_the_agent_with_safe_defaults() -> None:
    settings = load_settings(ENV)
    assert (settings.cluster, settings.queue_url) == ("ml-prod", QUEUE)
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


@pytest.mark.parametrize(("host", "region"), [
    ("sqs.eu-west-1.amazonaws.com", "eu-west-1"),  # what CreateQueue and GetQueueUrl answer
    ("sqs.cn-north-1.amazonaws.com.cn", "cn-north-1"),
    ("sqs-fips.us-gov-west-1.amazonaws.com", "us-gov-west-1"),
    ("sqs.ap-southeast-7.api.aws", "ap-southeast-7"),  # dual-stack
    ("eu-central-1.queue.amazonaws.com", "eu-central-1"),  # legacy
    ("queue.amazonaws.com", "us-east-1"),  # legacy, US East (N. Virginia)
])
def test_the_region_is_the_queue_urls(host: str, region: str) -> None:
    """botocore sends SendMessage to its client's region whatever QueueUrl says, and a queue of another region is
    answered AWS.SimpleQueueService.NonExistentQueue, which the sender retries for ever: the region is the
    queue's, not a default of us-east-1."""
    settings = load_settings({**ENV, "QUEUE_URL": f"https://{host}/123456789012/q.fifo"})
    assert settings.region == region


def test_a_region_that_agrees_with_the_queue_url_is_accepted() -> None:
    assert load_settings({**ENV, "AWS_REGION": "eu-west-1"}).region == "eu-west-1"


def test_a_region_that_contradicts_the_queue_url_is_refused_naming_both() -> None:
    with pytest.raises(ValidationError) as refused:
        load_settings({**ENV, "AWS_REGION": "us-east-1"})
    assert "us-east-1" in str(refused.value) and "eu-west-1" in str(refused.value)
    assert "AWS_REGION" in str(refused.value) and "QUEUE_URL" in str(refused.value)


def test_a_queue_url_that_names_no_region_needs_one() -> None:
    """An endpoint of one's own (moto, the emulator) names no region in its queue URLs."""
    local = {**ENV, "QUEUE_URL": "http://127.0.0.1:5000/123456789012/q.fifo", "AWS_ENDPOINT_URL": "http://127.0.0.1:5000"}
    with pytest.raises(ValidationError, match="AWS_REGION"):
        load_settings(local)
    assert load_settings({**local, "AWS_REGION": "eu-west-1"}).region == "eu-west-1"


def test_the_command_refuses_a_contradicting_region_and_exits_2(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for variable, value in {**ENV, "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(variable, value)
    assert main([]) == 2
    assert "contradicts" in capsys.readouterr().err

"""The emulator's Lambda host: the context a handler gets counts down from the function's timeout, the stack's
unless the host is given a shorter one (the chaos rig's, with its shorter queue visibility)."""

from __future__ import annotations

import contextlib
import io
from typing import TYPE_CHECKING

from aws_lambda_powertools import Logger

from gpu_autoscaler.emulator.isolation import forget_foreign_logger
from gpu_autoscaler.emulator.lambdas import LambdaHost

if TYPE_CHECKING:
    from pathlib import Path

    from gpu_autoscaler.emulator.aws import EmbeddedAws

REMAINING = "def handler(event, context):\n    return {'remainingMs': context.get_remaining_time_in_millis()}\n"


def test_a_function_timeout_given_to_the_host_replaces_the_stacks(aws: EmbeddedAws, tmp_path: Path) -> None:
    (tmp_path / "interruption").mkdir()
    (tmp_path / "interruption" / "handler.py").write_text(REMAINING)

    stacks = LambdaHost(aws, functions_dir=tmp_path).invoke("interruption", {})
    shortened = LambdaHost(aws, functions_dir=tmp_path, timeouts={"interruption": 7}).invoke("interruption", {})

    assert stacks.ok and shortened.ok, (stacks.error, shortened.error)
    assert 7_000 < stacks.response["remainingMs"] <= 60_000
    assert 0 < shortened.response["remainingMs"] <= 7_000


LOGS = (
    "from aws_lambda_powertools import Logger\n"
    "logger = Logger(service='interruption')\n"
    "def handler(event, context):\n"
    "    logger.info('notice acted on')\n"
    "    return {}\n"
)


def test_a_functions_log_goes_to_its_stream_when_its_logger_was_made_earlier_in_the_process(
    aws: EmbeddedAws, tmp_path: Path
) -> None:
    """Each Lambda environment is a fresh process: a Powertools Logger made earlier in this one (a test importing
    the handler directly, under the runner's captured stdout) must not carry its stream into the environment."""
    (tmp_path / "interruption").mkdir()
    (tmp_path / "interruption" / "handler.py").write_text(LOGS)
    elsewhere, stream = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(elsewhere):
        Logger(service="interruption").info("imported directly")
    try:
        invocation = LambdaHost(aws, functions_dir=tmp_path, log_stream=stream).invoke("interruption", {})

        assert invocation.ok, invocation.error
        assert "notice acted on" in stream.getvalue()
        assert "notice acted on" not in elsewhere.getvalue()
    finally:
        forget_foreign_logger("interruption")  # no logger left bound to this test's private stream


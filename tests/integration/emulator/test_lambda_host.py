"""The emulator's Lambda host: the context a handler gets counts down from the function's timeout, the stack's
unless the host is given a shorter one (the chaos rig's, with its shorter queue visibility)."""

from __future__ import annotations

from typing import TYPE_CHECKING

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

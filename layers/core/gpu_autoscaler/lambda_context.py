"""A Lambda context for running a handler outside Lambda (`invoke`, the emulator, tests).

Powertools reads it: the Logger's function fields, idempotency's remaining time. It counts down from
the function's timeout like the real one, so a handler that checks its remaining time behaves as it
would in Lambda.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.clock import SystemClock

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.clock import Clock

__all__ = ["DEFAULT_ACCOUNT", "LocalLambdaContext", "local_context"]

DEFAULT_ACCOUNT = "123456789012"
"""moto's account, and the one the example configuration's ARNs use."""


@dataclass
class LocalLambdaContext:
    """The attributes and method of `awslambdaric`'s LambdaContext that handlers and Powertools use."""

    function_name: str
    invoked_function_arn: str
    memory_limit_in_mb: int
    aws_request_id: str
    log_group_name: str
    log_stream_name: str
    timeout_seconds: float
    function_version: str = "$LATEST"
    identity: Any = None
    client_context: Any = None
    tenant_id: str | None = None
    monotonic: Callable[[], float] = field(default=time.monotonic, repr=False)
    _deadline: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._deadline = self.monotonic() + self.timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self.monotonic()) * 1000))


def local_context(
    function_name: str,
    *,
    region: str = "us-east-1",
    account: str = DEFAULT_ACCOUNT,
    timeout_seconds: float = 60.0,
    memory_mb: int = 1024,
    clock: Clock | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> LocalLambdaContext:
    """A fresh context per invocation: new request id, a log stream named the way Lambda names them."""
    today = (clock or SystemClock()).now().strftime("%Y/%m/%d")
    return LocalLambdaContext(
        function_name=function_name,
        invoked_function_arn=f"arn:aws:lambda:{region}:{account}:function:{function_name}",
        memory_limit_in_mb=memory_mb,
        aws_request_id=str(uuid.uuid4()),
        log_group_name=f"/aws/lambda/{function_name}",
        log_stream_name=f"{today}/[$LATEST]{uuid.uuid4().hex}",
        timeout_seconds=timeout_seconds,
        monotonic=monotonic,
    )

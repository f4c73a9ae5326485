"""Injected faults: what AWS answers when it is having a bad day, switched on by a test (chaos suite).

Off unless a test enables a rule (`throttling`). While one is on, a share of the named actions is refused
before any other rule or moto sees it, in AWS's own words:

- EC2 request throttling. Source: Amazon EC2 API Reference, "Error codes for the Amazon EC2 API"
  (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html), RequestLimitExceeded:
  "The maximum request rate permitted by the Amazon EC2 APIs has been exceeded for your account." HTTP 503
  ("Request throttling for the Amazon EC2 API", https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html).

The draw is seeded, so a scenario replays; `counts` says how many requests were seen and refused.
"""

from __future__ import annotations

import random
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_autoscaler.emulator.strict.core import AwsRequest, Refusal, check

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["THROTTLED_EC2_ACTIONS", "Throttling", "throttling"]

THROTTLED_EC2_ACTIONS = (
    "CreateFleet", "TerminateInstances", "DescribeInstances", "CreateTags", "DescribeInstanceTypes",
    "DescribeInstanceTypeOfferings", "DescribeSpotPriceHistory", "DescribeSubnets", "DescribeSecurityGroups",
    "DescribeLaunchTemplates", "DescribeLaunchTemplateVersions", "DescribeImages",
)
"""The EC2 actions the functions and the emulator call (a throttled account throttles them all)."""


@dataclass
class Throttling:
    rate: float
    seed: int
    seen: int = 0
    refused: int = 0
    _rng: random.Random = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def draw(self) -> bool:
        with self._lock:
            self.seen += 1
            refuse = self._rng.random() < self.rate
            self.refused += refuse
            return refuse


_active: list[Throttling] = []


@contextmanager
def throttling(rate: float, seed: int = 0) -> Iterator[Throttling]:
    """Within the block, refuse `rate` of the EC2 requests above with RequestLimitExceeded."""
    if not 0 <= rate <= 1:
        raise ValueError(f"rate must be within [0, 1], got {rate}")
    rule = Throttling(rate, seed)
    _active.append(rule)
    try:
        yield rule
    finally:
        _active.remove(rule)


@check("ec2", *THROTTLED_EC2_ACTIONS)
def _throttled(request: AwsRequest) -> None:
    for rule in list(_active):
        if rule.draw():
            raise Refusal("RequestLimitExceeded", "Request limit exceeded.", status=503)

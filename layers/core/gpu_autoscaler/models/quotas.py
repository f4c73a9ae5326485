"""What the account's vCPU usage metrics last showed, per quota key."""

from __future__ import annotations

from datetime import datetime  # noqa: TC003 (a NamedTuple's field types are read at run time)
from typing import NamedTuple

__all__ = ["UsageReading"]


class UsageReading(NamedTuple):
    """One quota's usage as its CloudWatch usage metric showed it: the vCPUs the whole account (every instance of
    the quota's class and purchase option, this cluster's too) had in use at `at`, its latest datapoint's time."""

    vcpus: int
    at: datetime

"""Duration strings as people write them in configuration: `30s`, `8m`, `9h`, `14d`, `1h30m`."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

__all__ = ["Duration", "format_duration", "parse_duration"]

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: object) -> timedelta:
    """Accept a timedelta, a number of seconds, or a Go-style duration string."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as '10m', got {value!r}")
    text = value.strip()
    pos, seconds = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"'{value}' is not a duration; use forms like '30s', '10m', '9h', '14d' or '1h30m'")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """The shortest exact string for a duration, so configuration round-trips."""
    total = int(value.total_seconds())
    if total == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


Duration = Annotated[timedelta, BeforeValidator(parse_duration), PlainSerializer(format_duration, return_type=str)]

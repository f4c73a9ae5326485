"""The scaling window a person would set from the trace's daily profile, for the windows-only policy.

Arrivals (GPUs asked for per hour of day, over the replayed stretch) are smoothed over three hours
(circularly, the day wraps) and the longest run of hours at or above the daily mean is the window: it
opens at the run's first hour and lasts the run, every day, in UTC (the trace's clock). Its warm GPUs
are the given quantile (the forecast's, 0.9) of the demand sampled every 5 minutes inside those hours,
rounded up, of what lands on warm capacity: at each 5-minute bucket inside a day's window, the GPUs of
the pods that arrived since that window opened and are still there (pods running from before the window
stay on the capacity they had, and warm capacity counts only the pods that land on it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from benchmarks.prewarm.trace import Trace

__all__ = ["DerivedWindow", "derive_window"]


@dataclass(frozen=True)
class DerivedWindow:
    start_hour: int
    hours: int
    gpus: int
    hourly_arrivals: tuple[float, ...]

    def config(self, pool: str) -> dict[str, object]:
        return {"name": "trace-peak", "schedule": f"cron(0 {self.start_hour} * * ? *)", "timezone": "UTC",
                "duration": f"{self.hours}h", "nodePool": pool, "warm": {"gpus": self.gpus}}

    def describe(self) -> str:
        end = (self.start_hour + self.hours) % 24
        return (f"daily {self.start_hour:02d}:00–{end:02d}:00 UTC ({self.hours} h), {self.gpus} warm GPUs "
                f"— cron(0 {self.start_hour} * * ? *)")


def derive_window(trace: Trace, start: float, end: float, quantile: float = 0.9) -> DerivedWindow:
    inside = (trace.arrival >= start) & (trace.arrival < end)
    days = (end - start) / 86400
    hour = ((trace.arrival[inside] % 86400) // 3600).astype(int)
    per_hour = np.bincount(hour, weights=trace.gpus[inside], minlength=24) / days
    smooth = (np.roll(per_hour, 1) + per_hour + np.roll(per_hour, -1)) / 3
    above = smooth >= smooth.mean()
    best_start, best_length = int(np.argmax(smooth)), 1
    for first in range(24):
        if not above[first] or above[(first - 1) % 24]:
            continue
        length = 0
        while length < 24 and above[(first + length) % 24]:
            length += 1
        if length > best_length:
            best_start, best_length = first, length
    samples = np.arange(start, end, 300.0)
    offset = (samples - best_start * 3600) % 86400
    inside_window = offset < best_length * 3600
    samples, opened = samples[inside_window], samples[inside_window] - offset[inside_window]
    levels = np.array([_arrived_since(trace, t0, t) for t0, t in zip(opened, samples, strict=True)])
    level = float(np.quantile(levels, quantile))
    return DerivedWindow(best_start, best_length, math.ceil(level), tuple(float(x) for x in per_hour))


def _arrived_since(trace: Trace, opened: float, moment: float) -> float:
    lo, hi = np.searchsorted(trace.arrival, [opened, moment], side="right")
    alive = trace.departure[lo:hi] > moment
    return float(trace.gpus[lo:hi][alive].sum())

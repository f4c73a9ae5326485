"""The Alibaba GPU trace (cluster-trace-gpu-v2023, `openb_pod_list_*.csv`) as GPU demand over time.

Each pod asks for `num_gpu × gpu_milli / 1000` GPUs (a fractional GPU is a share of one) from its
`creation_time` to its `deletion_time` (seconds from the trace's t = 0). Pods asking for no GPU are
dropped. The trace's t = 0 is mapped to `EPOCH`, Monday 5 January 2026 00:00 UTC, so time of day and day
of week are the trace's own clock read as UTC.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np

from benchmarks import ALIBABA_TRACE

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["DEFAULT_TRACE", "EPOCH", "Trace", "load_trace"]

EPOCH = datetime(2026, 1, 5, tzinfo=UTC)
DEFAULT_TRACE = ALIBABA_TRACE


@dataclass(frozen=True)
class Trace:
    arrival: np.ndarray
    """Seconds from EPOCH, sorted."""
    departure: np.ndarray
    gpus: np.ndarray

    def at(self, seconds: float) -> datetime:
        return EPOCH + timedelta(seconds=float(seconds))

    def demand(self, times: np.ndarray) -> np.ndarray:
        """GPUs asked for (created, not yet deleted) at each of `times` (seconds)."""
        moments = np.concatenate([self.arrival, self.departure])
        deltas = np.concatenate([self.gpus, -self.gpus])
        order = np.argsort(moments, kind="stable")
        level = np.cumsum(deltas[order])
        index = np.searchsorted(moments[order], times, side="right") - 1
        return np.where(index >= 0, level[np.maximum(index, 0)], 0.0)


def load_trace(path: Path | str = DEFAULT_TRACE) -> Trace:
    arrival, departure, gpus = [], [], []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            asked = int(row["num_gpu"]) * int(row["gpu_milli"]) / 1000
            if asked <= 0 or not row["deletion_time"]:
                continue
            arrival.append(float(row["creation_time"]))
            departure.append(float(row["deletion_time"]))
            gpus.append(asked)
    order = np.argsort(arrival, kind="stable")
    return Trace(np.array(arrival)[order], np.array(departure)[order], np.array(gpus)[order])

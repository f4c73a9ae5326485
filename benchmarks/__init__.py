"""Benchmarks: figures printed, not asserted.

`python -m benchmarks` lists them; `python -m benchmarks NAME [ARGS]` runs one.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ALIBABA_TRACE", "SHARED_DATA"]


def _shared_data() -> Path:
    """The data others wrote (traces, prices, AWS event payloads): `GPU_AUTOSCALER_SHARED_DATA`, else the
    `shared/data` beside this checkout, else the workplace's own copy (a clone made elsewhere)."""
    given = os.environ.get("GPU_AUTOSCALER_SHARED_DATA")
    if given:
        return Path(given)
    beside = Path(__file__).resolve().parents[2] / "shared" / "data"
    workplace = Path("/work/shared/data")
    return beside if beside.is_dir() or not workplace.is_dir() else workplace


SHARED_DATA = _shared_data()
ALIBABA_TRACE = SHARED_DATA / "traces" / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"

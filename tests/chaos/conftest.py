"""The chaos suite (issue 19): faults injected into the running emulator, the same invariants checked after each.

`pytest -m chaos tests/chaos` runs the CI variant (fixed seeds, a few minutes); `GPU_AUTOSCALER_CHAOS_SOAK=1`
adds random seeds and the long scenarios.
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

import pytest

from tests.chaos.rig import SOAK_GC_GRACE, chaos_config, running_rig

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.chaos.rig import ChaosRig

SOAK = os.environ.get("GPU_AUTOSCALER_CHAOS_SOAK", "") not in ("", "0", "false")
SOAK_TEST_TIMEOUT = 3600
"""Seconds a soak test may run (pytest-timeout's default here is 300 s, which the CI variant keeps)."""


def seeds(fixed: int = 0, extra: int = 3) -> list[int]:
    """The fixed seed, and with the soak flag `extra` random ones (printed in the test id, so a failure replays)."""
    if not SOAK:
        return [fixed]
    return [fixed, *(random.randrange(1, 10_000) for _ in range(extra))]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.chaos)
            item.add_marker(pytest.mark.slow)
            if SOAK:  # the sizes take tens of minutes on a loaded machine; every wait has its own bound
                item.add_marker(pytest.mark.timeout(SOAK_TEST_TIMEOUT))


@pytest.fixture(scope="package")
def rig() -> Iterator[ChaosRig]:
    """One running emulator for the suite (starting one costs ~15 s); every scenario gives everything back. The
    soak's garbage-collection grace is the soak's for the whole session (it is configuration the functions load);
    the soak's queue visibility only for the scenarios at the issue's sizes (`ChaosRig.soak_visibility`)."""
    with running_rig(chaos_config(gc_grace=SOAK_GC_GRACE) if SOAK else None) as running:
        yield running

"""How the suite is spread over pytest-xdist's workers (`-n auto --dist loadscope`, pyproject's `addopts`).

A scope is a unit of work one worker runs whole, in collection order: by default a test file (its module-scoped
fixtures are built once, its tests keep their order). Directories whose tests share a package- or session-scoped
setup are one scope each, so that setup is paid once. The chaos scenarios are two scopes (lanes), each with its own
emulator: they mostly wait on the emulator's clocks, and two lanes beside the busy workers halve the suite's longest
chain. Scopes are handed out in collection order (`--no-loadscope-reorder`), so the long, waiting ones (tests/chaos,
tests/e2e) start first and the short unit files fill the workers at the end.

The grouping is computed from the node ids here, not with `xdist_group` marks: pytest 9.2's structured node ids
silently defeat `--dist loadgroup` in pytest-xdist 3.8 (pytest-dev/pytest-xdist#1386).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

SHARED_SETUP = ("tests/infrastructure", "tests/integration/fleet", "tests/integration/interruption",
                "tests/integration/strict")
"""The infrastructure tests' synth (a jsii runtime and the whole app, once per process); the others' embedded AWS
and warm handlers, shared by the modules of their package."""

CHAOS_LANES = {
    "test_spot_warning_storm.py": "chaos-a", "test_outage.py": "chaos-a", "test_skew.py": "chaos-a",
    "test_throttling.py": "chaos-a", "test_invariants.py": "chaos-a",
    "test_crashes.py": "chaos-b", "test_capacity_storms.py": "chaos-b", "test_deliveries.py": "chaos-b",
    "test_conflicts.py": "chaos-b",
}
"""Each chaos file's lane, balanced by the scenarios' measured times; a new file goes to the first lane."""


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to (node ids are relative to the repository's root)."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/chaos/"):
        return CHAOS_LANES.get(path.rsplit("/", 1)[1], "chaos-a")
    return next((shared for shared in SHARED_SETUP if path.startswith(f"{shared}/")), path)


def workers() -> int:
    """`-n auto`: cores + 1, at most six. The two chaos lanes use ~0.4 of a core each (the scenarios wait on the
    emulator's clocks), so on 2 cores the third worker keeps the CPU-bound tests going without oversubscribing it:
    the timing-sensitive tests (chaos, e2e, the demo's step timeouts) then get the CPU they get when run alone. More
    workers only add collections (each worker collects the whole suite, aws-cdk's jsii runtime included)."""
    return min((os.cpu_count() or 1) + 1, 6)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scope scheduler with `scope_of` as its scopes."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedSetupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return SharedSetupScheduling(config, log)

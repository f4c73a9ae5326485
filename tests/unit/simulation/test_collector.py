"""The replay's garbage-collector settings: rarer full collections while a policy runs, the caller's back after."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.simulation.engine import REPLAY_COLLECTOR_THRESHOLDS, PolicyRun
from gpu_autoscaler.simulation.policies import build_policy
from tests.unit.simulation.builders import make_catalog, make_config, make_pod, make_trace, settings

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

DEFAULT = (700, 10, 10)
"""CPython's own thresholds."""


@pytest.fixture
def default_collector() -> Iterator[None]:
    kept = gc.get_threshold()
    gc.set_threshold(*DEFAULT)
    yield
    gc.set_threshold(*kept)


def _run(progress: Callable[[float], None]) -> PolicyRun:
    catalog = make_catalog(spot=False)
    trace = make_trace(*(make_pod(i, arrival=i * 4000.0, duration=3600.0) for i in range(3)))
    return PolicyRun(build_policy("ours", make_config(), catalog, trace.pods), trace, catalog, settings(),
                     progress=progress)


@pytest.mark.usefixtures("default_collector")
def test_a_replay_runs_with_rarer_full_collections_and_gives_the_callers_back_after() -> None:
    seen: list[tuple[int, ...]] = []
    _run(lambda _: seen.append(gc.get_threshold())).run()
    assert seen, "the replay reported progress while it ran"
    assert set(seen) == {REPLAY_COLLECTOR_THRESHOLDS}
    assert REPLAY_COLLECTOR_THRESHOLDS[2] > DEFAULT[2], "full collections rarer than CPython's"
    assert gc.get_threshold() == DEFAULT


@pytest.mark.usefixtures("default_collector")
def test_a_replay_that_fails_gives_the_callers_collector_back_too() -> None:
    def fail(_: float) -> None:
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        _run(fail).run()
    assert gc.get_threshold() == DEFAULT

"""One tick at a time of a scheduled function, by a lease in the state table rather than reserved concurrency.

A tick takes the function's lease until now + the function's timeout, does its work and gives the lease back; a
tick that finds it held skips, logged and reported, and returns normally (an error would have Lambda retry it).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from gpu_autoscaler.adapters.memory.tick_leases import MemoryTickLeases
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.models.leases import Lease
from gpu_autoscaler.services.tick_lease import TickLease, TickSkipped
from gpu_autoscaler.wiring import FUNCTION_WIRING

START = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TIMEOUT = timedelta(seconds=FUNCTION_WIRING["consolidate"].timeout_seconds)


def rig() -> tuple[FixedClock, MemoryTickLeases, TickLease]:
    clock = FixedClock(START)
    leases = MemoryTickLeases()
    return clock, leases, TickLease(leases, "consolidate", clock)


def test_a_tick_holds_the_lease_until_its_timeout_while_it_works_and_gives_it_back() -> None:
    clock, leases, lease = rig()
    seen: list[Lease | None] = []
    result = lease.run("request-1", lambda: seen.append(leases.take(Lease("consolidate", "probe", START), START)))
    assert result is None
    assert seen == [Lease("consolidate", "request-1", START + TIMEOUT)]
    assert leases.take(Lease("consolidate", "request-2", START + TIMEOUT), START) is None  # given back


def test_a_tick_that_finds_the_lease_held_skips_logging_the_holder_and_its_expiry(
        caplog: pytest.LogCaptureFixture) -> None:
    clock, leases, lease = rig()
    ran: list[str] = []

    def first() -> str:
        clock.advance(timedelta(seconds=20))
        with caplog.at_level(logging.INFO, logger="gpu_autoscaler.services.tick_lease"):
            second = lease.run("request-2", lambda: ran.append("second"))
        assert isinstance(second, TickSkipped)
        assert second.held == Lease("consolidate", "request-1", START + TIMEOUT)
        assert second.summary() == {"skipped": True, "leaseHolder": "request-1",
                                    "leaseExpiresAt": (START + TIMEOUT).isoformat()}
        ran.append("first")
        return "first"

    assert lease.run("request-1", first) == "first"
    assert ran == ["first"]
    [record] = [r for r in caplog.records if r.name == "gpu_autoscaler.services.tick_lease"]
    assert record.levelno == logging.INFO
    assert "request-1" in record.getMessage() and (START + TIMEOUT).isoformat() in record.getMessage()


def test_a_crashed_ticks_lease_is_taken_over_once_it_expires() -> None:
    clock, leases, lease = rig()
    assert leases.take(Lease("consolidate", "crashed", START + TIMEOUT), START) is None  # never given back
    clock.advance(TIMEOUT - timedelta(seconds=1))
    assert isinstance(lease.run("request-2", lambda: "ran"), TickSkipped)
    clock.advance(timedelta(seconds=2))
    assert lease.run("request-3", lambda: "ran") == "ran"


def test_a_tick_that_fails_gives_the_lease_back_and_its_error_stands() -> None:
    clock, leases, lease = rig()

    def fails() -> None:
        raise RuntimeError("the Kubernetes API is down")

    with pytest.raises(RuntimeError, match="API is down"):
        lease.run("request-1", fails)
    assert lease.run("request-2", lambda: "ran") == "ran"


def test_a_tick_whose_lease_was_taken_over_leaves_the_new_holders_lease_alone(
        caplog: pytest.LogCaptureFixture) -> None:
    """Only if a tick outlived its lease (a clock gone wrong: Lambda ends it at its timeout, the lease's end)."""
    clock, leases, lease = rig()

    def overruns() -> None:
        clock.advance(TIMEOUT + timedelta(seconds=1))
        assert lease.run("request-2", lambda: "ran") == "ran"  # took the expired lease, gave it back
        assert leases.take(Lease("consolidate", "request-3", clock.now() + TIMEOUT), clock.now()) is None

    with caplog.at_level(logging.WARNING, logger="gpu_autoscaler.services.tick_lease"):
        lease.run("request-1", overruns)
    assert leases.take(Lease("consolidate", "request-4", clock.now()), clock.now()) == Lease(
        "consolidate", "request-3", clock.now() + TIMEOUT)
    assert any("request-1" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_a_tick_holds_the_lease_no_longer_than_its_invocation_may_run() -> None:
    """Lambda stops an invocation at its timeout, counted from its start: what is left of it when the tick begins
    (`get_remaining_time_in_millis`) is the most the holder can live. A tick that crashed, or was stopped, frees the
    lease then, not a whole function timeout later (an invocation shorter than the function's, or one that spent
    part of its time before the tick, would otherwise keep the next ticks out past its own end)."""
    clock, leases, lease = rig()

    def crash() -> None:
        raise TimeoutError("stopped")

    leases_release = leases.release
    leases.release = lambda lease: False  # type: ignore[method-assign]  # the invocation died: nothing gave it back
    with pytest.raises(TimeoutError):
        lease.run("request-1", crash, remaining=timedelta(seconds=6))
    leases.release = leases_release  # type: ignore[method-assign]
    clock.advance(timedelta(seconds=7))
    assert lease.run("request-2", lambda: "ran") == "ran"

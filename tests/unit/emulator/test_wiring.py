"""The shared wiring: the numbers the stack and the emulator both read."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from gpu_autoscaler.naming import FUNCTIONS
from gpu_autoscaler.wiring import (
    FUNCTION_WIRING,
    QUEUES,
    RATE_SCHEDULES,
    SCHEDULED_TIME,
    consumer,
    rate_period,
    schedule_name,
    tick_input,
    visibility_timeout,
)


def test_every_queue_feeds_exactly_one_function_and_the_rest_are_scheduled() -> None:
    assert sorted(w.queue for w in FUNCTION_WIRING.values() if w.queue) == sorted(QUEUES)
    scheduled = {w.name for w in FUNCTION_WIRING.values() if w.queue is None}
    assert scheduled == {r.function for r in RATE_SCHEDULES}
    assert tuple(FUNCTION_WIRING) == FUNCTIONS


def test_visibility_is_six_times_the_consumer_timeout() -> None:
    assert consumer("drain").name == "drain"
    assert visibility_timeout("drain") == 6 * FUNCTION_WIRING["drain"].timeout_seconds
    with pytest.raises(KeyError, match="no function consumes"):
        consumer("nowhere")


def test_rate_periods_come_from_the_expressions() -> None:
    assert rate_period("prewarm") == timedelta(minutes=5)
    assert rate_period("consolidate") == timedelta(minutes=1)
    with pytest.raises(KeyError):
        rate_period("packer")


def test_tick_inputs_carry_the_scheduled_time_placeholder() -> None:
    assert json.loads(tick_input(None)) == {"trigger": "rate", "scheduledTime": SCHEDULED_TIME}
    assert json.loads(tick_input("peak"))["window"] == "peak"
    assert len(schedule_name("w" * 100)) <= 64

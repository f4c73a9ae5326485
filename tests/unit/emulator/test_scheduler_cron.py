"""The emulator's EventBridge Scheduler cron (`emulator.scheduler_cron`) against the documentation's daylight
saving time rules, and the project's window code (`domain.windows`) against it: the emulator is the witness.

EventBridge Scheduler User Guide, "Schedule types", "Daylight saving time on EventBridge Scheduler": a cron time
that does not exist when clocks go forward is skipped; one that occurs twice when they go back runs once.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gpu_autoscaler.config import ScalingWindow
from gpu_autoscaler.domain.windows import CronExpression, WindowSchedule
from gpu_autoscaler.emulator.scheduler_cron import SchedulerCron

NEW_YORK = "America/New_York"
# 2026: clocks go forward on Sunday 8 March at 02:00 (to 03:00), back on Sunday 1 November at 02:00 (to 01:00).
SPRING = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
AUTUMN = datetime(2026, 11, 1, 6, 0, tzinfo=UTC)


def occurrences(expression: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    cron = SchedulerCron.parse(expression, zone)
    found, moment = [], start - timedelta(seconds=1)
    while (moment := cron.next_after(moment)) is not None and moment < end:  # type: ignore[assignment]
        found.append(moment)
    return found


def test_a_time_the_spring_change_skips_does_not_run_that_day() -> None:
    runs = occurrences("cron(30 2 * * ? *)", NEW_YORK, SPRING - timedelta(days=1), SPRING + timedelta(days=1))
    assert [r.astimezone(ZoneInfo(NEW_YORK)).date().day for r in runs] == [7, 9]


def test_a_time_the_autumn_change_repeats_runs_once_at_its_first_instant() -> None:
    runs = occurrences("cron(30 1 * * ? *)", NEW_YORK, AUTUMN - timedelta(hours=3), AUTUMN + timedelta(hours=6))
    assert runs == [datetime(2026, 11, 1, 5, 30, tzinfo=UTC)]  # 01:30 EDT; not again at 01:30 EST (06:30 UTC)


def test_a_weekday_morning_follows_the_wall_clock_across_both_changes() -> None:
    cron = SchedulerCron.parse("cron(0 9 ? * MON-FRI *)", NEW_YORK)
    assert cron.next_after(datetime(2026, 3, 6, 15, tzinfo=UTC)) == datetime(2026, 3, 9, 13, tzinfo=UTC)
    assert cron.next_after(datetime(2026, 10, 30, 14, tzinfo=UTC)) == datetime(2026, 11, 2, 14, tzinfo=UTC)


EXPRESSIONS = ["cron(0/30 * * * ? *)", "cron(0 9 ? * MON-FRI *)", "cron(30 2 * * ? *)", "cron(30 1 * * ? *)",
               "cron(0/15 0-3 * * ? *)", "cron(0 0 L * ? *)", "cron(0 12 ? * 2#1 *)", "cron(0 22 ? * FRI-MON *)",
               "cron(45 23 LW * ? *)", "cron(0 6 ? * 6L *)"]
ZONES = [NEW_YORK, "Europe/London", "Australia/Sydney", "Australia/Lord_Howe", "Asia/Kolkata", "UTC"]
CHANGES = [datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 26, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC),
           datetime(2026, 9, 30, tzinfo=UTC), datetime(2026, 10, 22, tzinfo=UTC), datetime(2026, 10, 29, tzinfo=UTC)]
"""Starts of spans that hold a change in each zone that has one (northern and southern, the
30-minute one of Lord Howe Island)."""


@pytest.mark.parametrize("zone", ZONES)
def test_the_project_s_windows_start_when_the_scheduler_fires_across_every_change(zone: str) -> None:
    for expression in EXPRESSIONS:
        project = CronExpression.parse(expression)
        for start in CHANGES:
            end = start + timedelta(days=10 if "L" not in expression and "#" not in expression else 36)
            witnessed = occurrences(expression, zone, start, end)
            assert list(project.occurrences(start, end, ZoneInfo(zone))) == witnessed, (expression, zone, start)


def test_a_window_open_across_the_autumn_change_is_held_from_its_tick_for_its_duration() -> None:
    """The scheduler's tick for a Saturday-night window is when the project's code says it opens; the window
    lasts its duration in elapsed time (nine hours, though the wall clock shows eight)."""
    window = ScalingWindow.model_validate({"name": "night", "schedule": "cron(0 20 ? * SAT *)", "timezone": NEW_YORK,
                                           "duration": "9h", "nodePool": "gpu-burst", "warm": {"gpus": 4}})
    schedule = WindowSchedule(window, lead_time=timedelta(minutes=8))
    tick = SchedulerCron.parse(window.schedule, NEW_YORK).next_after(datetime(2026, 10, 31, 12, tzinfo=UTC))
    assert tick == datetime(2026, 11, 1, 0, 0, tzinfo=UTC)  # 20:00 EDT
    held = schedule.holding(tick)
    assert held is not None and held.start == tick
    assert held.end == tick + timedelta(hours=9)
    assert held.end.astimezone(ZoneInfo(NEW_YORK)).hour == 4  # 04:00 EST
    assert schedule.holding(held.end) is None and schedule.holding(held.end - timedelta(seconds=1)) is not None


@pytest.mark.parametrize(("expression", "why"), [
    ("cron(0 9 * * MON-FRI *)", "'?'"),      # "You can't use * in both the Day-of-month and Day-of-week fields"
    ("cron(0 9 ? * ? *)", "'?'"),            # "If you use it in one, you must use ? in the other"
    ("cron(0 25 ? * MON-FRI *)", "hours"),   # hours 0-23
    ("cron(60 9 ? * MON-FRI *)", "minutes"),
    ("cron(0 9 ? * MON-FRI/2 *)", "day-of-week"),  # day-of-week wildcards: , - * ? L #
    ("cron(0 9 ? * 8 *)", "day-of-week"),    # 1-7 (SUN-SAT)
])
def test_the_scheduler_refuses_an_expression_createschedule_refuses(expression: str, why: str) -> None:
    """EventBridge User Guide, "Cron expressions reference": each field's values and wildcards. Before, the
    emulator ran such a schedule on days or at times no real schedule could be made for (or never)."""
    with pytest.raises(ValueError, match=why):
        SchedulerCron.parse(expression, "UTC")

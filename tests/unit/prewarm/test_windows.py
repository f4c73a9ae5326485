"""Scaling windows: EventBridge cron in IANA time zones, lead time, and daylight-saving changes."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gpu_autoscaler.config import ScalingWindow
from gpu_autoscaler.domain.windows import CronError, CronExpression, WindowSchedule, active_windows

from .builders import make_config, make_window

NEW_YORK = ZoneInfo("America/New_York")


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def schedule(lead: timedelta = timedelta(minutes=8), **overrides: object) -> WindowSchedule:
    return WindowSchedule(ScalingWindow.model_validate(make_window(**overrides)), lead)


def starts(cron: str, zone: str, since: datetime, until: datetime) -> list[datetime]:
    return list(CronExpression.parse(cron).occurrences(since, until, ZoneInfo(zone)))


class TestParsing:
    @pytest.mark.parametrize("text, field", [
        ("cron(0 9 * * MON *)", "exactly one of day-of-month and day-of-week"),
        ("cron(0 9 ? * ? *)", "exactly one of day-of-month and day-of-week"),
        ("cron(60 9 * * ? *)", "minutes: 60 is outside 0-59"),
        ("cron(0 24 * * ? *)", "hours: 24 is outside 0-23"),
        ("cron(0 9 L-2 * ? *)", "day-of-month"),
        ("cron(0 9 ? * 1,5L *)", "day-of-week"),
        ("cron(0 9 ? * MON/2 *)", "day-of-week: '/' is not allowed"),
        ("cron(0 9 ? * 2#1,3#2 *)", "single n#k"),
        ("cron(0 9 ? FOO * *)", "month: 'FOO'"),
        ("cron(0 9 * * ? 1969)", "year: 1969 is outside"),
        ("cron(0 9 * * ?)", "has 5 fields"),
        ("cron(0/0 9 * * ? *)", "step '0'"),
        ("rate(5 minutes)", "not a cron expression"),
    ])
    def test_unsupported_or_invalid_is_rejected_with_the_field_named(self, text: str, field: str) -> None:
        with pytest.raises(CronError, match=field.replace("(", r"\(").replace("?", r"\?")):
            CronExpression.parse(text)

    def test_names_ranges_lists_and_steps(self) -> None:
        cron = CronExpression.parse("cron(0/15 8-10,22 ? JAN-MAR,DEC MON-FRI 2026-2027)")
        assert cron.minutes == {0, 15, 30, 45}
        assert cron.hours == {8, 9, 10, 22}
        assert cron.months == {1, 2, 3, 12}
        assert cron.years == {2026, 2027}
        assert cron.matches_date(date(2026, 1, 5)) and not cron.matches_date(date(2026, 1, 3))
        assert not cron.matches_date(date(2026, 4, 6))

    def test_wrapping_ranges(self) -> None:
        cron = CronExpression.parse("cron(0 22-1 ? * FRI-MON *)")
        assert cron.hours == {22, 23, 0, 1}
        assert [d.weekday() for d in (date(2026, 1, 9), date(2026, 1, 10), date(2026, 1, 11), date(2026, 1, 12))] \
            == [4, 5, 6, 0]
        assert all(cron.matches_date(date(2026, 1, d)) for d in (9, 10, 11, 12))
        assert not cron.matches_date(date(2026, 1, 13))

    @pytest.mark.parametrize("cron, expected", [
        ("cron(0 0 L * ? *)", [utc(2026, 1, 31), utc(2026, 2, 28), utc(2026, 3, 31)]),
        ("cron(0 0 LW * ? *)", [utc(2026, 1, 30), utc(2026, 2, 27), utc(2026, 3, 31)]),  # Jan 31 is a Saturday
        ("cron(0 0 15W * ? *)", [utc(2026, 1, 15), utc(2026, 2, 16), utc(2026, 3, 16)]),  # Feb/Mar 15: Sundays
        ("cron(0 0 1W * ? *)", [utc(2026, 1, 1), utc(2026, 2, 2), utc(2026, 3, 2)]),  # Feb 1 Sunday, Mar 1 Sunday
        ("cron(0 0 ? * 2#1 *)", [utc(2026, 1, 5), utc(2026, 2, 2), utc(2026, 3, 2)]),  # first Monday
        ("cron(0 0 ? * 6L *)", [utc(2026, 1, 30), utc(2026, 2, 27), utc(2026, 3, 27)]),  # last Friday
        ("cron(0 0 ? * L *)", [utc(2026, 1, 3), utc(2026, 1, 10), utc(2026, 1, 17)]),  # L alone: Saturday
    ])
    def test_last_weekday_and_nth(self, cron: str, expected: list[datetime]) -> None:
        assert starts(cron, "UTC", utc(2026, 1, 1), utc(2026, 4, 1))[:3] == expected

    def test_a_date_that_never_comes(self) -> None:
        cron = CronExpression.parse("cron(0 0 30 2 ? *)")
        assert cron.next_after(utc(2026, 1, 1), ZoneInfo("UTC")) is None
        leap = CronExpression.parse("cron(0 0 29 FEB ? *)")
        assert leap.next_after(utc(2026, 1, 1), ZoneInfo("UTC")) == utc(2028, 2, 29)
        assert leap.previous_at_or_before(utc(2026, 1, 1), ZoneInfo("UTC")) == utc(2024, 2, 29)


class TestTimeZones:
    def test_new_york_nine_am_is_14_utc_in_winter_and_13_utc_in_summer(self) -> None:
        cron = "cron(0 9 ? * MON-FRI *)"
        assert starts(cron, "America/New_York", utc(2026, 1, 5), utc(2026, 1, 6)) == [utc(2026, 1, 5, 14)]
        assert starts(cron, "America/New_York", utc(2026, 7, 6), utc(2026, 7, 7)) == [utc(2026, 7, 6, 13)]

    def test_across_the_spring_change_in_new_york(self) -> None:
        # Clocks go forward on Sunday 8 March 2026: Friday is EST, Monday EDT.
        found = starts("cron(0 9 ? * MON-FRI *)", "America/New_York", utc(2026, 3, 6), utc(2026, 3, 10))
        assert found == [utc(2026, 3, 6, 14), utc(2026, 3, 9, 13)]

    def test_across_the_autumn_change_in_new_york(self) -> None:
        found = starts("cron(0 9 ? * MON-FRI *)", "America/New_York", utc(2026, 10, 30), utc(2026, 11, 3))
        assert found == [utc(2026, 10, 30, 13), utc(2026, 11, 2, 14)]

    @pytest.mark.parametrize("zone, winter, summer", [
        ("Europe/London", utc(2026, 1, 5, 9), utc(2026, 7, 6, 8)),
        ("Europe/Berlin", utc(2026, 1, 5, 8), utc(2026, 7, 6, 7)),
        ("Asia/Tokyo", utc(2026, 1, 5, 0), utc(2026, 7, 6, 0)),  # no daylight saving
        ("Australia/Sydney", utc(2026, 1, 4, 22), utc(2026, 7, 5, 23)),  # southern summer in January
        ("Asia/Kolkata", utc(2026, 1, 5, 3, 30), utc(2026, 7, 6, 3, 30)),  # half-hour offset
    ])
    def test_other_zones(self, zone: str, winter: datetime, summer: datetime) -> None:
        cron = "cron(0 9 ? * MON *)"
        assert CronExpression.parse(cron).next_after(winter - timedelta(days=1), ZoneInfo(zone)) == winter
        assert CronExpression.parse(cron).next_after(summer - timedelta(days=1), ZoneInfo(zone)) == summer

    def test_a_skipped_local_time_has_no_occurrence_that_day(self) -> None:
        # 02:30 does not exist in New York on 8 March 2026 (02:00 → 03:00), as EventBridge Scheduler skips it.
        found = starts("cron(30 2 * * ? *)", "America/New_York", utc(2026, 3, 7), utc(2026, 3, 10))
        assert found == [utc(2026, 3, 7, 7, 30), utc(2026, 3, 9, 6, 30)]

    def test_a_repeated_local_time_occurs_once_at_its_first_instant(self) -> None:
        # 01:30 happens twice in New York on 1 November 2026 (EDT 05:30 UTC, then EST 06:30 UTC).
        found = starts("cron(30 1 * * ? *)", "America/New_York", utc(2026, 11, 1), utc(2026, 11, 2))
        assert found == [utc(2026, 11, 1, 5, 30)]

    def test_every_half_hour_through_the_autumn_change_never_repeats(self) -> None:
        found = starts("cron(0/30 * * * ? *)", "America/New_York", utc(2026, 11, 1, 4), utc(2026, 11, 1, 8))
        local = [t.astimezone(NEW_YORK).strftime("%H:%M") for t in found]
        assert local == ["00:00", "00:30", "01:00", "01:30", "02:00", "02:30"]
        assert found[3] == utc(2026, 11, 1, 5, 30) and found[4] == utc(2026, 11, 1, 7)

    def test_next_and_previous_agree(self) -> None:
        cron = CronExpression.parse("cron(0 9 ? * MON-FRI *)")
        moment = utc(2026, 3, 7, 12)  # a Saturday
        assert cron.next_after(moment, NEW_YORK) == utc(2026, 3, 9, 13)
        assert cron.previous_at_or_before(moment, NEW_YORK) == utc(2026, 3, 6, 14)
        assert cron.previous_at_or_before(utc(2026, 3, 6, 14), NEW_YORK) == utc(2026, 3, 6, 14)
        assert cron.next_after(utc(2026, 3, 6, 14), NEW_YORK) == utc(2026, 3, 9, 13)


class TestWindows:
    def test_holds_from_start_minus_lead_time_until_the_end(self) -> None:
        window = schedule()
        start = utc(2026, 1, 5, 14)
        assert window.holding(start - timedelta(minutes=8, seconds=1)) is None
        held = window.holding(start - timedelta(minutes=8))
        assert held is not None and held.start == start and held.end == start + timedelta(hours=9)
        assert not held.is_open(start - timedelta(minutes=1)) and held.is_open(start)
        assert window.holding(start + timedelta(hours=9) - timedelta(seconds=1)) == held
        assert window.holding(start + timedelta(hours=9)) is None

    def test_lead_time_is_the_pools(self) -> None:
        window = schedule(lead=timedelta(minutes=20))
        assert window.holding(utc(2026, 1, 5, 13, 40)) is not None
        assert window.holding(utc(2026, 1, 5, 13, 39)) is None
        assert window.opens_within(utc(2026, 1, 5, 13, 39)) is None
        assert window.opens_within(utc(2026, 1, 5, 13, 40)) is not None

    def test_a_caller_deciding_every_few_minutes_asks_that_much_earlier(self) -> None:
        window = schedule()
        start = utc(2026, 1, 5, 14)
        early = timedelta(minutes=5)
        assert window.holding(start - timedelta(minutes=13, seconds=1), early) is None
        held = window.holding(start - timedelta(minutes=13), early)
        assert held is not None and held.start == start and held.warm_from == start - timedelta(minutes=8)
        assert window.holding(start + timedelta(hours=9), early) is None  # the end does not move

    def test_the_window_follows_new_york_across_the_spring_change(self) -> None:
        window = schedule()
        friday, monday = utc(2026, 3, 6, 14), utc(2026, 3, 9, 13)
        assert window.holding(friday - timedelta(minutes=8)) is not None
        assert window.holding(monday - timedelta(minutes=9)) is None
        assert window.holding(monday - timedelta(minutes=8)) is not None
        # At 14:00 UTC on Monday the window has been open an hour; it closes at 22:00 UTC (18:00 EDT).
        held = window.holding(utc(2026, 3, 9, 21, 59))
        assert held is not None and held.end == utc(2026, 3, 9, 22)
        assert window.holding(utc(2026, 3, 9, 22)) is None

    def test_duration_is_elapsed_time_across_a_change(self) -> None:
        # Saturday 22:00 New York + 9 h: the night clocks go forward, the window ends at 08:00 EDT, not 07:00.
        window = schedule(schedule="cron(0 22 ? * SAT *)")
        held = window.holding(utc(2026, 3, 8, 3))
        assert held is not None and held.start == utc(2026, 3, 8, 3)
        assert held.end == utc(2026, 3, 8, 12) and held.end.astimezone(NEW_YORK).hour == 8

    def test_overlapping_openings_hold_until_the_last_ends(self) -> None:
        window = schedule(schedule="cron(0 * * * ? *)", timezone="UTC", duration="90m")
        held = window.holding(utc(2026, 1, 5, 10, 55))
        assert held is not None and held.start == utc(2026, 1, 5, 11) and held.end == utc(2026, 1, 5, 12, 30)

    def test_active_windows_of_a_configuration(self) -> None:
        config = make_config(windows=[
            make_window(),
            make_window(name="tokyo", schedule="cron(0 9 * * ? *)", timezone="Asia/Tokyo", duration="2h"),
        ])
        assert [w.window for w in active_windows(config, utc(2026, 1, 5, 0, 30))] == ["tokyo"]
        assert [w.window for w in active_windows(config, utc(2026, 1, 5, 13, 55))] == ["peak"]
        assert active_windows(config, utc(2026, 1, 10, 14)) == []  # Saturday in New York, not 09:00 in Tokyo

"""Scaling windows: EventBridge Scheduler cron expressions, evaluated in the window's IANA time zone.

The schedule that fires a window's prewarm tick is an EventBridge Scheduler schedule with the window's
cron and time zone; this module answers the same question in code, so the prewarm function (and the
simulator, and the backtest) know when a window is open without trusting that a tick arrived.

Syntax: `cron(minutes hours day-of-month month day-of-week year)`, as EventBridge documents it:

| field        | values          | supported                                                        |
| ------------ | --------------- | ---------------------------------------------------------------- |
| minutes      | 0-59            | `*` `,` `-` `/`                                                  |
| hours        | 0-23            | `*` `,` `-` `/`                                                  |
| day-of-month | 1-31            | `*` `?` `,` `-` `/`; alone: `L`, `nW`, `LW`                      |
| month        | 1-12 or JAN-DEC | `*` `,` `-` `/`                                                  |
| day-of-week  | 1-7 or SUN-SAT  | `*` `?` `,` `-`; alone: `L` (SAT), `nL` (last n-day), `n#k`      |
| year         | 1970-2199       | `*` `,` `-` `/`                                                  |

Day-of-week counts 1 = SUN … 7 = SAT. Exactly one of day-of-month and day-of-week is `?`. A range
whose start is after its end wraps (`FRI-MON`, hours `22-2`). Not supported, and rejected with a
`CronError` naming the field: `L-n` offsets, `L`/`W`/`#` inside lists or ranges, `/` in day-of-week
(EventBridge does not list it either), and anything else outside the table.

Daylight saving time, as EventBridge Scheduler documents it for cron schedules: a local time that does
not exist (the hour skipped when clocks go forward) has no occurrence that day; a local time that
occurs twice (the hour repeated when clocks go back) occurs once, at its first instant (the earlier UTC
time, `fold=0`). So a 09:00 America/New_York window starts at 14:00 UTC in winter and 13:00 UTC in
summer, and a 02:30 window does not open on the spring-forward day. A window's `duration` is elapsed
time from its start: a window that spans a change lasts exactly its duration, not to the same wall time.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import cached_property
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from gpu_autoscaler.errors import GpuAutoscalerError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from gpu_autoscaler.config import Config, ScalingWindow

__all__ = [
    "CronError",
    "CronExpression",
    "WindowOccurrence",
    "WindowSchedule",
    "active_windows",
    "window_schedules",
    "windows_zone",
]

_MONTH_NAMES = {name: i for i, name in enumerate(
    ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"), start=1)}
_DAY_NAMES = {name: i for i, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"), start=1)}
_FIELDS = ("minutes", "hours", "day-of-month", "month", "day-of-week", "year")
_EXPRESSION = re.compile(r"^\s*cron\((?P<body>[^()]*)\)\s*$", re.IGNORECASE)
_FIRST_YEAR, _LAST_YEAR = 1970, 2199


class CronError(GpuAutoscalerError, ValueError):
    """A cron expression this module cannot evaluate, with the field and the reason named."""


def _cron_weekday(day: date) -> int:
    """EventBridge numbering: 1 = Sunday … 7 = Saturday."""
    return (day.weekday() + 1) % 7 + 1


def _number(token: str, field: str, names: Mapping[str, int] | None) -> int:
    upper = token.upper()
    if names and upper in names:
        return names[upper]
    if not token.isdigit():
        raise CronError(f"{field}: '{token}' is not a number{' or a name' if names else ''}")
    return int(token)


def _parse_set(text: str, field: str, low: int, high: int, names: Mapping[str, int] | None = None,
               *, steps: bool = True) -> frozenset[int]:
    """A `,` list of `*`, `a`, `a-b`, with `/step` on `*`, `a` (from a to the top) and `a-b` when allowed."""
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"{field}: empty item in '{text}'")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not steps:
                raise CronError(f"{field}: '/' is not allowed in this field ('{item}')")
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{field}: step '{step_text}' must be a positive number ('{item}')")
            step = int(step_text)
        if base == "*":
            span = list(range(low, high + 1))
        elif "-" in base:
            first_text, _, last_text = base.partition("-")
            first = _number(first_text, field, names)
            last = _number(last_text, field, names)
            for value in (first, last):
                if not low <= value <= high:
                    raise CronError(f"{field}: {value} is outside {low}-{high} ('{item}')")
            # A range that starts after it ends wraps around (FRI-MON, 22-2).
            span = list(range(first, last + 1)) if first <= last else [*range(first, high + 1), *range(low, last + 1)]
        else:
            first = _number(base, field, names)
            if not low <= first <= high:
                raise CronError(f"{field}: {first} is outside {low}-{high} ('{item}')")
            span = list(range(first, high + 1)) if slash else [first]
        values.update(span[::step])
    return frozenset(values)


@dataclass(frozen=True)
class _DayOfMonth:
    """Which days of a month match: a set, the last day (`L`), the weekday nearest a day (`nW`, `LW`)."""

    days: frozenset[int] | None = None
    """None: any day."""
    last: bool = False
    nearest_weekday: int | None = None
    """n of `nW`; 0 for `LW` (the last weekday of the month)."""

    @classmethod
    def parse(cls, text: str) -> _DayOfMonth:
        upper = text.upper()
        if upper in ("?", "*"):
            return cls()
        if upper == "L":
            return cls(last=True)
        if upper == "LW":
            return cls(nearest_weekday=0)
        if upper.endswith("W"):
            day = upper[:-1]
            if not day.isdigit() or not 1 <= int(day) <= 31:
                raise CronError(f"day-of-month: '{text}' must be nW with n in 1-31")
            return cls(nearest_weekday=int(day))
        if "L" in upper or "W" in upper:
            raise CronError(f"day-of-month: '{text}' is not supported (L, nW and LW only stand alone; no L-n)")
        return cls(days=_parse_set(text, "day-of-month", 1, 31))

    def matches(self, day: date) -> bool:
        length = calendar.monthrange(day.year, day.month)[1]
        if self.last:
            return day.day == length
        if self.nearest_weekday is not None:
            return day.day == self._weekday_near(day.year, day.month, length)
        return self.days is None or day.day in self.days

    def _weekday_near(self, year: int, month: int, length: int) -> int:
        """The Monday-to-Friday day nearest the target, never leaving the month (Quartz's rule)."""
        target = length if self.nearest_weekday == 0 else self.nearest_weekday
        assert target is not None
        if target > length:
            return -1  # 31W in a 30-day month: no day
        weekday = date(year, month, target).weekday()  # Monday = 0
        if weekday == 5:  # Saturday: the Friday before, or the Monday after at the month's start
            return target - 1 if target > 1 else target + 2
        if weekday == 6:  # Sunday: the Monday after, or the Friday before at the month's end
            return target + 1 if target < length else target - 2
        return target


@dataclass(frozen=True)
class _DayOfWeek:
    """Which days of the week match: a set, the last n-day of the month (`nL`), the k-th n-day (`n#k`)."""

    days: frozenset[int] | None = None
    last_of_month: int | None = None
    nth: tuple[int, int] | None = None
    """(weekday, k) of `n#k`."""

    @classmethod
    def parse(cls, text: str) -> _DayOfWeek:
        upper = text.upper()
        if upper in ("?", "*"):
            return cls()
        if upper == "L":
            return cls(days=frozenset({7}))
        if "#" in upper:
            day_text, _, k_text = upper.partition("#")
            if "," in upper or "-" in day_text:
                raise CronError(f"day-of-week: '{text}' must be a single n#k")
            day = _number(day_text, "day-of-week", _DAY_NAMES)
            if not 1 <= day <= 7 or not k_text.isdigit() or not 1 <= int(k_text) <= 5:
                raise CronError(f"day-of-week: '{text}' must be n#k with n in 1-7 (or SUN-SAT) and k in 1-5")
            return cls(nth=(day, int(k_text)))
        if upper.endswith("L") and upper[:-1] and "," not in upper and "-" not in upper:
            day = _number(upper[:-1], "day-of-week", _DAY_NAMES)
            if not 1 <= day <= 7:
                raise CronError(f"day-of-week: '{text}' must be nL with n in 1-7 (or SUN-SAT)")
            return cls(last_of_month=day)
        for token in re.split(r"[,/-]", upper):
            if token and not token.isdigit() and token != "*" and token not in _DAY_NAMES:
                raise CronError(
                    f"day-of-week: '{text}' is not supported ('{token}': L, nL and n#k only stand alone)"
                )
        return cls(days=_parse_set(text, "day-of-week", 1, 7, _DAY_NAMES, steps=False))

    def matches(self, day: date) -> bool:
        weekday = _cron_weekday(day)
        if self.nth is not None:
            wanted, k = self.nth
            return weekday == wanted and (day.day - 1) // 7 + 1 == k
        if self.last_of_month is not None:
            length = calendar.monthrange(day.year, day.month)[1]
            return weekday == self.last_of_month and day.day + 7 > length
        return self.days is None or weekday in self.days


@dataclass(frozen=True)
class CronExpression:
    """A parsed EventBridge cron expression; occurrences are computed in a given time zone."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    day_of_month: _DayOfMonth
    months: frozenset[int]
    day_of_week: _DayOfWeek
    years: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        match = _EXPRESSION.match(text)
        if not match:
            raise CronError(f"'{text}' is not a cron expression like 'cron(0 9 ? * MON-FRI *)'")
        fields = match.group("body").split()
        if len(fields) != len(_FIELDS):
            raise CronError(f"'{text}' has {len(fields)} fields; cron() takes 6: {' '.join(_FIELDS)}")
        minute, hour, dom, month, dow, year = fields
        if (dom == "?") == (dow == "?"):
            raise CronError(f"'{text}': exactly one of day-of-month and day-of-week must be '?'")
        for name, value in (("minutes", minute), ("hours", hour), ("month", month), ("year", year)):
            if "?" in value:
                raise CronError(f"{name}: '?' is only allowed in day-of-month and day-of-week")
        return cls(
            text=text.strip(),
            minutes=_parse_set(minute, "minutes", 0, 59),
            hours=_parse_set(hour, "hours", 0, 23),
            day_of_month=_DayOfMonth.parse(dom),
            months=_parse_set(month, "month", 1, 12, _MONTH_NAMES),
            day_of_week=_DayOfWeek.parse(dow),
            years=_parse_set(year, "year", _FIRST_YEAR, _LAST_YEAR),
        )

    # Dates and times of day, in local (wall-clock) terms

    def matches_date(self, day: date) -> bool:
        return (
            day.year in self.years
            and day.month in self.months
            and self.day_of_month.matches(day)
            and self.day_of_week.matches(day)
        )

    @cached_property
    def _times(self) -> tuple[time, ...]:
        return tuple(time(h, m) for h in sorted(self.hours) for m in sorted(self.minutes))

    def _month_matches(self, year: int, month: int) -> bool:
        return year in self.years and month in self.months

    def _dates_forward(self, start: date) -> Iterator[date]:
        day = start
        while day.year <= _LAST_YEAR:
            if not self._month_matches(day.year, day.month):
                if day.year > max(self.years):
                    return
                day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
                continue
            if self.matches_date(day):
                yield day
            day += timedelta(days=1)

    def _dates_backward(self, start: date) -> Iterator[date]:
        day = start
        while day.year >= _FIRST_YEAR:
            if not self._month_matches(day.year, day.month):
                if day.year < min(self.years):
                    return
                day = date(day.year, day.month, 1) - timedelta(days=1)
                continue
            if self.matches_date(day):
                yield day
            if day == date(_FIRST_YEAR, 1, 1):
                return
            day -= timedelta(days=1)

    # Instants

    def _instants(self, day: date, zone: ZoneInfo) -> list[datetime]:
        """The UTC instants of the matching local times of one local date: gaps skipped, repeats once."""
        out = []
        for moment in self._times:
            local = datetime.combine(day, moment, tzinfo=zone)  # fold=0: the first of a repeated time
            instant = local.astimezone(UTC)
            if instant.astimezone(zone).replace(tzinfo=None) != local.replace(tzinfo=None):
                continue  # clocks jumped over this wall time: EventBridge Scheduler skips it
            out.append(instant)
        return out

    def next_after(self, moment: datetime, zone: ZoneInfo) -> datetime | None:
        """The first occurrence strictly after `moment` (an aware datetime); None if there is none by 2199."""
        start = moment.astimezone(zone).date() - timedelta(days=1)
        for day in self._dates_forward(start):
            for instant in self._instants(day, zone):
                if instant > moment:
                    return instant
        return None

    def previous_at_or_before(self, moment: datetime, zone: ZoneInfo) -> datetime | None:
        """The last occurrence at or before `moment`; None if there is none since 1970."""
        start = moment.astimezone(zone).date() + timedelta(days=1)
        for day in self._dates_backward(start):
            for instant in reversed(self._instants(day, zone)):
                if instant <= moment:
                    return instant
        return None

    def occurrences(self, start: datetime, end: datetime, zone: ZoneInfo) -> Iterator[datetime]:
        """Every occurrence in [start, end), in order, as aware UTC datetimes."""
        first = start.astimezone(zone).date() - timedelta(days=1)
        last = end.astimezone(zone).date() + timedelta(days=1)
        for day in self._dates_forward(first):
            if day > last:
                return
            for instant in self._instants(day, zone):
                if start <= instant < end:
                    yield instant


@dataclass(frozen=True)
class WindowOccurrence:
    """One opening of a scaling window, in UTC: warm from `warm_from`, open on [start, end)."""

    window: str
    pool: str
    start: datetime
    end: datetime
    warm_from: datetime
    """start − the pool's lead time: when its warm capacity must be asked for."""

    def holds(self, moment: datetime) -> bool:
        """Warm capacity is held on [start − lead time, end)."""
        return self.warm_from <= moment < self.end

    def is_open(self, moment: datetime) -> bool:
        return self.start <= moment < self.end


class WindowSchedule:
    """A configured scaling window against the clock: its occurrences, and whether it holds capacity now."""

    def __init__(self, window: ScalingWindow, lead_time: timedelta) -> None:
        self.window = window
        self.lead_time = lead_time
        self.cron = CronExpression.parse(window.schedule)
        self.zone = ZoneInfo(window.timezone)

    @property
    def name(self) -> str:
        return self.window.name

    def _occurrence(self, start: datetime) -> WindowOccurrence:
        return WindowOccurrence(
            self.window.name, self.window.node_pool, start, start + self.window.duration, start - self.lead_time
        )

    def next_start(self, after: datetime) -> datetime | None:
        return self.cron.next_after(after, self.zone)

    def previous_start(self, at_or_before: datetime) -> datetime | None:
        return self.cron.previous_at_or_before(at_or_before, self.zone)

    def occurrences(self, start: datetime, end: datetime) -> list[WindowOccurrence]:
        """The openings whose start is in [start, end)."""
        return [self._occurrence(s) for s in self.cron.occurrences(start, end, self.zone)]

    def holding(self, moment: datetime, early: timedelta = timedelta(0)) -> WindowOccurrence | None:
        """The opening that holds warm capacity at `moment`, if any: open now or opening within the lead time
        (plus `early`: a caller that decides only every few minutes asks that much sooner, so capacity is up
        by the start however the ticks fall).

        Every opening lasts the same duration, so the latest start at or before `moment + lead time` is the
        one that ends last; if it has ended, every earlier one has too. When openings overlap, the one
        returned is the one that ends last.
        """
        start = self.previous_start(moment + self.lead_time + early)
        if start is None:
            return None
        occurrence = self._occurrence(start)
        return occurrence if occurrence.warm_from - early <= moment < occurrence.end else None

    def opens_within(self, moment: datetime, lead: timedelta | None = None) -> WindowOccurrence | None:
        """The next opening if it starts in (moment, moment + lead] (default: the pool's lead time)."""
        start = self.next_start(moment)
        if start is None or start > moment + (self.lead_time if lead is None else lead):
            return None
        return self._occurrence(start)


def window_schedules(config: Config, lead_times: Mapping[str, timedelta] | None = None) -> list[WindowSchedule]:
    """Every configured window, with its pool's lead time (`lead_times[pool]` where given: the measured one,
    else the configured `leadTime`); raises `CronError` on an unsupported schedule."""
    leads = lead_times or {}
    return [WindowSchedule(w, leads.get(w.node_pool, config.pool(w.node_pool).lead_time))
            for w in config.scaling_windows]


def windows_zone(config: Config) -> ZoneInfo | None:
    """The time zone every configured window names: the cluster's users', whose office hours the demand forecast
    follows (`Forecaster.zone`). None without windows or when they name several (no one zone to choose: UTC)."""
    zones = {w.timezone for w in config.scaling_windows}
    return ZoneInfo(zones.pop()) if len(zones) == 1 else None


def active_windows(config: Config, moment: datetime) -> list[WindowOccurrence]:
    """The windows holding warm capacity at `moment`, in configuration order."""
    out = []
    for schedule in window_schedules(config):
        occurrence = schedule.holding(moment)
        if occurrence is not None:
            out.append(occurrence)
    return out

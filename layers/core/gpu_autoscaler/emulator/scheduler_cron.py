"""EventBridge Scheduler's cron schedules, as the emulator's scheduler fires them: the next instant a schedule is
due, in its `ScheduleExpressionTimezone`.

An independent witness of the documented behaviour, written from the EventBridge Scheduler User Guide, not from
the project's window code (`domain.windows`), which it is compared with:

- "Schedule types in EventBridge Scheduler", cron-based schedules: `cron(minutes hours day-of-month month
  day-of-week year)`, evaluated in the schedule's time zone; wildcards `,` `-` `*` `/` (`/` not in
  day-of-week), `?` in exactly one of the two day fields, `L` (last day of the month; in day-of-week, `nL` the
  last n-day), `W` (the weekday nearest a day of the month, `LW` the month's last weekday), `#` (`n#k`, the k-th
  n-day of the month); day-of-week 1-7 = SUN-SAT.
- Same page, "Daylight saving time on EventBridge Scheduler": "When the time shifts forward in the Spring, if a
  cron expression falls on a non-existent date and time, your schedule invocation is skipped. When the time
  shifts backwards in the Fall, your schedule runs only once and does not repeat its invocation."

The method differs on purpose from the project's (which walks local dates and converts each matching wall time
to UTC): this one walks UTC minutes and asks what the wall clock reads at each. A wall time that never appears
(the spring gap) is never read, so it is skipped; a wall time read twice (the autumn repeat) is taken only on
its first reading (Python marks the second one `fold=1`).
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

__all__ = ["SchedulerCron"]

_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_HORIZON = timedelta(days=5 * 366)
"""How far ahead the next occurrence is looked for (a schedule with none within it is treated as done)."""


def _value(token: str, names: tuple[str, ...]) -> int:
    upper = token.upper()
    if upper in names:
        return names.index(upper) + 1
    return int(token)


def _values(text: str, low: int, high: int, names: tuple[str, ...] = (), field: str = "") -> tuple[int, ...]:
    """The values a field's text names; `ValueError` for one outside the field's range (CreateSchedule's
    ValidationException)."""
    found: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if base in ("*", "?"):
            first, last = low, high
        elif "-" in base:
            first, last = (_value(t, names) for t in base.split("-", 1))
        else:
            first = _value(base, names)
            last = high if step_text else first
        if not (low <= first <= high and low <= last <= high) or step < 1:
            raise ValueError(f"{field}: {part!r} is outside {low}-{high}")
        if first <= last:
            found.update(range(first, last + 1, step))
        else:  # a range that wraps (FRI-MON, 22-2)
            span = [*range(first, high + 1), *range(low, last + 1)]
            found.update(span[::step])
    return tuple(sorted(found))


def _sunday_first(day: date) -> int:
    return (day.weekday() + 1) % 7 + 1


def _nearest_weekday(year: int, month: int, target: int) -> int | None:
    length = calendar.monthrange(year, month)[1]
    if target > length:
        return None
    weekday = calendar.weekday(year, month, target)  # Monday 0 … Sunday 6
    if weekday == 5:
        return target - 1 if target > 1 else target + 2
    if weekday == 6:
        return target + 1 if target < length else target - 2
    return target


@dataclass(frozen=True)
class SchedulerCron:
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    day_of_month: str
    months: tuple[int, ...]
    day_of_week: str
    years: tuple[int, ...]
    zone: ZoneInfo

    @classmethod
    def parse(cls, expression: str, timezone: str | None) -> SchedulerCron:
        body = expression.strip()
        if not (body.lower().startswith("cron(") and body.endswith(")")):
            raise ValueError(f"not a cron expression: {expression!r}")
        fields = body[5:-1].split()
        if len(fields) != 6:
            raise ValueError(f"a cron expression has 6 fields: {expression!r}")
        minute, hour, dom, month, dow, year = fields
        # "Cron expressions reference" (EventBridge User Guide): "You can't use * in both the Day-of-month and
        # Day-of-week fields. If you use it in one, you must use ? in the other."; day-of-week takes 1-7 or
        # SUN-SAT and the wildcards , - * ? L # (no /); day-of-month 1-31 with , - * ? / L W.
        if (dom == "?") == (dow == "?"):
            raise ValueError(f"{expression!r}: one of day-of-month and day-of-week must be '?', not both")
        if "/" in dow:
            raise ValueError(f"{expression!r}: day-of-week takes no '/'")
        cron = cls(_values(minute, 0, 59, field="minutes"), _values(hour, 0, 23, field="hours"), dom.upper(),
                   _values(month, 1, 12, _MONTHS, field="month"), dow.upper(),
                   _values(year, 1970, 2199, field="year"), ZoneInfo(timezone or "UTC"))
        if dom != "?" and dom.upper() not in ("L", "LW") and not dom.upper().endswith("W"):
            _values(dom, 1, 31, field="day-of-month")
        if dow != "?" and "#" not in dow and not dow.upper().endswith("L"):
            _values(dow, 1, 7, _DAYS, field="day-of-week")
        return cron

    def _day_matches(self, day: date) -> bool:
        if day.month not in self.months or day.year not in self.years:
            return False
        length = calendar.monthrange(day.year, day.month)[1]
        dom, dow = self.day_of_month, self.day_of_week
        if dom != "?":
            if dom == "L":
                return day.day == length
            if dom.endswith("W"):
                target = length if dom == "LW" else int(dom[:-1])
                return day.day == (_nearest_weekday(day.year, day.month, target) or -1)
            return day.day in _values(dom, 1, 31)
        weekday = _sunday_first(day)
        if "#" in dow:
            wanted, k = dow.split("#")
            return weekday == _value(wanted, _DAYS) and (day.day + 6) // 7 == int(k)
        if dow == "L":
            return weekday == 7
        if dow.endswith("L"):
            return weekday == _value(dow[:-1], _DAYS) and day.day > length - 7
        return weekday in _values(dow, 1, 7, _DAYS)

    def next_after(self, moment: datetime) -> datetime | None:
        """The first instant strictly after `moment` (aware) at which the schedule is due, in UTC."""
        instant = (moment.astimezone(UTC) + timedelta(minutes=1)).replace(second=0, microsecond=0)
        end = instant + _HORIZON
        while instant < end:
            wall = instant.astimezone(self.zone)
            if not self._day_matches(wall.date()):
                # Jump towards the next wall day; an hour short of it, since a day may be 23 hours long.
                to_midnight = (24 - wall.hour) * 60 - wall.minute
                instant += timedelta(minutes=max(1, to_midnight - 60))
            elif wall.hour not in self.hours:
                instant += timedelta(minutes=60 - wall.minute)
            elif wall.minute not in self.minutes or wall.fold:  # fold: a repeated hour's second reading
                later = [m for m in self.minutes if m > wall.minute]
                instant += timedelta(minutes=(later[0] if later else 60) - wall.minute)
            else:
                return instant
        return None

"""Disruption budgets: how many of a pool's nodes voluntary disruption may take at once, and when.

A pool's `disruption.budgets` are Karpenter's NodePool budgets. Each has `nodes` — a count (`3`) or a
share of the pool's nodes (`10%`, rounded up as Karpenter rounds it) — and optionally `reasons` (the
budget applies only to Empty, Underutilized or Drifted disruption) and a `schedule` with a `duration`
(the budget applies only while a firing of the schedule is less than `duration` old). The allowance
for a reason is the smallest `nodes` of the budgets that apply now, less the pool's nodes already being
disrupted or NotReady (the caller counts, as Karpenter does, only initialized nodes); with no budget
applying, disruption is unbounded (Karpenter's semantics: a pool that lists no budgets at all gets the
configuration's default of 10%). `nodes: "0"` with a schedule is the usual way to say "never during
business hours".

Schedules are evaluated in UTC, as Karpenter evaluates them, and take either Karpenter's syntax — five
fields `minute hour day-of-month month day-of-week` (day-of-week 0-7, 0 and 7 Sunday), or the macros
`@yearly @annually @monthly @weekly @daily @midnight @hourly` — or an EventBridge expression
`cron(min hour dom month dow year)`, the syntax of scaling windows. Both are evaluated by the one cron
implementation in `windows`.
"""

from __future__ import annotations

import math
import re
from datetime import UTC
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from gpu_autoscaler.domain.windows import CronError, CronExpression

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from gpu_autoscaler.config import Budget, DisruptionReason

__all__ = ["allowed_disruptions", "budget_active", "parse_budget_schedule"]

_UTC = ZoneInfo("UTC")
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_DOW_NUMBER = re.compile(r"\d+")


def _eventbridge_day_of_week(field: str) -> str:
    """Standard cron's 0-7 (0 and 7 Sunday) as EventBridge's 1-7 (1 Sunday); names pass through. A range ending on
    7 becomes one wrapping past Saturday (`5-7`, Friday to Sunday, is `6-1`), which the evaluator reads as such;
    `0-7`, Sunday to Sunday, is every day (number by number it would be `1-1`, Sunday alone)."""
    if "/" in field:
        raise CronError(f"day-of-week: steps ('{field}') are not supported in budget schedules")

    def convert(match: re.Match[str]) -> str:
        number = int(match.group(0))
        if number > 7:
            raise CronError(f"day-of-week: {number} is out of range 0-7")
        return str(number % 7 + 1)

    return ",".join("1-7" if part.strip() == "0-7" else _DOW_NUMBER.sub(convert, part) for part in field.split(","))


def parse_budget_schedule(schedule: str) -> CronExpression:
    """A budget's schedule as a cron expression; `CronError` names the problem."""
    text = schedule.strip()
    if text.lower().startswith("cron("):
        return CronExpression.parse(text)
    text = _MACROS.get(text.lower(), text)
    fields = text.split()
    if len(fields) != 5:
        raise CronError(
            f"'{schedule}' is not a cron schedule: give five fields 'minute hour day-of-month month day-of-week' "
            "(e.g. '0 9 * * mon-fri'), a macro such as '@daily', or 'cron(...)'"
        )
    minute, hour, dom, month, dow = fields
    if dom != "*" and dow != "*":
        raise CronError(f"'{schedule}': restrict day-of-month or day-of-week, not both")
    if dow == "*":
        dow = "?"
    else:
        dom = "?"
        dow = _eventbridge_day_of_week(dow)
    return CronExpression.parse(f"cron({minute} {hour} {dom} {month} {dow} *)")


def budget_active(budget: Budget, now: datetime) -> bool:
    """A budget without a schedule always applies; one with a schedule while its last firing is younger
    than its duration."""
    if budget.schedule is None or budget.duration is None:
        return True
    fired = parse_budget_schedule(budget.schedule).previous_at_or_before(now.astimezone(UTC), _UTC)
    return fired is not None and now < fired + budget.duration


def _nodes(budget: Budget, pool_nodes: int) -> int:
    if budget.nodes.endswith("%"):
        return math.ceil(pool_nodes * int(budget.nodes[:-1]) / 100)
    return int(budget.nodes)


def allowed_disruptions(budgets: Sequence[Budget], reason: DisruptionReason, pool_nodes: int, disrupting: int,
                        now: datetime) -> int | None:
    """How many more of the pool's nodes may be disrupted for `reason` now; None when no budget bounds it.

    `pool_nodes`: the pool's initialized nodes (those being disrupted included: a percentage is of the whole
    pool); `disrupting`: how many of them are being drained already, for any reason, or are NotReady.
    """
    limits = [
        _nodes(b, pool_nodes) for b in budgets
        if (b.reasons is None or reason in b.reasons) and budget_active(b, now)
    ]
    if not limits:
        return None
    return max(0, min(limits) - disrupting)

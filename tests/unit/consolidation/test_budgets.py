"""Disruption budgets: counts and percentages, reasons, and Karpenter's cron schedules evaluated in UTC."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpu_autoscaler.config import Budget, ConfigError
from gpu_autoscaler.domain.budgets import allowed_disruptions, budget_active, parse_budget_schedule
from gpu_autoscaler.domain.windows import CronError
from tests.unit.consolidation.builders import make_config, make_pool

MONDAY_10 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
SUNDAY_10 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def test_counts_and_percentages_rounded_up_less_what_is_already_disrupted() -> None:
    assert allowed_disruptions([Budget(nodes="3")], "Empty", 40, 1, MONDAY_10) == 2
    assert allowed_disruptions([Budget(nodes="10%")], "Empty", 25, 0, MONDAY_10) == 3
    assert allowed_disruptions([Budget(nodes="10%")], "Empty", 25, 5, MONDAY_10) == 0
    assert allowed_disruptions([Budget(nodes="10%"), Budget(nodes="1")], "Drifted", 25, 0, MONDAY_10) == 1
    assert allowed_disruptions([], "Empty", 25, 0, MONDAY_10) is None


def test_a_budget_applies_only_to_its_reasons() -> None:
    budgets = [Budget(nodes="0", reasons=["Underutilized"]), Budget(nodes="50%")]
    assert allowed_disruptions(budgets, "Underutilized", 10, 0, MONDAY_10) == 0
    assert allowed_disruptions(budgets, "Empty", 10, 0, MONDAY_10) == 5


@pytest.mark.parametrize(("schedule", "moment", "active"), [
    ("0 9 * * mon-fri", MONDAY_10, True),
    ("0 9 * * mon-fri", SUNDAY_10, False),
    ("0 9 * * 1-5", MONDAY_10, True),      # 0-7, Sunday 0 (and 7)
    ("0 9 * * 0", SUNDAY_10, True),
    ("0 9 * * 7", SUNDAY_10, True),
    ("0 9 * * 1-5", SUNDAY_10, False),
    ("0 9 * * 0-7", MONDAY_10, True),      # every day: 0 and 7 both Sunday
    ("0 9 * * 0-7", SUNDAY_10, True),
    ("0 9 * * 5-7", SUNDAY_10, True),      # Friday to Sunday
    ("0 9 * * 5-7", MONDAY_10, False),
    ("0 9 * * 1-7", MONDAY_10, True),      # Monday to Sunday
    ("@daily", MONDAY_10, False),          # 00:00 for 8 h: over by 10:00
    ("@hourly", MONDAY_10, True),
    ("cron(0 9 ? * MON-FRI *)", MONDAY_10, True),
    ("0 9 23 11 *", MONDAY_10, True),
])
def test_a_scheduled_budget_holds_from_each_firing_for_its_duration(schedule: str, moment: datetime,
                                                                   active: bool) -> None:
    assert budget_active(Budget(nodes="0", schedule=schedule, duration="8h"), moment) is active


@pytest.mark.parametrize("schedule", ["0 9 * *", "0 9 1 * mon", "0 9 * * */2", "0 25 * * *", "@sometimes"])
def test_schedules_that_cannot_be_evaluated_are_refused(schedule: str) -> None:
    with pytest.raises(CronError):
        parse_budget_schedule(schedule)


def test_the_configuration_names_a_bad_budget_schedule() -> None:
    with pytest.raises(ConfigError, match="budgets"):
        make_config(make_pool(disruption={"budgets": [{"nodes": "0", "schedule": "0 9 1 * mon", "duration": "1h"}]}))
    with pytest.raises(ConfigError, match="schedule and duration go together"):
        make_config(make_pool(disruption={"budgets": [{"nodes": "0", "schedule": "@daily"}]}))

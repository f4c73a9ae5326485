"""The EventBridge rules that feed the interruption queue: one pattern per kind of event.

The stack creates a rule from each; the emulator routes events put on its bus by the same patterns.
"""

from __future__ import annotations

from typing import Any

__all__ = ["INTERRUPTION_RULES", "matches"]

INTERRUPTION_RULES: dict[str, dict[str, Any]] = {
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state-change": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance State-change Notification"],
        "detail": {"state": ["stopping", "stopped", "shutting-down", "terminated"]},
    },
    # EC2 User Guide, "Monitor interruptible Capacity Reservations": the warning 2 minutes before an instance in an
    # interruptible reservation is terminated. The page's versions give the detail-type both ways.
    "reservation-interruption": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning",
                        "EC2 Interruptible Capacity Reservation Instance Interruption Warning"],
    },
    # EC2 User Guide, "Monitor Capacity Blocks using EventBridge": 40 minutes before a Capacity Block ends (its
    # instances are terminated from 30 minutes before the end); names the reservation, not its instances. The
    # page's versions spell the detail-type both ways.
    "capacity-block-expiry": {
        "source": ["aws.ec2"],
        "detail-type": ["Capacity Block Reservation Expiration Warning", "Capacity Block Expiration Warning"],
    },
    "scheduled-change": {
        "source": ["aws.health"],
        "detail-type": ["AWS Health Event"],
        "detail": {"service": ["EC2"], "eventTypeCategory": ["scheduledChange"]},
    },
}


def matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    """EventBridge's exact-value matching, the subset these rules use: every key must match one listed value."""
    for key, expected in pattern.items():
        actual = event.get(key)
        if isinstance(expected, dict):
            if not isinstance(actual, dict) or not matches(expected, actual):
                return False
        elif actual not in expected:
            return False
    return True

"""`gpu-autoscaler doctor`'s reservation check over a fake EC2: what the emulator's reservations cannot show."""

from __future__ import annotations

from typing import Any

from gpu_autoscaler.cli.doctor_checks import check_reservations
from gpu_autoscaler.cli.doctor_context import DoctorContext
from gpu_autoscaler.config import parse_config
from tests.conftest import example_config_data


class _Account:
    """EC2 answering DescribeCapacityReservations per id from `items`."""

    def __init__(self, *items: dict[str, Any]) -> None:
        self.items = {i["CapacityReservationId"]: i for i in items}

    def client(self, service: str) -> Any:
        assert service == "ec2"
        items = self.items

        class Ec2:
            def describe_capacity_reservations(self, CapacityReservationIds: list[str]) -> dict[str, Any]:  # noqa: N803
                return {"CapacityReservations": [items[i] for i in CapacityReservationIds]}

        return Ec2()


def reservation(reservation_id: str, **fields: Any) -> dict[str, Any]:
    return {"CapacityReservationId": reservation_id, "InstanceType": "p5.48xlarge", "InstancePlatform": "Linux/UNIX",
            "AvailabilityZone": "us-east-1a", "Tenancy": "default", "State": "active", "AvailableInstanceCount": 1,
            "TotalInstanceCount": 2, **fields}


def test_a_reservation_for_another_platform_or_tenancy_fails_with_the_reason() -> None:
    """Only an instance with "matching attributes (instance type, platform, Availability Zone, and tenancy)" runs in
    a reservation (EC2 User Guide, "Launch instances into an existing Capacity Reservation"); our nodes are
    Linux/UNIX with default tenancy."""
    data = example_config_data()
    data["nodePools"][0]["capacityReservations"] = [{"id": i} for i in ("cr-0aaa", "cr-0bbb", "cr-0ccc")]
    account = _Account(reservation("cr-0aaa"), reservation("cr-0bbb", InstancePlatform="Windows"),
                       reservation("cr-0ccc", Tenancy="dedicated"))
    checks = {c.name: c for c in check_reservations(DoctorContext(parse_config(data), account, None))}  # type: ignore[arg-type]
    assert checks["reservation cr-0aaa"].status == "pass"
    assert checks["reservation cr-0bbb"].status == "fail"
    assert "platform Windows, not Linux/UNIX" in checks["reservation cr-0bbb"].detail
    assert checks["reservation cr-0ccc"].status == "fail"
    assert "tenancy dedicated, not default" in checks["reservation cr-0ccc"].detail

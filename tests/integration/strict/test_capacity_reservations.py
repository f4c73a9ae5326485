"""The Capacity Reservations stand-in: reservations, reserved launches, and open reservations consumed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws


def reserve(ec2: Any, instance_type: str = "p5.48xlarge", zone: str = "us-east-1a", count: int = 2,
            match: str = "open") -> str:
    return str(ec2.create_capacity_reservation(InstanceType=instance_type, InstancePlatform="Linux/UNIX",
                                               AvailabilityZone=zone, InstanceCount=count,
                                               InstanceMatchCriteria=match)["CapacityReservation"][
        "CapacityReservationId"])


def available(ec2: Any, reservation: str) -> int:
    [found] = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation])["CapacityReservations"]
    return int(found["AvailableInstanceCount"])


def fleet(aws: EmbeddedAws, capacity_type: str, instance_type: str, zone: str = "us-east-1a", count: int = 1,
          **extra: Any) -> dict[str, Any]:
    template = "reserved" if capacity_type == "reserved-capacity" else capacity_type
    return {
        "Type": "instant",
        "LaunchTemplateConfigs": [{
            "LaunchTemplateSpecification": {"LaunchTemplateId": aws.resources.launch_templates[template],
                                            "Version": "$Default"},
            "Overrides": [{"InstanceType": instance_type, "SubnetId": aws.zone_subnets[zone], "Priority": 0.0}],
        }],
        "TargetCapacitySpecification": {"TotalTargetCapacity": count, "DefaultTargetCapacityType": capacity_type},
        **extra,
    }


def reserved_options(*ids: str) -> dict[str, Any]:
    return {"ReservedCapacityOptions": {"ReservationTypes": ["on-demand-capacity-reservation"],
                                        "CapacityReservationTarget": {"CapacityReservationIds": list(ids)}}}


def test_a_reserved_fleet_launches_into_its_reservation_until_it_is_full(aws: EmbeddedAws, ec2: Any) -> None:
    reservation = reserve(ec2, "p4d.24xlarge", count=2, match="targeted")
    response = ec2.create_fleet(**fleet(aws, "reserved-capacity", "p4d.24xlarge", count=2,
                                        **reserved_options(reservation)))
    assert sum(len(i["InstanceIds"]) for i in response["Instances"]) == 2 and not response["Errors"]
    assert available(ec2, reservation) == 0
    full = ec2.create_fleet(**fleet(aws, "reserved-capacity", "p4d.24xlarge", **reserved_options(reservation)))
    assert not full["Instances"] and full["Errors"][0]["ErrorCode"] == "ReservationCapacityExceeded"


def test_a_reservation_of_another_type_or_zone_launches_nothing(aws: EmbeddedAws, ec2: Any) -> None:
    reservation = reserve(ec2, "p4d.24xlarge", zone="us-east-1b", count=1, match="targeted")
    response = ec2.create_fleet(**fleet(aws, "reserved-capacity", "p4d.24xlarge", zone="us-east-1a",
                                        **reserved_options(reservation)))
    assert not response["Instances"] and response["Errors"][0]["ErrorCode"] == "InvalidParameterCombination"
    assert available(ec2, reservation) == 1


def test_an_unknown_reservation_is_refused(aws: EmbeddedAws, ec2: Any) -> None:
    with pytest.raises(ClientError) as caught:
        ec2.create_fleet(**fleet(aws, "reserved-capacity", "p4d.24xlarge", **reserved_options("cr-0000000000000000f")))
    assert caught.value.response["Error"]["Code"] == "InvalidCapacityReservationId.NotFound"


def test_on_demand_launches_stay_out_of_open_reservations(aws: EmbeddedAws, ec2: Any) -> None:
    """Issue 14 defect 2: the On-Demand template says `none`; a launch that says nothing eats the reservation."""
    reservation = reserve(ec2, "p5.48xlarge", zone="us-east-1c", count=1)
    ec2.create_fleet(**fleet(aws, "on-demand", "p5.48xlarge", zone="us-east-1c"))
    assert available(ec2, reservation) == 1
    ec2.run_instances(ImageId=aws.config.ami.x86_64, InstanceType="p5.48xlarge", MinCount=1, MaxCount=1,
                      SubnetId=aws.zone_subnets["us-east-1c"])  # no preference: open
    assert available(ec2, reservation) == 0

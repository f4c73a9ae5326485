"""The Capacity Reservations stand-in: reservations, reserved launches, and open reservations consumed."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from gpu_autoscaler.emulator.strict.ec2_capacity_reservations import Reservation, register_reservation

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws


def reserve(ec2: Any, instance_type: str = "p5.48xlarge", zone: str = "us-east-1a", count: int = 2,
            match: str = "open") -> str:
    return str(ec2.create_capacity_reservation(InstanceType=instance_type, InstancePlatform="Linux/UNIX",
                                               AvailabilityZone=zone, InstanceCount=count,
                                               InstanceMatchCriteria=match)["CapacityReservation"][
        "CapacityReservationId"])


def capacity_block(aws: EmbeddedAws, instance_type: str = "p4d.24xlarge", zone: str = "us-east-1a", count: int = 1,
                   ends: datetime | None = None) -> str:
    """A Capacity Block, put in place as the configuration's are: a block is bought (PurchaseCapacityBlock), not made
    with CreateCapacityReservation, and is always targeted ("Capacity Blocks are delivered as targeted Capacity
    Reservations", EC2 User Guide, "Work with Capacity Blocks")."""
    account = aws.clients.client("sts").get_caller_identity()["Account"]
    return register_reservation(Reservation(
        id=f"cr-{secrets.token_hex(9)[:17]}", account=account, region=aws.config.region, instance_type=instance_type,
        zone=zone, total=count, available=count, match="targeted", kind="capacity-block", end=ends)).id


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


def reserved_options(*ids: str, kinds: tuple[str, ...] = ("on-demand-capacity-reservation",)) -> dict[str, Any]:
    return {"ReservedCapacityOptions": {"ReservationTypes": list(kinds),
                                        "CapacityReservationTarget": {"CapacityReservationIds": list(ids)}}}


def launched(response: dict[str, Any]) -> list[tuple[str, str]]:
    """(instance id, lifecycle) of what an instant fleet launched."""
    return [(i, item["Lifecycle"]) for item in response["Instances"] for i in item["InstanceIds"]]


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


def test_a_capacity_block_is_described_with_its_end(aws: EmbeddedAws, ec2: Any) -> None:
    """A block runs for the days bought and ends at a set time: DescribeCapacityReservations says `EndDateType`
    `limited` ("The Capacity Reservation expires automatically at a specified date and time", EC2 API Reference,
    CapacityReservation) and its `EndDate`; an On-Demand Capacity Reservation made without an end is `unlimited`."""
    ends = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)
    block = capacity_block(aws, ends=ends)
    [found] = ec2.describe_capacity_reservations(CapacityReservationIds=[block])["CapacityReservations"]
    assert (found["ReservationType"], found["EndDateType"], found["EndDate"]) == ("capacity-block", "limited", ends)
    [odcr] = ec2.describe_capacity_reservations(CapacityReservationIds=[reserve(ec2)])["CapacityReservations"]
    assert odcr["EndDateType"] == "unlimited" and "EndDate" not in odcr


def test_a_reserved_fleet_uses_only_the_reservation_types_it_names_in_their_order(aws: EmbeddedAws, ec2: Any) -> None:
    """`ReservationTypes` "is an ordered list: EC2 Fleet attempts to launch instances into each Capacity Reservation
    type in the order that you specify them before moving on to the next type" (EC2 API Reference,
    ReservedCapacityOptionsRequest). A block targeted by a request that names On-Demand Capacity Reservations only is
    not used: what it would have held is short (`ReservationCapacityExceeded`)."""
    block = capacity_block(aws, "p4de.24xlarge", zone="us-east-1b")
    odcr_only = ec2.create_fleet(**fleet(aws, "reserved-capacity", "p4de.24xlarge", zone="us-east-1b",
                                         **reserved_options(block)))
    assert not odcr_only["Instances"] and odcr_only["Errors"][0]["ErrorCode"] == "ReservationCapacityExceeded"
    assert available(ec2, block) == 1
    odcr = reserve(ec2, "p4de.24xlarge", zone="us-east-1b", count=1, match="targeted")
    first = ec2.create_fleet(**fleet(aws, "reserved-capacity", "p4de.24xlarge", zone="us-east-1b", **reserved_options(
        odcr, block, kinds=("capacity-block", "on-demand-capacity-reservation"))))
    assert [lifecycle for _, lifecycle in launched(first)] == ["capacity-block"]
    assert (available(ec2, block), available(ec2, odcr)) == (0, 1)
    then = ec2.create_fleet(**fleet(aws, "reserved-capacity", "p4de.24xlarge", zone="us-east-1b", **reserved_options(
        odcr, block, kinds=("capacity-block", "on-demand-capacity-reservation"))))
    assert [lifecycle for _, lifecycle in launched(then)] == ["on-demand"] and available(ec2, odcr) == 0


def test_a_capacity_block_asked_for_more_than_it_holds_launches_what_it_holds(aws: EmbeddedAws, ec2: Any) -> None:
    """"If the target capacity request exceeds the limits of your Capacity Block reservation, you will receive an
    Insufficient Capacity Exception for the capacity that exceeds the limits", and "EC2 Fleet will fulfill as much
    capacity as it can and return the instances that it was able to launch" (EC2 User Guide, "Tutorial: Configure
    your EC2 Fleet to launch instances into Capacity Blocks"): `InsufficientInstanceCapacity`, "There is not enough
    capacity to fulfill your request" (EC2 API Reference, "Error codes for the Amazon EC2 API")."""
    block = capacity_block(aws, "p5.48xlarge", zone="us-east-1b")
    response = ec2.create_fleet(**fleet(aws, "reserved-capacity", "p5.48xlarge", zone="us-east-1b", count=2,
                                        **reserved_options(block, kinds=("capacity-block",))))
    assert [lifecycle for _, lifecycle in launched(response)] == ["capacity-block"]
    assert [e["ErrorCode"] for e in response["Errors"]] == ["InsufficientInstanceCapacity"]
    assert available(ec2, block) == 0


def described(ec2: Any, instance_id: str) -> dict[str, Any]:
    [found] = [i for r in ec2.describe_instances(InstanceIds=[instance_id])["Reservations"] for i in r["Instances"]]
    return dict(found)


def test_an_instance_in_a_reservation_is_described_with_it(aws: EmbeddedAws, ec2: Any) -> None:
    """DescribeInstances names the reservation an instance runs in (`CapacityReservationId`, EC2 API Reference,
    Instance) and a Capacity Block's instances by their lifecycle (`InstanceLifecycle` `capacity-block`, as Karpenter
    reads them, karpenter-provider-aws pkg/providers/instance/types.go `NewInstance`); an instance in none carries
    neither."""
    odcr = reserve(ec2, "p4d.24xlarge", zone="us-east-1c", count=1, match="targeted")
    [(in_odcr, _)] = launched(ec2.create_fleet(**fleet(aws, "reserved-capacity", "p4d.24xlarge", zone="us-east-1c",
                                                       **reserved_options(odcr))))
    block = capacity_block(aws, "p4d.24xlarge", zone="us-east-1c")
    [(in_block, _)] = launched(ec2.create_fleet(**fleet(aws, "reserved-capacity", "p4d.24xlarge", zone="us-east-1c",
                                                        **reserved_options(block, kinds=("capacity-block",)))))
    [(outside, _)] = launched(ec2.create_fleet(**fleet(aws, "on-demand", "p4d.24xlarge", zone="us-east-1c")))
    assert described(ec2, in_odcr).get("CapacityReservationId") == odcr
    assert "InstanceLifecycle" not in described(ec2, in_odcr)
    found = described(ec2, in_block)
    assert (found.get("CapacityReservationId"), found.get("InstanceLifecycle")) == (block, "capacity-block")
    assert "CapacityReservationId" not in described(ec2, outside)


def test_a_terminated_instance_gives_its_reservation_back_its_place(aws: EmbeddedAws, ec2: Any) -> None:
    """"When you stop or terminate an instance in a Capacity Block, it takes several minutes to clean up your instance
    ... Then, the available capacity in your Capacity Block will update to show another instance available to use"
    (EC2 User Guide, "Launch instances using Capacity Blocks"); an On-Demand Capacity Reservation holds running
    instances alike. Terminating an instance again gives nothing more back."""
    odcr = reserve(ec2, "p5.48xlarge", zone="us-east-1c", count=1, match="targeted")
    block = capacity_block(aws, "p5.48xlarge", zone="us-east-1c")
    [(in_odcr, _)] = launched(ec2.create_fleet(**fleet(aws, "reserved-capacity", "p5.48xlarge", zone="us-east-1c",
                                                       **reserved_options(odcr))))
    [(in_block, _)] = launched(ec2.create_fleet(**fleet(aws, "reserved-capacity", "p5.48xlarge", zone="us-east-1c",
                                                        **reserved_options(block, kinds=("capacity-block",)))))
    assert (available(ec2, odcr), available(ec2, block)) == (0, 0)
    ec2.terminate_instances(InstanceIds=[in_odcr, in_block])
    assert (available(ec2, odcr), available(ec2, block)) == (1, 1)
    ec2.terminate_instances(InstanceIds=[in_odcr])
    assert available(ec2, odcr) == 1

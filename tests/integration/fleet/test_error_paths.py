"""What moto cannot produce, through the real EC2 adapter and botocore's Stubber; claims in DynamoDB on moto.

Each stubbed CreateFleet call names the exact parameters expected (the request the domain builds), so these
tests also pin down what EC2 is asked for reserved capacity, Capacity Blocks and the fallback to On-Demand.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from gpu_autoscaler.adapters.aws.fleet import NOT_FOUND_RETRIES, Ec2Compute, render_create_fleet
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.domain.catalog import ANY
from gpu_autoscaler.domain.fleet import Attempt, LaunchContext, build_request
from gpu_autoscaler.errors import RequestThrottled
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.services.fleet import FleetService
from tests.integration.fleet.helpers import new_claim

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.models.fleet import FleetRequest

TEMPLATE = "lt-0abc1234567890def"
SUBNETS = {"us-east-1a": "subnet-0aaa", "us-east-1b": "subnet-0bbb", "us-east-1c": "subnet-0ccc"}


@pytest.fixture
def ec2() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("ec2", region_name="us-east-1")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def service(ec2: tuple[Any, Stubber], store: DynamoStateStore, config: Config, sleeps: list[float]) -> FleetService:
    client, _ = ec2
    return FleetService(config, store, Ec2Compute(client, config.cluster_name), clock=SystemClock(),
                        launch_template_id=TEMPLATE, sleep=sleeps.append, rng=random.Random(3))


def expected(config: Config, claims: list[NodeClaim], number: int, capacity_type: str,
             offerings: list[tuple[str, str]]) -> tuple[FleetRequest, dict[str, Any]]:
    context = LaunchContext.from_config(config, TEMPLATE)
    request = build_request(claims, config.pool(claims[0].pool), Attempt(number, capacity_type, tuple(offerings)),  # type: ignore[arg-type]
                            context)
    return request, render_create_fleet(request)


def launched(request: FleetRequest, instance_id: str, instance_type: str, zone: str, lifecycle: str) -> dict[str, Any]:
    return {"FleetId": "fleet-0123", "Errors": [], "Instances": [{
        "LaunchTemplateAndOverrides": {
            "LaunchTemplateSpecification": {"LaunchTemplateId": TEMPLATE, "Version": "1"},
            "Overrides": {"InstanceType": instance_type, "SubnetId": SUBNETS[zone]},
        },
        "Lifecycle": lifecycle, "InstanceIds": [instance_id], "InstanceType": instance_type,
    }]}


def no_capacity(request: FleetRequest, code: str = "InsufficientInstanceCapacity") -> dict[str, Any]:
    return {"FleetId": "fleet-0456", "Instances": [], "Errors": [{
        "LaunchTemplateAndOverrides": {
            "LaunchTemplateSpecification": {"LaunchTemplateId": TEMPLATE, "Version": "1"},
            "Overrides": {"InstanceType": o.instance_type, "SubnetId": o.subnet_id},
        },
        "Lifecycle": "spot" if request.capacity_type == "spot" else "on-demand",
        "ErrorCode": code, "ErrorMessage": "We currently do not have sufficient capacity in the zone you requested.",
    } for o in request.overrides]}


def launch(service: FleetService, *claim_ids: str, gang: str | None = None) -> Any:
    return service.launch(LaunchRequest(cluster="ml-prod", claim_ids=list(claim_ids), gang=gang))


def test_spot_without_capacity_marks_offerings_and_falls_back_to_on_demand(
        ec2: tuple[Any, Stubber], service: FleetService, store: DynamoStateStore, config: Config) -> None:
    _, stubber = ec2
    claim = new_claim(store, "stub-spot-ice", zones=("us-east-1a",))
    offerings = [("g6.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1a")]
    spot, spot_params = expected(config, [claim], 0, "spot", offerings)
    on_demand, od_params = expected(config, [claim], 1, "on-demand", offerings)
    stubber.add_response("create_fleet", no_capacity(spot), spot_params)
    stubber.add_response("create_fleet", launched(on_demand, "i-0aaa000000000001", "g6.xlarge", "us-east-1a",
                                                  "on-demand"), od_params)
    outcome = launch(service, claim.id)
    stored = store.get_claim(claim.id)
    assert stored is not None and stored.state is ClaimState.LAUNCHED
    assert (stored.instance_id, stored.capacity_type, stored.zone) == ("i-0aaa000000000001", "on-demand", "us-east-1a")
    assert {("g6.xlarge", "us-east-1a", "spot"), ("g5.xlarge", "us-east-1a", "spot")} <= store.unavailable_offerings()
    assert sorted(outcome.unavailable) == [("g5.xlarge", "us-east-1a", "spot"), ("g6.xlarge", "us-east-1a", "spot")]
    assert od_params["OnDemandOptions"] == {"AllocationStrategy": "lowest-price"}
    assert spot_params["ClientToken"] != od_params["ClientToken"]


def test_request_limit_exceeded_is_retried_with_backoff(
        ec2: tuple[Any, Stubber], service: FleetService, store: DynamoStateStore, config: Config,
        sleeps: list[float]) -> None:
    _, stubber = ec2
    claim = new_claim(store, "stub-throttled", zones=("us-east-1b",), instance_types=("g6.xlarge",))
    request, params = expected(config, [claim], 0, "spot", [("g6.xlarge", "us-east-1b")])
    for _ in range(2):
        stubber.add_client_error("create_fleet", service_error_code="RequestLimitExceeded",
                                 service_message="Request limit exceeded.", http_status_code=503,
                                 expected_params=params)
    stubber.add_response("create_fleet", launched(request, "i-0bbb000000000001", "g6.xlarge", "us-east-1b", "spot"),
                         params)
    launch(service, claim.id)
    assert len(sleeps) == 2 and all(0 <= s <= 1.0 for s in sleeps)
    stored = store.get_claim(claim.id)
    assert stored is not None and stored.state is ClaimState.LAUNCHED


def test_persistent_throttling_leaves_the_claim_pending_for_the_redelivery(
        ec2: tuple[Any, Stubber], service: FleetService, store: DynamoStateStore, config: Config) -> None:
    _, stubber = ec2
    claim = new_claim(store, "stub-throttled-long", zones=("us-east-1b",), instance_types=("g6.xlarge",))
    for _ in range(4):
        stubber.add_client_error("create_fleet", service_error_code="RequestLimitExceeded", http_status_code=503)
    with pytest.raises(RequestThrottled):
        launch(service, claim.id)
    stored = store.get_claim(claim.id)
    assert stored is not None and stored.state is ClaimState.PENDING
    assert store.assignments(list(claim.pods)) == {claim.pods[0]: claim.id}


@pytest.mark.parametrize(("code", "status"), [("InternalError", 500), ("Unavailable", 503),
                                            ("ServiceUnavailable", 503), ("BadGateway", 502)])
def test_a_server_error_leaves_the_claim_pending_for_the_redelivery(
        ec2: tuple[Any, Stubber], service: FleetService, store: DynamoStateStore, code: str, status: int) -> None:
    """EC2's server errors are transient ("InternalError ... Retry your request"; "Unavailable — The server is
    overloaded", EC2 API Reference, "Error codes for the Amazon EC2 API"): retried as throttling is, never a refusal
    that ends the claim (Karpenter requeues any create error but insufficient capacity)."""
    _, stubber = ec2
    claim = new_claim(store, f"stub-{code.lower()}", zones=("us-east-1b",), instance_types=("g6.xlarge",))
    for _ in range(4):
        stubber.add_client_error("create_fleet", service_error_code=code, http_status_code=status,
                                 service_message="The server is overloaded and can't handle the request.")
    with pytest.raises(RequestThrottled, match=code):
        launch(service, claim.id)
    stored = store.get_claim(claim.id)
    assert stored is not None and stored.state is ClaimState.PENDING
    assert store.assignments(list(claim.pods)) == {claim.pods[0]: claim.id}


def test_an_invalid_request_ends_the_claim_and_releases_its_pods(
        ec2: tuple[Any, Stubber], service: FleetService, store: DynamoStateStore) -> None:
    _, stubber = ec2
    claim = new_claim(store, "stub-invalid", zones=("us-east-1b",), instance_types=("g6.xlarge",))
    stubber.add_client_error("create_fleet", service_error_code="InvalidLaunchTemplateId.NotFound",
                             service_message="The specified launch template does not exist.")
    outcome = launch(service, claim.id)
    stored = store.get_claim(claim.id)
    assert stored is not None and stored.state is ClaimState.TERMINATED
    assert "InvalidLaunchTemplateId.NotFound" in stored.reason
    assert store.assignments(list(claim.pods)) == {}
    assert outcome.failed[0].code == "InvalidLaunchTemplateId.NotFound"


@pytest.mark.parametrize(("code", "instance_type"), [("UnfulfillableCapacity", "g5.4xlarge"),
                                                      ("MaxSpotInstanceCountExceeded", "g5.8xlarge"),
                                                      ("VcpuLimitExceeded", "g5.16xlarge")])
def test_other_capacity_errors_mark_the_offering_too(
        ec2: tuple[Any, Stubber], service: FleetService, store: DynamoStateStore, config: Config, code: str,
        instance_type: str) -> None:
    _, stubber = ec2
    claim = new_claim(store, f"stub-{code.lower()}", zones=("us-east-1c",), instance_types=(instance_type,))
    spot, params = expected(config, [claim], 0, "spot", [(instance_type, "us-east-1c")])
    stubber.add_response("create_fleet", no_capacity(spot, code), params)
    on_demand, od_params = expected(config, [claim], 1, "on-demand", [(instance_type, "us-east-1c")])
    stubber.add_response("create_fleet", no_capacity(on_demand, code), od_params)
    outcome = launch(service, claim.id)
    assert {(instance_type, "us-east-1c", "spot"), (instance_type, "us-east-1c", "on-demand")} <= (
        store.unavailable_offerings())
    assert outcome.failed[0].code == code
    stored = store.get_claim(claim.id)
    assert stored is not None and stored.state is ClaimState.TERMINATED


def test_reserved_launches_into_the_reservation(
        ec2: tuple[Any, Stubber], service: FleetService, store: DynamoStateStore, config: Config) -> None:
    _, stubber = ec2
    claim = new_claim(store, "stub-reserved", pool="gpu-reserved", capacity_type="reserved",
                      instance_types=("p5.48xlarge",), zones=("us-east-1a",), reservation_id="cr-0123456789abcdef0")
    request, params = expected(config, [claim], 0, "reserved", [("p5.48xlarge", "us-east-1a")])
    assert params["ReservedCapacityOptions"]["CapacityReservationTarget"] == {
        "CapacityReservationIds": ["cr-0123456789abcdef0"]}
    assert params["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "reserved-capacity"
    stubber.add_response("create_fleet", launched(request, "i-0ccc000000000001", "p5.48xlarge", "us-east-1a",
                                                  "on-demand"), params)
    launch(service, claim.id)
    stored = store.get_claim(claim.id)
    assert stored is not None and stored.capacity_type == "reserved" and stored.instance_id == "i-0ccc000000000001"


def test_a_full_capacity_block_falls_back_to_on_demand(
        ec2: tuple[Any, Stubber], store: DynamoStateStore, config: Config) -> None:
    client, stubber = ec2
    data = config.model_dump(by_alias=True)
    pool = next(p for p in data["nodePools"] if p["name"] == "gpu-reserved")
    pool["capacityReservations"] = [{"id": "cr-0b10c4000000000aa", "type": "capacity-block"}]
    blocks = type(config).model_validate(data)
    service = FleetService(blocks, store, Ec2Compute(client, "ml-prod"), clock=SystemClock(),
                           launch_template_id=TEMPLATE, sleep=lambda _: None)
    claim = new_claim(store, "stub-block", pool="gpu-reserved", capacity_type="reserved",
                      instance_types=("p5.48xlarge",), zones=("us-east-1a",), reservation_id="cr-0b10c4000000000aa")
    request, params = expected(blocks, [claim], 0, "reserved", [("p5.48xlarge", "us-east-1a")])
    assert params["ReservedCapacityOptions"]["ReservationTypes"] == ["capacity-block"]
    stubber.add_response("create_fleet", no_capacity(request, "ReservationCapacityExceeded"), params)
    fallback, od_params = expected(blocks, [claim], 1, "on-demand", [("p5.48xlarge", "us-east-1a")])
    stubber.add_response("create_fleet", launched(fallback, "i-0ddd000000000001", "p5.48xlarge", "us-east-1a",
                                                  "on-demand"), od_params)
    service.launch(LaunchRequest(cluster="ml-prod", claim_ids=[claim.id]))
    assert ("p5.48xlarge", "us-east-1a", "cr-0b10c4000000000aa") in store.unavailable_offerings()  # the block
    stored = store.get_claim(claim.id)
    assert stored is not None and stored.capacity_type == "on-demand"


def test_a_gang_over_two_reservations_records_where_ec2_says_each_node_runs(
        ec2: tuple[Any, Stubber], store: DynamoStateStore, config: Config) -> None:
    """A gang planned on an On-Demand Capacity Reservation and a Capacity Block of one type and zone: CreateFleet's
    answer does not say which instance went where, DescribeInstances does (`CapacityReservationId`), so each node
    records the reservation it runs in, not the one its claim was planned on."""
    client, stubber = ec2
    odcr, block = "cr-0123456789abcdef0", "cr-0b10c4000000000aa"
    data = config.model_dump(by_alias=True)
    pool = next(p for p in data["nodePools"] if p["name"] == "gpu-reserved")
    pool["capacityReservations"] = [{"id": odcr}, {"id": block, "type": "capacity-block"}]
    both = type(config).model_validate(data)
    service = FleetService(both, store, Ec2Compute(client, "ml-prod"), clock=SystemClock(),
                           launch_template_id=TEMPLATE, sleep=lambda _: None)
    claims = [new_claim(store, f"stub-res{n}", pool="gpu-reserved", capacity_type="reserved", gang="train-r",
                        instance_types=("p5.48xlarge",), zones=("us-east-1a",), reservation_id=reservation)
              for n, reservation in ((1, odcr), (2, block))]
    request, params = expected(both, claims, 0, "reserved", [("p5.48xlarge", "us-east-1a")])
    assert params["ReservedCapacityOptions"]["ReservationTypes"] == ["on-demand-capacity-reservation",
                                                                     "capacity-block"]
    answer = launched(request, "i-0eee000000000001", "p5.48xlarge", "us-east-1a", "capacity-block")
    answer["Instances"].append({**answer["Instances"][0], "Lifecycle": "on-demand",
                                "InstanceIds": ["i-0eee000000000002"]})
    stubber.add_response("create_fleet", answer, params)
    stubber.add_response("describe_instances", {"Reservations": [{"Instances": [
        {"InstanceId": "i-0eee000000000001", "Placement": {"AvailabilityZone": "us-east-1a"},
         "CapacityReservationId": block},
        {"InstanceId": "i-0eee000000000002", "Placement": {"AvailabilityZone": "us-east-1a"},
         "CapacityReservationId": odcr}]}]},
        {"Filters": [{"Name": "instance-id", "Values": ["i-0eee000000000001", "i-0eee000000000002"]}]})
    stubber.add_response("create_tags", {}, _claim_tags("i-0eee000000000001", "stub-res1"))
    stubber.add_response("create_tags", {}, _claim_tags("i-0eee000000000002", "stub-res2"))
    launch(service, *[c.id for c in claims], gang="train-r")
    recorded = {c.id: store.get_claim(c.id) for c in claims}
    assert {cid: (c.instance_id, c.reservation_id) for cid, c in recorded.items() if c is not None} == {
        "stub-res1": ("i-0eee000000000001", block), "stub-res2": ("i-0eee000000000002", odcr)}


def test_an_unfulfillable_gang_launches_nothing_and_releases_every_pod(
        ec2: tuple[Any, Stubber], service: FleetService, store: DynamoStateStore, config: Config) -> None:
    _, stubber = ec2
    claims = [new_claim(store, f"stub-gang{i}", pool="gpu-reserved", capacity_type="on-demand", gang="train-9",
                        instance_types=("p4d.24xlarge",), zones=("us-east-1b",)) for i in range(2)]
    request, params = expected(config, claims, 0, "on-demand", [("p4d.24xlarge", "us-east-1b")])
    assert params["OnDemandOptions"] == {"AllocationStrategy": "lowest-price", "MinTargetCapacity": 2,
                                         "SingleAvailabilityZone": True}
    stubber.add_response("create_fleet", no_capacity(request, "UnfulfillableCapacity"), params)
    outcome = launch(service, *[c.id for c in claims], gang="train-9")
    assert {f.claim_id for f in outcome.failed} == {c.id for c in claims}
    assert store.assignments([c.pods[0] for c in claims]) == {}


def terminating(*instance_ids: str) -> dict[str, Any]:
    return {"TerminatingInstances": [{"InstanceId": i, "CurrentState": {"Name": "shutting-down", "Code": 32},
                                      "PreviousState": {"Name": "running", "Code": 16}} for i in instance_ids]}


def test_terminate_asks_ec2_directly_without_describing_first(ec2: tuple[Any, Stubber]) -> None:
    """A just-launched instance may not show in DescribeInstances yet (eventual consistency): skipping what it does
    not show leaked instances. IAM's ownership condition decides what may be terminated."""
    client, stubber = ec2
    stubber.add_response("terminate_instances", terminating("i-0eee000000000001", "i-0eee000000000002"),
                         {"InstanceIds": ["i-0eee000000000001", "i-0eee000000000002"]})
    assert Ec2Compute(client, "ml-prod").terminate(["i-0eee000000000001", "i-0eee000000000002"]) == [
        "i-0eee000000000001", "i-0eee000000000002"]


def test_one_unknown_id_fails_the_whole_call_so_each_id_is_asked_alone(ec2: tuple[Any, Stubber]) -> None:
    """EC2 refuses a multi-id TerminateInstances as a whole when one id is not known (yet): nothing was
    terminated. Each id alone then, the unknown one again with backoff; only what EC2 confirmed is reported."""
    client, stubber = ec2
    sleeps: list[float] = []
    compute = Ec2Compute(client, "ml-prod", sleep=sleeps.append, rng=random.Random(5))
    ids = ["i-0eee000000000003", "i-0eee000000000004", "i-0eee000000000005"]
    not_found = "The instance ID 'i-0eee000000000004' does not exist"
    stubber.add_client_error("terminate_instances", service_error_code="InvalidInstanceID.NotFound",
                             service_message=not_found, expected_params={"InstanceIds": ids})
    stubber.add_response("terminate_instances", terminating(ids[0]), {"InstanceIds": [ids[0]]})
    stubber.add_client_error("terminate_instances", service_error_code="InvalidInstanceID.NotFound",
                             service_message=not_found, expected_params={"InstanceIds": [ids[1]]})
    stubber.add_response("terminate_instances", terminating(ids[1]), {"InstanceIds": [ids[1]]})  # now known
    stubber.add_client_error("terminate_instances", service_error_code="UnauthorizedOperation",
                             service_message="You are not authorized to perform this operation.",
                             expected_params={"InstanceIds": [ids[2]]})  # someone else's: IAM refuses it
    assert compute.terminate(ids) == ids[:2]
    assert len(sleeps) == 1


def test_an_id_ec2_never_learns_of_is_not_reported_terminated(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    compute = Ec2Compute(client, "ml-prod", sleep=lambda _: None)
    for _ in range(5):
        stubber.add_client_error("terminate_instances", service_error_code="InvalidInstanceID.NotFound",
                                 expected_params={"InstanceIds": ["i-0eee000000000006"]})
    assert compute.terminate(["i-0eee000000000006"]) == []


def test_an_instance_known_to_be_long_gone_is_asked_about_once(ec2: tuple[Any, Stubber]) -> None:
    """EC2 forgets a terminated instance about an hour after ("Terminated instances remain visible after termination
    (for approximately one hour)", TerminateInstances): for an instance launched long ago, not known is gone, and
    waiting out eventual consistency for it only costs the caller seconds (the garbage collector's tick, a drain)."""
    client, stubber = ec2
    sleeps: list[float] = []
    compute = Ec2Compute(client, "ml-prod", sleep=sleeps.append)
    stubber.add_client_error("terminate_instances", service_error_code="InvalidInstanceID.NotFound",
                             expected_params={"InstanceIds": ["i-0eee000000000008"]})
    assert compute.terminate(["i-0eee000000000008"], unknown_is_gone=True) == []
    stubber.assert_no_pending_responses()
    assert sleeps == []


class _LowestDraws(random.Random):
    """Every jitter draw at its lowest: the unluckiest run of a randomised backoff."""

    def random(self) -> float:
        return 0.0


def test_an_id_not_yet_known_is_waited_for_at_least_seconds_whatever_the_jitter(ec2: tuple[Any, Stubber]) -> None:
    """EC2's eventual consistency lasts seconds after RunInstances/CreateFleet ("Eventual consistency in the Amazon
    EC2 API": retry with exponential backoff). Full jitter may draw ~0 every time, and five asks within
    milliseconds gave up on an instance that appeared a second later (CI: the strict layer's 1.5 s lag). The asks
    about an unknown id must together wait for seconds, whatever the draws."""
    client, stubber = ec2
    sleeps: list[float] = []
    compute = Ec2Compute(client, "ml-prod", sleep=sleeps.append, rng=_LowestDraws())
    for _ in range(4):
        stubber.add_client_error("terminate_instances", service_error_code="InvalidInstanceID.NotFound",
                                 expected_params={"InstanceIds": ["i-0eee000000000007"]})
    stubber.add_response("terminate_instances", terminating("i-0eee000000000007"),
                         {"InstanceIds": ["i-0eee000000000007"]})
    assert compute.terminate(["i-0eee000000000007"]) == ["i-0eee000000000007"]
    assert sum(sleeps) >= 3.0, sleeps


def test_create_fleet_asks_for_the_ownership_tag_on_everything_it_creates(config: Config) -> None:
    claim = NodeClaim(cluster="ml-prod", id="c-1", pool="gpu-burst", capacity_type="spot", zones=("us-east-1a",),
                      instance_types=("g6.xlarge",), price_per_hour=0.4, created_at=SystemClock().now())
    _, params = expected(config, [claim], 0, "spot", [("g6.xlarge", "us-east-1a")])
    for spec in params["TagSpecifications"]:
        assert {"Key": L.TAG_CLUSTER, "Value": "ml-prod"} in spec["Tags"]


def _two_claims(config: Config) -> tuple[FleetRequest, dict[str, Any], dict[str, Any]]:
    """A request for two claims and EC2's answer: both launched, neither tagged with its claim yet."""
    claims = [NodeClaim(cluster="ml-prod", id=f"tag-{n}", pool="gpu-burst", capacity_type="spot",
                        zones=("us-east-1a",), instance_types=("g6.xlarge",), price_per_hour=0.4,
                        created_at=SystemClock().now()) for n in (1, 2)]
    request, params = expected(config, claims, 0, "spot", [("g6.xlarge", "us-east-1a")])
    answer = launched(request, "i-0ddd000000000001", "g6.xlarge", "us-east-1a", "spot")
    answer["Instances"][0]["InstanceIds"].append("i-0ddd000000000002")
    return request, params, answer


def _claim_tags(instance_id: str, claim_id: str) -> dict[str, Any]:
    return {"Resources": [instance_id], "Tags": [{"Key": L.TAG_CLAIM, "Value": claim_id},
                                                 {"Key": "Name", "Value": f"ml-prod/{claim_id}"}]}


def test_claim_tags_on_instances_ec2_does_not_know_yet_are_asked_again_then_given_up(
        ec2: tuple[Any, Stubber], config: Config, caplog: pytest.LogCaptureFixture) -> None:
    """CreateTags right after CreateFleet may meet an instance EC2 does not know yet ("Eventual consistency in the
    Amazon EC2 API": InvalidInstanceID.NotFound): asked again with backoff. One that never takes is logged, not
    raised: the launch worked, the claims are recorded from this answer, and until then each instance's launch tag
    (`gpu-autoscaler/launch`, set at creation) keeps the garbage collector off it."""
    client, stubber = ec2
    sleeps: list[float] = []
    compute = Ec2Compute(client, "ml-prod", sleep=sleeps.append, rng=random.Random(2))
    request, params, answer = _two_claims(config)
    stubber.add_response("create_fleet", answer, params)
    first, second = _claim_tags("i-0ddd000000000001", "tag-1"), _claim_tags("i-0ddd000000000002", "tag-2")
    stubber.add_client_error("create_tags", service_error_code="InvalidInstanceID.NotFound", expected_params=first)
    stubber.add_response("create_tags", {}, first)
    for _ in range(NOT_FOUND_RETRIES + 1):
        stubber.add_client_error("create_tags", service_error_code="InvalidInstanceID.NotFound",
                                 expected_params=second)
    result = compute.create_fleet(request)
    assert [(i.instance_id, i.claim_id) for i in result.instances] == [("i-0ddd000000000001", "tag-1"),
                                                                      ("i-0ddd000000000002", "tag-2")]
    assert len(sleeps) == 1 + NOT_FOUND_RETRIES and sum(sleeps[1:]) >= 3.0
    assert "i-0ddd000000000002" in caplog.text and "tag-2" in caplog.text


def test_claim_tags_throttled_fail_the_call_so_the_redelivery_tags_them(
        ec2: tuple[Any, Stubber], config: Config) -> None:
    """Only an instance EC2 does not know yet is waited for: another refusal comes back as before, and the message's
    redelivery asks the same attempt again (same ClientToken: EC2 hands back the same instances) and tags them."""
    client, stubber = ec2
    request, params, answer = _two_claims(config)
    stubber.add_response("create_fleet", answer, params)
    stubber.add_client_error("create_tags", service_error_code="RequestLimitExceeded", http_status_code=503,
                             expected_params=_claim_tags("i-0ddd000000000001", "tag-1"))
    with pytest.raises(ClientError, match="RequestLimitExceeded"):
        Ec2Compute(client, "ml-prod", sleep=lambda _: None).create_fleet(request)


class OlderBotocore:
    """An EC2 client whose botocore predates a member the request uses: it refuses the call before sending it."""

    def __init__(self) -> None:
        self.calls = 0

    def create_fleet(self, **_: Any) -> dict[str, Any]:
        from botocore.exceptions import ParamValidationError

        self.calls += 1
        raise ParamValidationError(report='Unknown parameter in LaunchTemplateConfigs[0].LaunchTemplateSpecification: '
                                          '"LaunchTemplateSpecificationUserData", must be one of: LaunchTemplateId, '
                                          'LaunchTemplateName, Version')


def test_a_parameter_the_sdk_does_not_know_ends_the_claim_as_a_configuration_error(
        store: DynamoStateStore, config: Config) -> None:
    client = OlderBotocore()
    service = FleetService(config, store, Ec2Compute(client, config.cluster_name), clock=SystemClock(),
                           launch_template_id=TEMPLATE, sleep=lambda _: None)
    claim = new_claim(store, "stub-old-sdk", zones=("us-east-1b",), instance_types=("g6.xlarge",))
    outcome = launch(service, claim.id)  # no exception: the message is not retried, the claim ends
    assert client.calls == 1  # not retried, and no other capacity type tried with the same SDK
    assert outcome.failed[0].code == "ParamValidationError"
    stored = store.get_claim(claim.id)
    assert stored is not None and stored.state is ClaimState.TERMINATED
    assert "LaunchTemplateSpecificationUserData" in stored.reason and "botocore" in stored.reason
    assert store.assignments(list(claim.pods)) == {}


def test_a_fresh_account_without_the_spot_role_falls_back_to_on_demand(
        ec2: tuple[Any, Stubber], service: FleetService, store: DynamoStateStore, config: Config,
        caplog: pytest.LogCaptureFixture) -> None:
    """EC2 refuses the first Spot launch of an account whose AWSServiceRoleForEC2Spot does not exist and cannot be
    created by the caller: a configuration error, logged as one; the pool allows On-Demand, so the claim goes on."""
    _, stubber = ec2
    claim = new_claim(store, "stub-no-spot-role", zones=("us-east-1c",), instance_types=("g6.xlarge",))
    _, spot_params = expected(config, [claim], 0, "spot", [("g6.xlarge", "us-east-1c")])
    on_demand, od_params = expected(config, [claim], 1, "on-demand", [("g6.xlarge", "us-east-1c")])
    stubber.add_client_error(
        "create_fleet", service_error_code="AuthFailure.ServiceLinkedRoleCreationNotPermitted",
        service_message="The provided credentials do not have permission to create the service-linked role for "
                        "EC2 Spot Instances.", http_status_code=400, expected_params=spot_params)
    stubber.add_response("create_fleet", launched(on_demand, "i-0fff000000000001", "g6.xlarge", "us-east-1c",
                                                  "on-demand"), od_params)
    try:
        launch(service, claim.id)
        stored = store.get_claim(claim.id)
        assert stored is not None and stored.state is ClaimState.LAUNCHED and stored.capacity_type == "on-demand"
        assert (ANY, ANY, "spot") in store.unavailable_offerings()  # every Spot offering, not only those asked
        assert "iam:CreateServiceLinkedRole" in caplog.text
    finally:  # the package's other tests share this table: Spot is theirs again (a mark expiring now)
        store.mark_unavailable((ANY, ANY, "spot"), timedelta(0), "test over")

"""Reading CreateFleet answers (error classes, all or nothing) and deciding the next attempt."""

from __future__ import annotations

import random

import pytest

from gpu_autoscaler.domain.catalog import ANY
from gpu_autoscaler.domain.fleet import (
    MAX_ATTEMPTS,
    Attempt,
    assign_claims,
    backoff_delay,
    build_request,
    describe_failure,
    first_attempt,
    launched_capacity_type,
    next_attempt,
    read_result,
)
from gpu_autoscaler.models.fleet import ErrorKind, FleetError, FleetResult, LaunchedInstance, classify_error
from tests.unit.fleet.builders import make_claim, make_config, make_context, make_gang

CONFIG = make_config()
CONTEXT = make_context(CONFIG)
BURST = CONFIG.pool("gpu-burst")


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "UnfulfillableCapacity",
                                  "MaxSpotInstanceCountExceeded", "VcpuLimitExceeded", "ReservationCapacityExceeded",
                                  "InsufficientFreeAddressesInSubnet", "Unsupported"])
def test_capacity_errors_make_the_offering_unavailable(code: str) -> None:
    assert classify_error(code) is ErrorKind.UNAVAILABLE


@pytest.mark.parametrize(("code", "kind"), [("RequestLimitExceeded", ErrorKind.THROTTLED),
                                            ("InternalError", ErrorKind.THROTTLED),
                                            ("Unavailable", ErrorKind.THROTTLED),
                                            ("IdempotentParameterMismatch", ErrorKind.CONFLICT),
                                            ("InvalidParameterValue", ErrorKind.FATAL),
                                            ("UnauthorizedOperation", ErrorKind.FATAL),
                                            ("InvalidLaunchTemplateId.NotFound", ErrorKind.FATAL)])
def test_other_errors(code: str, kind: ErrorKind) -> None:
    assert classify_error(code) is kind


def spot_request(claims=None):
    claims = claims or [make_claim()]
    attempt = first_attempt(claims, BURST, set(), CONTEXT)
    assert attempt is not None
    return build_request(claims, BURST, attempt, CONTEXT), attempt


def instance(instance_id: str, claim_id: str | None = None, instance_type: str = "g6.xlarge",
             zone: str = "us-east-1a") -> LaunchedInstance:
    return LaunchedInstance(instance_id=instance_id, instance_type=instance_type, zone=zone, capacity_type="spot",
                            claim_id=claim_id)


def test_per_override_capacity_errors_are_marked_with_their_code() -> None:
    request, _ = spot_request()
    result = FleetResult(errors=(
        FleetError(code="InsufficientInstanceCapacity", instance_type="g6.xlarge", zone="us-east-1a",
                   capacity_type="spot"),
        FleetError(code="MaxSpotInstanceCountExceeded", instance_type="g6.xlarge", zone="us-east-1b",
                   capacity_type="spot"),
    ))
    reading = read_result(request, result)
    assert dict(reading.unavailable) == {("g6.xlarge", "us-east-1a", "spot"): "InsufficientInstanceCapacity",
                                         ("g6.xlarge", "us-east-1b", "spot"): "MaxSpotInstanceCountExceeded"}
    assert not reading.launched and reading.fatal is None and not reading.throttled


def test_a_request_level_capacity_error_marks_every_offering_asked() -> None:
    request, _ = spot_request()
    reading = read_result(request, FleetResult(errors=(FleetError(code="VcpuLimitExceeded", capacity_type="spot"),)))
    assert {o for o, _ in reading.unavailable} == set(request.offerings)


def test_a_missing_spot_service_linked_role_marks_the_whole_spot_capacity_type() -> None:
    request, _ = spot_request()
    code = "AuthFailure.ServiceLinkedRoleCreationNotPermitted"
    per_override = FleetResult(errors=(FleetError(code=code, instance_type="g6.xlarge", zone="us-east-1a",
                                                  capacity_type="spot"),))
    whole_request = FleetResult(errors=(FleetError(code=code, capacity_type="spot"),))
    for result in (per_override, whole_request):
        assert dict(read_result(request, result).unavailable) == {(ANY, ANY, "spot"): code}


def test_a_subnet_out_of_addresses_marks_every_offering_of_its_zone() -> None:
    request, _ = spot_request()
    code = "InsufficientFreeAddressesInSubnet"
    result = FleetResult(errors=(FleetError(code=code, instance_type="g6.xlarge", zone="us-east-1a",
                                            capacity_type="spot"),))
    assert dict(read_result(request, result).unavailable) == {
        (ANY, "us-east-1a", capacity_type): code for capacity_type in ("reserved", "spot", "on-demand")}
    # Without a zone named (the whole request refused), what was asked, as for any capacity error.
    whole = read_result(request, FleetResult(errors=(FleetError(code=code, capacity_type="spot"),)))
    assert {o for o, _ in whole.unavailable} == set(request.offerings)


def test_a_type_ec2_does_not_offer_in_a_zone_marks_that_offering_not_a_refusal() -> None:
    """EC2 refuses an override of a type the zone does not offer (as Spot) with `InvalidFleetConfiguration` (aws/
    karpenter-provider-aws#2243, #6483): an offering missing there, like `Unsupported`, not an operator's problem."""
    request, _ = spot_request()
    message = "Your requested instance type (g6.xlarge) is not supported in your requested Availability Zone " \
              "(us-east-1b). Please retry your request by not specifying an Availability Zone or choosing us-east-1a."
    error = FleetError(code="InvalidFleetConfiguration", instance_type="g6.xlarge", zone="us-east-1b",
                       capacity_type="spot", message=message)
    reading = read_result(request, FleetResult(errors=(error,)))
    assert not error.refusal
    assert dict(reading.unavailable) == {("g6.xlarge", "us-east-1b", "spot"): "InvalidFleetConfiguration"}
    assert not reading.dropped and reading.fatal is None
    # Any other invalid fleet configuration is still the operator's to fix.
    other = FleetError(code="InvalidFleetConfiguration", instance_type="g6.xlarge", zone="us-east-1b",
                       capacity_type="spot", message="The fleet configuration is not valid.")
    assert other.refusal


def test_fatal_throttled_and_conflict_answers() -> None:
    request, _ = spot_request()
    fatal = read_result(request, FleetResult(errors=(FleetError(code="InvalidParameterValue", message="bad"),)))
    assert fatal.fatal is not None and fatal.fatal.code == "InvalidParameterValue" and not fatal.unavailable
    throttled = read_result(request, FleetResult(errors=(FleetError(code="RequestLimitExceeded"),)))
    assert throttled.throttled and throttled.repeat
    conflict = read_result(request, FleetResult(errors=(FleetError(code="IdempotentParameterMismatch"),)))
    assert conflict.conflict and conflict.repeat


def test_instances_go_to_claims_in_order_and_extras_are_strays() -> None:
    claims = [make_claim(id="a"), make_claim(id="b")]
    request, _ = spot_request(claims)
    reading = read_result(request, FleetResult(instances=(instance("i-1"), instance("i-2"), instance("i-3"))))
    assert [(i.instance_id, i.claim_id) for i in reading.launched] == [("i-1", "a"), ("i-2", "b")]
    assert reading.strays == ("i-3",)


def test_assign_claims_keeps_what_the_adapter_assigned() -> None:
    assigned = assign_claims(["a", "b"], [instance("i-1", "b"), instance("i-2")])
    assert [(i.instance_id, i.claim_id) for i in assigned] == [("i-1", "b"), ("i-2", "a")]


def test_a_gang_that_comes_back_short_is_terminated_whole_and_its_pools_marked() -> None:
    gang = make_gang(3)
    pool = CONFIG.pool("gpu-reserved")
    attempt = first_attempt(gang, pool, set(), CONTEXT)
    assert attempt is not None
    request = build_request(gang, pool, attempt, CONTEXT, gang="training/train-42")
    short = FleetResult(instances=(instance("i-1", instance_type="p5.48xlarge"),
                                   instance("i-2", instance_type="p5.48xlarge")))
    reading = read_result(request, short)
    assert not reading.launched
    assert set(reading.strays) == {"i-1", "i-2"}
    assert dict(reading.unavailable) == {("p5.48xlarge", "us-east-1a", "on-demand"): "UnfulfillableCapacity"}


def test_a_launched_instance_records_the_reservation_it_runs_in_not_the_one_planned() -> None:
    """A reserved instance runs in the request's reservation of its type and zone, when only one is named there;
    among several, only EC2 knows (`CapacityReservationId`, which the adapter reads); an instance that is not
    reserved runs in none, whatever its claim was planned on."""
    pool = CONFIG.pool("gpu-reserved")
    odcr, block = "cr-0123456789abcdef0", "cr-0b10c4000000000aa"
    one = make_claim(id="a", pool="gpu-reserved", capacity_type="reserved", instance_types=("p5.48xlarge",),
                     zones=("us-east-1a",), reservation_id=odcr)
    attempt = Attempt(0, "reserved", (("p5.48xlarge", "us-east-1a"),))
    request = build_request([one], pool, attempt, CONTEXT)
    reserved = LaunchedInstance(instance_id="i-1", instance_type="p5.48xlarge", zone="us-east-1a",
                                capacity_type="reserved", lifecycle="on-demand")
    [launched] = read_result(request, FleetResult(instances=(reserved,))).launched
    assert launched.reservation_id == odcr
    other = make_claim(id="b", pool="gpu-reserved", capacity_type="reserved", instance_types=("p5.48xlarge",),
                       zones=("us-east-1a",), reservation_id=block)
    both = build_request([one, other], pool, attempt, CONTEXT, gang="g")
    unknown, told = read_result(both, FleetResult(instances=(
        reserved, reserved.model_copy(update={"instance_id": "i-2", "reservation_id": block})))).launched
    assert (unknown.reservation_id, told.reservation_id) == (None, block)
    fallback = build_request([one], pool, Attempt(1, "on-demand", attempt.offerings), CONTEXT)
    on_demand = reserved.model_copy(update={"capacity_type": "on-demand"})
    [launched] = read_result(fallback, FleetResult(instances=(on_demand,))).launched
    assert launched.reservation_id is None


def test_reserved_instances_are_reserved_whatever_ec2_calls_their_lifecycle() -> None:
    assert launched_capacity_type("reserved", "on-demand") == "reserved"
    assert launched_capacity_type("reserved", "capacity-block") == "reserved"
    assert launched_capacity_type("reserved", "on-demand", fallback_on_demand=True) == "on-demand"
    assert launched_capacity_type("spot", "spot") == "spot"
    assert launched_capacity_type("on-demand", "on-demand") == "on-demand"


def test_retry_with_what_is_left_then_on_demand_then_give_up() -> None:
    claim = make_claim()
    first = first_attempt([claim], BURST, set(), CONTEXT)
    assert first == Attempt(0, "spot", (("g6.xlarge", "us-east-1a"), ("g6.xlarge", "us-east-1b"),
                                        ("g5.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1b")))
    failed = {("g6.xlarge", "us-east-1a", "spot"), ("g6.xlarge", "us-east-1b", "spot")}
    second = next_attempt([claim], BURST, first, failed, CONTEXT)
    assert second == Attempt(1, "spot", (("g5.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1b")))
    failed |= {("g5.xlarge", "us-east-1a", "spot"), ("g5.xlarge", "us-east-1b", "spot")}
    third = next_attempt([claim], BURST, second, failed, CONTEXT)
    assert third is not None and third.number == 2 and third.capacity_type == "on-demand"
    assert third.offerings == first.offerings
    failed |= {(t, z, "on-demand") for t, z in third.offerings}
    assert next_attempt([claim], BURST, third, failed, CONTEXT) is None


def test_an_attempt_that_taught_nothing_is_not_asked_again() -> None:
    claim = make_claim()
    first = first_attempt([claim], BURST, set(), CONTEXT)
    assert first is not None
    second = next_attempt([claim], BURST, first, set(), CONTEXT)
    assert second is not None and second.capacity_type == "on-demand"
    repeat = next_attempt([claim], BURST, first, set(), CONTEXT, repeat=True)
    assert repeat == Attempt(1, "spot", first.offerings)


def test_no_on_demand_fallback_where_the_pool_does_not_allow_it() -> None:
    config = make_config(pool_gpu_burst={"capacityTypes": ["spot"]})
    pool = config.pool("gpu-burst")
    claim = make_claim()
    context = make_context(config)
    first = first_attempt([claim], pool, set(), context)
    assert first is not None
    blocked = {(t, z, "spot") for t, z in first.offerings}
    assert next_attempt([claim], pool, first, blocked, context) is None
    assert first_attempt([claim], pool, blocked, context) is None


def test_reserved_falls_back_to_on_demand() -> None:
    pool = CONFIG.pool("gpu-reserved")
    claim = make_claim(pool="gpu-reserved", capacity_type="reserved", instance_types=("p5.48xlarge",),
                       zones=("us-east-1a",), reservation_id="cr-0123456789abcdef0")
    first = first_attempt([claim], pool, set(), CONTEXT)
    assert first is not None and first.capacity_type == "reserved"
    second = next_attempt([claim], pool, first, {("p5.48xlarge", "us-east-1a", "reserved")}, CONTEXT)
    assert second == Attempt(1, "on-demand", (("p5.48xlarge", "us-east-1a"),))


def test_a_reserved_claim_goes_on_while_its_own_reservation_is_not_marked() -> None:
    """Records name reservations: another reservation's of the same type and zone leaves this claim's on offer; an
    older record for every reservation there (type, zone, `reserved`) does not."""
    pool = CONFIG.pool("gpu-reserved")
    claim = make_claim(pool="gpu-reserved", capacity_type="reserved", instance_types=("p5.48xlarge",),
                       zones=("us-east-1a",), reservation_id="cr-0123456789abcdef0")
    other = first_attempt([claim], pool, {("p5.48xlarge", "us-east-1a", "cr-0b10c4000000000aa")}, CONTEXT)
    assert other is not None and other.capacity_type == "reserved"
    own = first_attempt([claim], pool, {("p5.48xlarge", "us-east-1a", "cr-0123456789abcdef0")}, CONTEXT)
    assert own is not None and own.capacity_type == "on-demand"
    older = first_attempt([claim], pool, {("p5.48xlarge", "us-east-1a", "reserved")}, CONTEXT)
    assert older is not None and older.capacity_type == "on-demand"


def test_attempts_are_bounded() -> None:
    claim = make_claim()
    attempt = first_attempt([claim], BURST, set(), CONTEXT)
    seen = 0
    while attempt is not None:
        seen += 1
        attempt = next_attempt([claim], BURST, attempt, set(), CONTEXT, repeat=True)
    assert seen == MAX_ATTEMPTS


def test_backoff_is_exponential_with_full_jitter_and_capped() -> None:
    rng = random.Random(7)
    for retry in range(8):
        ceiling = min(8.0, 0.5 * 2**retry)
        delays = [backoff_delay(retry, rng) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > 0.8 * ceiling  # jitter spans the range, not a constant
        assert len(set(delays)) > 150


def test_failure_is_described_in_words_and_one_code() -> None:
    errors = [FleetError(code="InsufficientInstanceCapacity", instance_type="g6.xlarge", zone="us-east-1a",
                         capacity_type="spot"),
              FleetError(code="VcpuLimitExceeded", capacity_type="on-demand")]
    reason, code = describe_failure(errors, "")
    assert reason == ("could not launch: InsufficientInstanceCapacity (g6.xlarge us-east-1a spot); "
                      "VcpuLimitExceeded (on-demand)")
    assert code == "VcpuLimitExceeded"

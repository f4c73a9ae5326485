"""The fleet service on the in-memory store and a scripted Compute: lifecycle, retries, idempotency, termination."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.catalog import is_excluded
from gpu_autoscaler.domain.consolidation_models import REPLACES_ATTRIBUTE
from gpu_autoscaler.domain.drift import IMAGE_ATTRIBUTE
from gpu_autoscaler.domain.fleet import ATTEMPT_ATTRIBUTE, CAPACITY_TYPE_PINNED_ATTRIBUTE, client_token
from gpu_autoscaler.errors import RequestThrottled
from gpu_autoscaler.models.catalog import Offering
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.fleet import FleetError, FleetResult
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.services.fleet import FleetService, NotConfiguredForLaunch
from tests.unit.fleet.builders import NOW, TEMPLATE, TYPES, make_claim, make_config, make_gang
from tests.unit.fleet.fakes import FakeCompute, launch_first, no_capacity

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog as DomainCatalog
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.ports import CatalogSource
    from tests.unit.fleet.fakes import Answer

TTL = timedelta(minutes=30)


class Catalog:
    """Instance types and prices, as `CatalogSource` gives them."""

    def __init__(self, offerings: list[Offering]) -> None:
        self._offerings = offerings

    def instance_types(self) -> list:
        return list(TYPES.values())

    def offerings(self) -> list[Offering]:
        return self._offerings


class Harness:
    def __init__(self, *answers: Answer, config: Config | None = None,
                 catalog: CatalogSource | DomainCatalog | None = None, template: str | None = TEMPLATE) -> None:
        self.clock = FixedClock(NOW)
        self.config = config or make_config()
        self.store = MemoryStateStore("ml-prod", self.clock)
        self.compute = FakeCompute(list(answers))
        self.sleeps: list[float] = []
        self.service = FleetService(self.config, self.store, self.compute, clock=self.clock,
                                    launch_template_id=template, catalog=catalog, sleep=self.sleeps.append,
                                    rng=random.Random(1))

    def add(self, *claims):
        for claim in claims:
            self.store.create_claim(claim)
            self.store.assign_pods(claim.id, list(claim.pods), TTL)
        return claims

    def launch(self, *claim_ids: str, gang: str | None = None):
        self.clock.advance(timedelta(seconds=42))
        return self.service.launch(LaunchRequest(cluster="ml-prod", claim_ids=list(claim_ids), gang=gang))

    def claim(self, claim_id: str):
        stored = self.store.get_claim(claim_id)
        assert stored is not None
        return stored


def test_a_pending_claim_is_launched_and_recorded() -> None:
    catalog = Catalog([Offering(instance_type="g6.xlarge", zone="us-east-1a", capacity_type="spot",
                                price_per_hour=0.3712)])
    h = Harness(catalog=catalog)
    h.add(make_claim())
    outcome = h.launch("gpu-burst-a1b2c")
    claim = h.claim("gpu-burst-a1b2c")
    assert claim.state is ClaimState.LAUNCHED
    [launched] = outcome.launched
    assert (claim.instance_id, claim.instance_type, claim.zone, claim.capacity_type) == (
        launched.instance_id, "g6.xlarge", "us-east-1a", "spot")
    assert claim.launched_price_per_hour == pytest.approx(0.3712) == launched.price_per_hour
    assert launched.seconds_to_launch == 42
    assert [t.state for t in claim.history] == [ClaimState.LAUNCHED]
    assert outcome.calls == 1 and not outcome.failed
    assert h.store.assignments(["pod-1"]) == {"pod-1": "gpu-burst-a1b2c"}


def test_each_launched_claim_records_the_image_its_instance_was_launched_from() -> None:
    """Drift compares a node's image with its pool's (Karpenter's NodeClaim `status.imageID` against the
    NodeClass's AMIs): the claim keeps the image the request named for its instance's architecture — the pool's
    own where it sets one, the global one otherwise — not whatever the configuration says when it registers."""
    pool_ami = {"family": "AL2023", "version": "v20261120", "x86_64": "ami-0aaaaaaaaaaaaaaa1",
                "arm64": "ami-0aaaaaaaaaaaaaaa2"}
    catalog = Catalog([Offering(instance_type=t, zone="us-east-1a", capacity_type="spot", price_per_hour=0.3)
                       for t in ("g6.xlarge", "g5g.xlarge")])
    h = Harness(config=make_config(pool_gpu_burst={"ami": pool_ami}), catalog=catalog)
    h.add(make_claim(), make_claim(id="gpu-burst-arm", instance_types=("g5g.xlarge",), pods=("pod-2",)))
    h.launch("gpu-burst-a1b2c", "gpu-burst-arm")
    assert h.claim("gpu-burst-a1b2c").attributes[IMAGE_ATTRIBUTE] == "ami-0aaaaaaaaaaaaaaa1"
    assert h.claim("gpu-burst-arm").attributes[IMAGE_ATTRIBUTE] == "ami-0aaaaaaaaaaaaaaa2"
    plain = Harness(catalog=catalog)
    plain.add(make_claim())
    plain.launch("gpu-burst-a1b2c")
    assert plain.claim("gpu-burst-a1b2c").attributes[IMAGE_ATTRIBUTE] == plain.config.ami.x86_64


def test_each_launched_claim_records_the_security_groups_and_subnet_its_instance_was_launched_with() -> None:
    """Drift compares them with the configuration, as Karpenter compares the instance's with its NodeClass's
    (SecurityGroupDrift, SubnetDrift): the claim keeps the configured groups the launch templates hold and its zone's
    configured subnet, which the request's override named, as they were when it launched."""
    catalog = Catalog([Offering(instance_type="g6.xlarge", zone="us-east-1a", capacity_type="spot",
                                price_per_hour=0.3)])
    config = make_config(network={"subnets": {"us-east-1a": "subnet-0aaa", "us-east-1b": "subnet-0bbb"},
                                  "securityGroups": ["sg-0002", "sg-0001"]})
    h = Harness(config=config, catalog=catalog)
    h.add(make_claim())
    h.launch("gpu-burst-a1b2c")
    claim = h.claim("gpu-burst-a1b2c")
    assert claim.zone == "us-east-1a"
    assert (claim.attributes.get("securityGroups"), claim.attributes.get("subnetId")) == (
        "sg-0001,sg-0002", "subnet-0aaa")


def test_a_redelivered_request_launches_nothing() -> None:
    h = Harness()
    h.add(make_claim())
    h.launch("gpu-burst-a1b2c")
    again = h.launch("gpu-burst-a1b2c")
    assert len(h.compute.requests) == 1
    assert again.skipped == [("gpu-burst-a1b2c", "already Launched")] and not again.launched


def test_a_claim_not_stored_is_skipped() -> None:
    h = Harness()
    outcome = h.launch("nobody")
    assert outcome.skipped == [("nobody", "not stored")] and not h.compute.requests


def test_capacity_errors_mark_offerings_and_the_claim_goes_on_with_what_is_left() -> None:
    h = Harness(no_capacity(only=2))
    h.add(make_claim())
    outcome = h.launch("gpu-burst-a1b2c")
    first, second = h.compute.requests
    assert [o.instance_type for o in first.overrides] == ["g6.xlarge", "g6.xlarge", "g5.xlarge", "g5.xlarge"]
    assert [(o.instance_type, o.zone) for o in second.overrides] == [("g5.xlarge", "us-east-1a"),
                                                                    ("g5.xlarge", "us-east-1b")]
    assert second.client_token != first.client_token and second.attempt == 1
    assert h.store.unavailable_offerings() == {("g6.xlarge", "us-east-1a", "spot"), ("g6.xlarge", "us-east-1b", "spot")}
    assert h.claim("gpu-burst-a1b2c").instance_type == "g5.xlarge"
    assert len(outcome.unavailable) == 2
    h.clock.advance(h.config.timeouts.unavailable_offering_ttl)
    assert h.store.unavailable_offerings() == set()


def test_spot_exhausted_falls_back_to_on_demand() -> None:
    h = Harness(no_capacity())
    h.add(make_claim())
    outcome = h.launch("gpu-burst-a1b2c")
    assert [r.capacity_type for r in h.compute.requests] == ["spot", "on-demand"]
    claim = h.claim("gpu-burst-a1b2c")
    assert claim.state is ClaimState.LAUNCHED and claim.capacity_type == "on-demand"
    assert outcome.launched[0].capacity_type == "on-demand"


def test_a_consolidation_replacement_without_spot_capacity_is_not_launched_on_demand() -> None:
    """Its types were kept for being cheaper than the node it replaces at the Spot price: On-Demand could cost more
    than that node. The launch fails, and the drain waiting for it leaves the node alone (Karpenter pins the
    replacement's capacity type)."""
    h = Harness(no_capacity())
    h.add(make_claim(attributes={REPLACES_ATTRIBUTE: "gpu-burst-old", CAPACITY_TYPE_PINNED_ATTRIBUTE: "true"}))
    outcome = h.launch("gpu-burst-a1b2c")
    assert [r.capacity_type for r in h.compute.requests] == ["spot"]
    assert h.claim("gpu-burst-a1b2c").state is ClaimState.TERMINATED
    assert [f.claim_id for f in outcome.failed] == ["gpu-burst-a1b2c"] and not outcome.launched


def test_a_pinned_claim_with_no_spot_offering_left_is_not_launched_on_demand_either() -> None:
    h = Harness()
    h.add(make_claim(attributes={CAPACITY_TYPE_PINNED_ATTRIBUTE: "true"}))
    for instance_type in ("g6.xlarge", "g5.xlarge"):
        for zone in ("us-east-1a", "us-east-1b"):
            h.store.mark_unavailable((instance_type, zone, "spot"), TTL, "InsufficientInstanceCapacity")
    outcome = h.launch("gpu-burst-a1b2c")
    assert h.compute.requests == [] and outcome.failed[0].code == "NoOfferings"


def test_a_drift_replacement_falls_back_to_on_demand_as_any_claim() -> None:
    """Drift replaces whatever it costs: Karpenter pins consolidation's replacements only."""
    h = Harness(no_capacity())
    h.add(make_claim(attributes={REPLACES_ATTRIBUTE: "gpu-burst-old"}))
    h.launch("gpu-burst-a1b2c")
    assert [r.capacity_type for r in h.compute.requests] == ["spot", "on-demand"]
    assert h.claim("gpu-burst-a1b2c").capacity_type == "on-demand"


def test_a_missing_spot_service_linked_role_makes_all_of_spot_unavailable_for_a_while() -> None:
    """As Karpenter marks the Spot capacity type unavailable: any other Spot type would be refused the same way,
    so no Spot offering is asked until the TTL ends (the operator may have created the role by then)."""
    h = Harness(no_capacity("AuthFailure.ServiceLinkedRoleCreationNotPermitted"))
    h.add(make_claim(instance_types=("g6.xlarge",)), make_claim(id="gpu-burst-other", instance_types=("g5.xlarge",)))
    h.launch("gpu-burst-a1b2c")
    assert [r.capacity_type for r in h.compute.requests] == ["spot", "on-demand"]
    h.launch("gpu-burst-other")  # another type, never asked as Spot: not asked now either
    assert [r.capacity_type for r in h.compute.requests] == ["spot", "on-demand", "on-demand"]
    assert h.claim("gpu-burst-other").capacity_type == "on-demand"
    h.clock.advance(h.config.timeouts.unavailable_offering_ttl)
    h.add(make_claim(id="gpu-burst-later"))
    h.launch("gpu-burst-later")
    assert h.compute.requests[-1].capacity_type == "spot"


def test_a_subnet_out_of_addresses_makes_its_whole_zone_unavailable_for_a_while() -> None:
    """One subnet per zone: no instance of any type or capacity type gets an address there until the TTL ends
    (Karpenter marks the subnet unavailable beside the offering)."""
    h = Harness(no_capacity("InsufficientFreeAddressesInSubnet", only=1))
    h.add(make_claim())
    h.launch("gpu-burst-a1b2c")
    first, second = h.compute.requests
    assert (first.overrides[0].instance_type, first.overrides[0].zone) == ("g6.xlarge", "us-east-1a")
    assert {o.zone for o in second.overrides} == {"us-east-1b"}  # g5.xlarge in us-east-1a is not asked either
    unavailable = h.store.unavailable_offerings()
    assert all(is_excluded((t, "us-east-1a", ct), unavailable)
               for t in ("g6.xlarge", "g5.xlarge") for ct in ("spot", "on-demand", "reserved"))
    assert not is_excluded(("g5.xlarge", "us-east-1b", "spot"), unavailable)
    h.clock.advance(h.config.timeouts.unavailable_offering_ttl)
    assert h.store.unavailable_offerings() == set()


def test_a_claim_that_cannot_launch_releases_its_pods() -> None:
    h = Harness(no_capacity(), no_capacity("VcpuLimitExceeded"))
    h.add(make_claim())
    outcome = h.launch("gpu-burst-a1b2c")
    claim = h.claim("gpu-burst-a1b2c")
    assert claim.state is ClaimState.TERMINATED
    assert "InsufficientInstanceCapacity" in claim.reason and "VcpuLimitExceeded" in claim.reason
    assert h.store.assignments(["pod-1"]) == {}
    [failed] = outcome.failed
    assert failed.code == "VcpuLimitExceeded" and failed.pods == ("pod-1",)


def test_each_released_pod_is_reported_with_the_reason_its_claim_could_not_launch() -> None:
    # The chaos suite's capacity storm: with the whole family out, pods went from one failed claim to the next
    # and were never reported unschedulable (the packer reports only when every offering is marked at once).
    h = Harness(no_capacity(), no_capacity())
    h.add(make_claim())
    summary = h.launch("gpu-burst-a1b2c").summary()

    [released] = summary["unschedulable"]
    assert released["pod"] == "pod-1" and released["claim"] == "gpu-burst-a1b2c"
    assert released["reason"].startswith("claim gpu-burst-a1b2c: could not launch: ")
    assert "InsufficientInstanceCapacity" in released["reason"]


def test_nothing_left_to_try_fails_without_calling_ec2() -> None:
    config = make_config(pool_gpu_burst={"capacityTypes": ["spot"]})
    h = Harness(config=config)
    h.add(make_claim())
    for t in ("g6.xlarge", "g5.xlarge"):
        for z in ("us-east-1a", "us-east-1b"):
            h.store.mark_unavailable((t, z, "spot"), timedelta(minutes=3), "InsufficientInstanceCapacity")
    outcome = h.launch("gpu-burst-a1b2c")
    assert not h.compute.requests
    assert outcome.failed[0].code == "NoOfferings"
    assert h.claim("gpu-burst-a1b2c").state is ClaimState.TERMINATED


def test_a_fatal_error_ends_the_launch_at_once() -> None:
    h = Harness(FleetResult(errors=(FleetError(code="InvalidLaunchTemplateId.NotFound", message="no such"),)))
    h.add(make_claim())
    outcome = h.launch("gpu-burst-a1b2c")
    assert len(h.compute.requests) == 1
    assert outcome.failed[0].code == "InvalidLaunchTemplateId.NotFound"
    assert "InvalidLaunchTemplateId.NotFound" in h.claim("gpu-burst-a1b2c").reason


def test_a_launch_ec2_refuses_for_a_non_capacity_reason_is_told_from_one_that_found_no_capacity() -> None:
    """A refusal no other offering or retry mends (a permission, a parameter, the launch template, the Spot
    service-linked role) needs an operator; no capacity is Spot's normal weather. Both end the claim the same way
    (no Lambda error, no dead letter), so the outcome says which it was, for the handler's `LaunchesRefused`."""
    refused = Harness(FleetResult(errors=(FleetError(code="UnauthorizedOperation", message="not authorized"),)))
    refused.add(make_claim())
    [failed] = refused.launch("gpu-burst-a1b2c").failed
    assert failed.code == "UnauthorizedOperation" and failed.refused

    # Spot refused for the account, then no On-Demand capacity: the claim ends on the last error, a capacity one,
    # yet Spot will be refused until someone lets the account create its service-linked role.
    no_spot_role = Harness(no_capacity("AuthFailure.ServiceLinkedRoleCreationNotPermitted"), no_capacity())
    no_spot_role.add(make_claim())
    [failed] = no_spot_role.launch("gpu-burst-a1b2c").failed
    assert failed.code == "InsufficientInstanceCapacity" and failed.refused

    for answers in ((no_capacity(), no_capacity()), (no_capacity(), no_capacity("VcpuLimitExceeded"))):
        short = Harness(*answers)
        short.add(make_claim())
        [failed] = short.launch("gpu-burst-a1b2c").failed
        assert not failed.refused, failed.code

    nothing_left = Harness()
    nothing_left.add(make_claim())
    for t in ("g6.xlarge", "g5.xlarge"):
        for z in ("us-east-1a", "us-east-1b"):
            for capacity_type in ("spot", "on-demand"):
                nothing_left.store.mark_unavailable((t, z, capacity_type), TTL, "InsufficientInstanceCapacity")
    [failed] = nothing_left.launch("gpu-burst-a1b2c").failed
    assert failed.code == "NoOfferings" and not failed.refused


def test_throttling_backs_off_with_jitter_then_succeeds() -> None:
    h = Harness(RequestThrottled("slow down"), RequestThrottled("slow down"))
    h.add(make_claim())
    outcome = h.launch("gpu-burst-a1b2c")
    assert h.claim("gpu-burst-a1b2c").state is ClaimState.LAUNCHED
    assert len(h.sleeps) == 2 and 0 <= h.sleeps[0] <= 0.5 and 0 <= h.sleeps[1] <= 1.0
    assert len({r.client_token for r in h.compute.requests}) == 1  # the same request, asked again
    assert outcome.throttled == 2


def test_persistent_throttling_fails_the_message_and_keeps_the_claim_pending() -> None:
    h = Harness(*[RequestThrottled("slow down")] * 4)
    h.add(make_claim())
    with pytest.raises(RequestThrottled):
        h.launch("gpu-burst-a1b2c")
    claim = h.claim("gpu-burst-a1b2c")
    assert claim.state is ClaimState.PENDING
    assert ATTEMPT_ATTRIBUTE in claim.attributes
    h.launch("gpu-burst-a1b2c")  # the redelivery asks the very same request again
    assert h.compute.requests[-1].client_token == h.compute.requests[0].client_token
    assert h.claim("gpu-burst-a1b2c").state is ClaimState.LAUNCHED


def test_a_retry_after_a_crash_asks_ec2_the_same_request_again() -> None:
    """EC2 answered, the invocation died before recording: the retry must reuse the token, not launch anew."""
    h = Harness(no_capacity(only=2))
    h.add(make_claim())
    transition = h.store.transition

    def dies_before_recording(claim, to, reason="", **changes):
        if to is ClaimState.LAUNCHED:
            raise RuntimeError("the invocation died")
        return transition(claim, to, reason, **changes)

    h.store.transition = dies_before_recording  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        h.launch("gpu-burst-a1b2c")
    asked = h.compute.requests[-1]
    assert asked.attempt == 1
    h.store.transition = transition  # type: ignore[method-assign]
    h.launch("gpu-burst-a1b2c")
    replay = h.compute.requests[-1]
    assert len(h.compute.requests) == 3
    assert replay.client_token == asked.client_token and replay.overrides == asked.overrides
    assert h.claim("gpu-burst-a1b2c").state is ClaimState.LAUNCHED


def test_an_attempt_recorded_under_another_grouping_is_not_reused() -> None:
    h = Harness()
    a, b = h.add(make_claim(id="a"), make_claim(id="b"))
    stale = '{"number":0,"capacityType":"spot","token":"' + client_token("ml-prod", ["a", "b"], 0) + \
        '","offerings":[["g6.xlarge","us-east-1a"]]}'
    h.store.update_claim(a, attributes={ATTEMPT_ATTRIBUTE: stale})
    h.store.transition(b, ClaimState.TERMINATED, "gone")
    h.launch("a", "b")
    [request] = h.compute.requests
    assert request.claim_ids == ("a",) and request.attempt == 1


def test_identical_claims_share_one_request_and_each_gets_an_instance() -> None:
    h = Harness()
    h.add(make_claim(id="a", pods=("p-a",)), make_claim(id="b", pods=("p-b",)))
    outcome = h.launch("a", "b")
    [request] = h.compute.requests
    assert request.target_capacity == 2
    assert {c.claim_id for c in outcome.launched} == {"a", "b"}
    assert h.claim("a").instance_id != h.claim("b").instance_id


def test_partial_fulfilment_the_missing_claim_goes_on_alone() -> None:
    h = Harness(lambda request: launch_first(request, count=1))
    h.add(make_claim(id="a"), make_claim(id="b"))
    h.launch("a", "b")
    first, second = h.compute.requests
    assert first.claim_ids == ("a", "b") and second.claim_ids == ("b",)
    assert h.claim("a").state is ClaimState.LAUNCHED and h.claim("b").state is ClaimState.LAUNCHED


def test_a_gang_launches_whole() -> None:
    h = Harness()
    gang = h.add(*make_gang(4))
    outcome = h.launch(*[c.id for c in gang], gang="training/train-42")
    [request] = h.compute.requests
    assert request.min_target_capacity == 4 and request.single_availability_zone
    assert len(outcome.launched) == 4
    assert len({h.claim(c.id).zone for c in gang}) == 1


def test_a_gang_that_comes_back_short_is_given_back_and_tried_elsewhere() -> None:
    h = Harness(lambda request: launch_first(request, count=2))
    gang = h.add(*make_gang(3))
    outcome = h.launch(*[c.id for c in gang], gang="training/train-42")
    assert len(outcome.strays) == 2 and set(outcome.strays) <= set(h.compute.terminated)
    assert ("p5.48xlarge", "us-east-1a", "on-demand") in h.store.unavailable_offerings()
    assert all(h.claim(c.id).state is ClaimState.LAUNCHED for c in gang)
    assert len({h.claim(c.id).instance_id for c in gang} & set(outcome.strays)) == 0


def test_a_gang_member_already_gone_leaves_the_rest_as_one_request() -> None:
    h = Harness()
    gang = h.add(*make_gang(3))
    h.store.transition(gang[1], ClaimState.TERMINATED, "superseded")
    h.launch(*[c.id for c in gang], gang="training/train-42")
    [request] = h.compute.requests  # the two left are still one all-or-nothing request
    assert request.claim_ids == (gang[0].id, gang[2].id) and request.min_target_capacity == 2


def test_a_claim_that_moved_on_during_launch_has_its_instance_terminated() -> None:
    h = Harness()
    (claim,) = h.add(make_claim())

    def launch_and_close(request):
        result = launch_first(request)
        h.store.transition(h.claim(claim.id), ClaimState.TERMINATED, "pods gone")
        return result

    h.compute.answers.append(launch_and_close)
    outcome = h.launch(claim.id)
    assert h.compute.terminated == outcome.strays and len(outcome.strays) == 1
    assert not outcome.launched


def test_pods_added_to_a_claim_while_it_launches_keep_the_launch() -> None:
    """The packer adds a pod to the Pending claim between the fleet's attempt write and EC2's answer (a new
    version, same state): the launch is recorded on the fresh copy, not taken for a stray and terminated."""
    h = Harness()
    (claim,) = h.add(make_claim())

    def launch_while_the_packer_adds_a_pod(request):
        result = launch_first(request)
        current = h.claim(claim.id)
        h.store.update_claim(current, pods=(*current.pods, "pod-late"))
        return result

    h.compute.answers.append(launch_while_the_packer_adds_a_pod)
    outcome = h.launch(claim.id)
    stored = h.claim(claim.id)
    assert stored.state is ClaimState.LAUNCHED and "pod-late" in stored.pods
    assert not h.compute.terminated and len(outcome.launched) == 1


def test_pods_added_while_the_attempt_is_recorded_do_not_skip_the_claim() -> None:
    """The packer's write lands between the fleet's read and its attempt write: the fleet reads again and goes on."""
    h = Harness()
    (claim,) = h.add(make_claim())
    write = h.store.update_claim
    raced: list[str] = []

    def packer_first(claim: NodeClaim, **changes: object) -> NodeClaim:
        if not raced:
            raced.append(claim.id)
            current = h.claim(claim.id)
            write(current, pods=(*current.pods, "pod-late"))
        return write(claim, **changes)

    h.store.update_claim = packer_first  # type: ignore[method-assign]
    outcome = h.launch(claim.id)
    assert raced and not outcome.skipped
    stored = h.claim(claim.id)
    assert stored.state is ClaimState.LAUNCHED and "pod-late" in stored.pods


def test_reserved_claims_launch_reserved_and_fall_back_to_on_demand() -> None:
    h = Harness(FleetResult())  # no instance, no error: what moto answers a reserved-capacity request
    h.add(make_claim(id="r", pool="gpu-reserved", capacity_type="reserved", instance_types=("p5.48xlarge",),
                     zones=("us-east-1a",), reservation_id="cr-0123456789abcdef0"))
    h.launch("r")
    reserved, on_demand = h.compute.requests
    assert reserved.capacity_type == "reserved" and reserved.reservation is not None
    assert on_demand.capacity_type == "on-demand" and on_demand.reservation is None
    assert h.claim("r").capacity_type == "on-demand"
    # It never ran in the reservation: the node records none, so the reservation's end is not its end.
    assert h.claim("r").reservation_id is None


def test_a_reserved_claim_records_the_reservation_its_instance_runs_in() -> None:
    h = Harness()
    h.add(reserved_claim(ODCR))
    h.launch("r")
    assert (h.claim("r").capacity_type, h.claim("r").reservation_id) == ("reserved", ODCR)


def test_a_request_for_another_cluster_is_refused() -> None:
    h = Harness()
    with pytest.raises(Exception, match="cluster 'ml-dev'"):
        h.service.launch(LaunchRequest(cluster="ml-dev", claim_ids=["x"]))


def test_without_a_launch_template_the_service_only_terminates() -> None:
    h = Harness(template=None)
    h.add(make_claim())
    with pytest.raises(NotConfiguredForLaunch):
        h.launch("gpu-burst-a1b2c")


# ---- terminate ---------------------------------------------------------------------------------------------


def test_terminate_ends_the_instance_and_the_claim_and_releases_pods() -> None:
    h = Harness()
    (claim,) = h.add(make_claim())
    h.launch(claim.id)
    launched = h.claim(claim.id)
    closed = h.service.terminate(launched, "consolidated: empty")
    assert closed.state is ClaimState.TERMINATED and closed.reason == "consolidated: empty"
    assert h.compute.terminated == [launched.instance_id]
    assert h.store.assignments(["pod-1"]) == {}
    assert [t.state for t in closed.history] == [ClaimState.LAUNCHED, ClaimState.TERMINATED]


def test_terminate_is_idempotent() -> None:
    h = Harness()
    (claim,) = h.add(make_claim())
    h.launch(claim.id)
    launched = h.claim(claim.id)
    first = h.service.terminate(launched, "drained")
    second = h.service.terminate(launched, "drained again")
    assert second == first and h.compute.terminated == [launched.instance_id]


def test_terminate_with_a_stale_copy_acts_on_the_stored_claim() -> None:
    h = Harness()
    (claim,) = h.add(make_claim())
    h.launch(claim.id)
    registered = h.store.transition(h.claim(claim.id), ClaimState.REGISTERED, "node joined", node_name="n-1")
    closed = h.service.terminate(claim, "spot interruption")  # the caller's copy is still Pending
    assert closed.state is ClaimState.TERMINATED and h.compute.terminated == [registered.instance_id]


def test_terminate_never_touches_an_instance_we_do_not_own() -> None:
    h = Harness()
    (claim,) = h.add(make_claim())
    h.launch(claim.id)
    foreign = h.store.update_claim(h.claim(claim.id), instance_id="i-0123456789abcdef0")
    closed = h.service.terminate(foreign, "reconcile")
    assert h.compute.terminated == [] and closed.state is ClaimState.TERMINATED


def test_terminate_a_pending_claim_closes_it_without_ec2() -> None:
    h = Harness()
    (claim,) = h.add(make_claim())
    closed = h.service.terminate(claim, "not needed")
    assert closed.state is ClaimState.TERMINATED and h.compute.terminated == [] and not h.compute.requests


def test_a_claim_that_moves_on_while_its_attempt_is_recorded_drops_out() -> None:
    h = Harness()
    h.add(make_claim(id="a"), make_claim(id="b"))
    update = h.store.update_claim

    def closes_b_first(claim, **changes):
        if claim.id == "b" and h.claim("b").state is ClaimState.PENDING:
            h.store.transition(h.claim("b"), ClaimState.TERMINATED, "pods covered elsewhere")
        return update(claim, **changes)

    h.store.update_claim = closes_b_first  # type: ignore[method-assign]
    outcome = h.launch("a", "b")
    [request] = h.compute.requests
    assert request.claim_ids == ("a",) and request.client_token == client_token("ml-prod", ["a"], 0)
    assert ("b", "moved on while it was being launched") in outcome.skipped
    assert h.claim("a").state is ClaimState.LAUNCHED and h.claim("b").state is ClaimState.TERMINATED


def test_prices_come_from_a_domain_catalog_too_and_the_plan_stands_in_otherwise() -> None:
    from gpu_autoscaler.domain.catalog import Catalog as DomainCatalog

    catalog = DomainCatalog(list(TYPES.values()), [
        Offering(instance_type="g6.xlarge", zone="us-east-1a", capacity_type="spot", price_per_hour=0.35)])
    h = Harness(catalog=catalog)
    h.add(make_claim(id="a"), make_claim(id="b", instance_types=("g5.xlarge",), price_per_hour=0.51))
    h.launch("a")
    h.launch("b")
    assert h.claim("a").launched_price_per_hour == pytest.approx(0.35)
    assert h.claim("b").launched_price_per_hour == pytest.approx(0.51)  # not in the catalog: the planned price


def test_an_error_on_one_instance_type_drops_that_type_and_tries_the_rest() -> None:
    """Issue 14 defect 10: `InvalidParameterValue` for g6.xlarge alone must not end the claim."""
    def bad_type(request):
        return FleetResult(errors=tuple(
            FleetError(code="InvalidParameterValue", message="g6.xlarge is not supported", instance_type="g6.xlarge",
                       zone=o.zone, capacity_type=request.capacity_type)
            for o in request.overrides if o.instance_type == "g6.xlarge"))
    h = Harness(bad_type)
    h.add(make_claim())
    outcome = h.launch("gpu-burst-a1b2c")
    claim = h.claim("gpu-burst-a1b2c")
    assert claim.state is ClaimState.LAUNCHED and claim.instance_type == "g5.xlarge"
    assert len(h.compute.requests) == 2
    assert {o.instance_type for o in h.compute.requests[1].overrides} == {"g5.xlarge"}
    assert not outcome.failed
    # Dropped for this launch only: not recorded as unavailable capacity for every other claim.
    assert not h.store.unavailable_offerings()


def test_a_fleet_quota_is_a_capacity_error_not_the_end() -> None:
    """Issue 14 defect 10: `MaxFleetCountExceeded` marks what was asked unavailable; the claim goes on."""
    h = Harness(FleetResult(errors=(FleetError(code="MaxFleetCountExceeded", message="too many fleets"),)))
    h.add(make_claim(capacity_type="spot"))
    outcome = h.launch("gpu-burst-a1b2c")
    assert h.claim("gpu-burst-a1b2c").state is ClaimState.LAUNCHED
    assert h.compute.requests[1].capacity_type == "on-demand"  # the pool falls back
    assert outcome.unavailable


# ---- reserved capacity: what EC2 says of each reservation -----------------------------------------------------

BLOCK = "cr-0b10c4000000000aa"
ODCR = "cr-0123456789abcdef0"


def reserved_offering(reservation: str, kind: str, *, zone: str = "us-east-1a",
                      instance_type: str = "p5.48xlarge") -> Offering:
    """A reservation as the catalog offers it: DescribeCapacityReservations' `ReservationType` on the offering."""
    return Offering(instance_type=instance_type, zone=zone, capacity_type="reserved", price_per_hour=5.5e-6,
                    reservation_id=reservation, reservation_type=kind, available_count=2)


def reserved_claim(reservation: str, claim_id: str = "r", **changes: object) -> NodeClaim:
    fields: dict[str, object] = {"pool": "gpu-reserved", "capacity_type": "reserved",
                                 "instance_types": ("p5.48xlarge",), "zones": ("us-east-1a",), "pods": (claim_id,)}
    fields.update(changes)
    return make_claim(id=claim_id, reservation_id=reservation, **fields)


def test_a_reserved_launch_asks_for_the_reservation_type_ec2_says_not_the_configured_one() -> None:
    """A Capacity Block configured without `type: capacity-block`: DescribeCapacityReservations says
    `capacity-block` (the catalog's offering carries it). EC2 "attempts to launch instances into each Capacity
    Reservation type in the order that you specify" (ReservedCapacityOptionsRequest `ReservationTypes`): asked as an
    On-Demand Capacity Reservation, the block would never be used. Likewise an ODCR configured as a block."""
    config = make_config(pool_gpu_reserved={"capacityReservations": [{"id": BLOCK}, {"id": ODCR,
                                                                                     "type": "capacity-block"}]})
    catalog = Catalog([reserved_offering(BLOCK, "capacity-block"), reserved_offering(ODCR, "default")])
    h = Harness(config=config, catalog=catalog)
    h.add(reserved_claim(BLOCK), reserved_claim(ODCR, "o"))
    h.launch("r")
    h.launch("o")
    block, odcr = h.compute.requests
    assert block.reservation is not None and block.reservation.reservation_types == ("capacity-block",)
    assert odcr.reservation is not None and odcr.reservation.reservation_types == ("on-demand-capacity-reservation",)


def test_a_reservation_the_catalog_does_not_hold_is_asked_as_configured() -> None:
    """No catalog (or the reservation no longer among its offerings): the configuration's `type` is all there is."""
    config = make_config(pool_gpu_reserved={"capacityReservations": [{"id": BLOCK, "type": "capacity-block"}]})
    h = Harness(config=config, catalog=Catalog([]))
    h.add(reserved_claim(BLOCK))
    h.launch("r")
    [request, *_] = h.compute.requests
    assert request.reservation is not None and request.reservation.reservation_types == ("capacity-block",)


def test_a_full_reservation_marks_itself_and_leaves_another_of_its_type_and_zone_to_launch() -> None:
    """ReservationCapacityExceeded on an On-Demand Capacity Reservation: the record names that reservation, so a
    Capacity Block of the same type and zone is still asked for (Karpenter's `MarkUnavailable(id)`)."""
    catalog = Catalog([reserved_offering(ODCR, "default"), reserved_offering(BLOCK, "capacity-block")])
    config = make_config(pool_gpu_reserved={"capacityReservations": [{"id": ODCR}, {"id": BLOCK}]})
    h = Harness(no_capacity("ReservationCapacityExceeded"), config=config, catalog=catalog)
    h.add(reserved_claim(ODCR, "o"), reserved_claim(BLOCK, "b"))
    outcome = h.launch("o")
    assert outcome.unavailable == [("p5.48xlarge", "us-east-1a", ODCR)]
    assert h.store.unavailable_offerings() == {("p5.48xlarge", "us-east-1a", ODCR)}
    h.launch("b")
    block = h.compute.requests[-1]
    assert block.capacity_type == "reserved" and block.reservation is not None
    assert block.reservation.reservation_ids == (BLOCK,)
    assert h.claim("b").capacity_type == "reserved"

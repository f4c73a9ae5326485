"""The in-memory Compute (simulator, other areas' tests) behind the fleet service: EC2's behaviour, no AWS."""

from __future__ import annotations

from datetime import timedelta

from gpu_autoscaler.adapters.memory.compute import MemoryCompute
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.errors import RequestThrottled
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.services.fleet import FleetService
from tests.unit.fleet.builders import NOW, TEMPLATE, make_claim, make_config, make_gang


def setup(**compute: object) -> tuple[FleetService, MemoryStateStore, MemoryCompute]:
    clock = FixedClock(NOW)
    store = MemoryStateStore("ml-prod", clock)
    ec2 = MemoryCompute("ml-prod", clock=clock, **compute)  # type: ignore[arg-type]
    service = FleetService(make_config(), store, ec2, clock=clock, launch_template_id=TEMPLATE,
                           sleep=lambda _: None)
    return service, store, ec2


def launch(service: FleetService, *ids: str, gang: str | None = None) -> None:
    service.launch(LaunchRequest(cluster="ml-prod", claim_ids=list(ids), gang=gang))


def test_the_best_offering_with_capacity_is_launched_and_tagged() -> None:
    service, store, ec2 = setup(no_capacity={("g6.xlarge", "us-east-1a", "spot")})
    store.create_claim(make_claim())
    launch(service, "gpu-burst-a1b2c")
    [instance] = ec2.running()
    assert (instance.instance_type, instance.zone, instance.capacity_type) == ("g6.xlarge", "us-east-1b", "spot")
    assert instance.tags[L.TAG_CLAIM] == "gpu-burst-a1b2c" and instance.tags[L.TAG_CLUSTER] == "ml-prod"
    assert "gpu-autoscaler/claim=gpu-burst-a1b2c" in instance.user_data
    assert store.unavailable_offerings() == {("g6.xlarge", "us-east-1a", "spot")}


def test_a_gang_lands_whole_in_one_place_with_each_instance_tagged() -> None:
    service, store, ec2 = setup(no_capacity={("p5.48xlarge", "us-east-1a", "on-demand")})
    gang = make_gang(3)
    for claim in gang:
        store.create_claim(claim)
    launch(service, *[c.id for c in gang], gang="training/train-42")
    instances = ec2.running()
    assert {(i.instance_type, i.zone) for i in instances} == {("p5.48xlarge", "us-east-1b")}
    assert sorted(i.tags[L.TAG_CLAIM] for i in instances) == sorted(c.id for c in gang)
    for claim in gang:
        stored = store.get_claim(claim.id)
        assert stored is not None and ec2.instances[stored.instance_id or ""].claim_id == claim.id


def test_a_full_reservation_falls_back_to_on_demand() -> None:
    service, store, ec2 = setup(reservations={"cr-0123456789abcdef0": 0})
    store.create_claim(make_claim(id="r", pool="gpu-reserved", capacity_type="reserved",
                                  instance_types=("p5.48xlarge",), zones=("us-east-1a",),
                                  reservation_id="cr-0123456789abcdef0"))
    launch(service, "r")
    [instance] = ec2.running()
    assert instance.capacity_type == "on-demand"
    assert ("p5.48xlarge", "us-east-1a", "cr-0123456789abcdef0") in store.unavailable_offerings()  # the reservation


def test_reservations_are_drawn_down() -> None:
    service, store, ec2 = setup(reservations={"cr-0123456789abcdef0": 1})
    for claim_id in ("r1", "r2"):
        store.create_claim(make_claim(id=claim_id, pool="gpu-reserved", capacity_type="reserved",
                                      instance_types=("p5.48xlarge",), zones=("us-east-1a",),
                                      reservation_id="cr-0123456789abcdef0"))
        launch(service, claim_id)
    assert sorted(i.capacity_type for i in ec2.running()) == ["on-demand", "reserved"]


def test_throttling_then_capacity() -> None:
    service, store, ec2 = setup(fail_next=[RequestThrottled("slow down")])
    store.create_claim(make_claim())
    launch(service, "gpu-burst-a1b2c")
    assert len(ec2.requests) == 2 and len(ec2.running()) == 1


def test_only_owned_instances_are_terminated() -> None:
    service, store, ec2 = setup()
    (claim,) = (make_claim(),)
    store.create_claim(claim)
    store.assign_pods(claim.id, list(claim.pods), timedelta(minutes=30))
    launch(service, claim.id)
    foreign = ec2.add_foreign("g6.xlarge", "us-east-1a")
    assert ec2.terminate([foreign]) == []
    stored = store.get_claim(claim.id)
    assert stored is not None
    closed = service.terminate(stored, "empty")
    assert closed.state is ClaimState.TERMINATED and ec2.running()[0].instance_id == foreign

"""Request building: overrides, strategies, reserved capacity, gangs, tags, tokens, and how EC2 is asked."""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from gpu_autoscaler.adapters.aws.fleet import render_create_fleet
from gpu_autoscaler.domain.fleet import (
    Attempt,
    architecture,
    build_request,
    candidate_offerings,
    client_token,
    first_attempt,
    launch_groups,
)
from gpu_autoscaler.domain.launch_templates import CAPACITY_TYPES, launch_template_data
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.fleet import MAX_LAUNCH_CONFIGS, MAX_OVERRIDES, FleetRequest
from tests.unit.fleet.builders import TEMPLATE, make_claim, make_config, make_context, make_gang

CONFIG = make_config()
CONTEXT = make_context(CONFIG)


def request_for(claims: list, pool: str | None = None, config=CONFIG, context=CONTEXT, gang: str | None = None,
                unavailable: set | None = None) -> FleetRequest:
    node_pool = config.pool(pool or claims[0].pool)
    attempt = first_attempt(claims, node_pool, unavailable or set(), context)
    assert attempt is not None
    return build_request(claims, node_pool, attempt, context, gang=gang)


def test_spot_claim_asks_price_capacity_optimized_over_types_times_zone_subnets() -> None:
    claim = make_claim(instance_types=("g6.xlarge", "g5.xlarge"), zones=("us-east-1b", "us-east-1a"))
    request = request_for([claim])
    assert request.capacity_type == "spot"
    assert request.allocation_strategy == "price-capacity-optimized"
    assert [(o.instance_type, o.zone, o.subnet_id) for o in request.overrides] == [
        ("g6.xlarge", "us-east-1b", "subnet-0bbb"), ("g6.xlarge", "us-east-1a", "subnet-0aaa"),
        ("g5.xlarge", "us-east-1b", "subnet-0bbb"), ("g5.xlarge", "us-east-1a", "subnet-0aaa"),
    ]
    assert [o.priority for o in request.overrides] == [0, 1, 2, 3]
    assert all(o.max_price is None for o in request.overrides)
    assert request.target_capacity == 1 and request.min_target_capacity is None
    params = render_create_fleet(request)
    assert params["Type"] == "instant"
    assert params["TargetCapacitySpecification"] == {"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "spot"}
    assert params["SpotOptions"] == {"AllocationStrategy": "price-capacity-optimized"}
    assert "OnDemandOptions" not in params and "ReservedCapacityOptions" not in params
    assert all(c["LaunchTemplateSpecification"]["LaunchTemplateId"] == TEMPLATE
               and c["LaunchTemplateSpecification"]["Version"] == "$Default" for c in params["LaunchTemplateConfigs"])


def test_on_demand_claim_asks_lowest_price() -> None:
    request = request_for([make_claim(capacity_type="on-demand")])
    assert request.allocation_strategy == "lowest-price"
    params = render_create_fleet(request)
    assert params["OnDemandOptions"] == {"AllocationStrategy": "lowest-price"}
    assert params["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "on-demand"


def test_reserved_claim_launches_into_its_reservation_only() -> None:
    claim = make_claim(pool="gpu-reserved", capacity_type="reserved", instance_types=("p5.48xlarge",),
                       zones=("us-east-1a",), reservation_id="cr-0123456789abcdef0")
    request = request_for([claim])
    assert request.reservation is not None
    assert request.reservation.reservation_ids == ("cr-0123456789abcdef0",)
    assert request.reservation.reservation_types == ("on-demand-capacity-reservation",)
    assert not request.reservation.fallback_on_demand
    params = render_create_fleet(request)
    assert params["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "reserved-capacity"
    assert params["ReservedCapacityOptions"] == {
        "AllocationStrategy": "prioritized",
        "ReservationTypes": ["on-demand-capacity-reservation"],
        "CapacityReservationTarget": {"CapacityReservationIds": ["cr-0123456789abcdef0"]},
    }
    assert [o["InstanceType"] for c in params["LaunchTemplateConfigs"] for o in c["Overrides"]] == ["p5.48xlarge"]


def test_capacity_reservations_come_before_capacity_blocks() -> None:
    config = make_config(pool_gpu_reserved={"capacityReservations": [
        {"id": "cr-0b10c4000000000aa", "type": "capacity-block"}, {"id": "cr-0123456789abcdef0"}]})
    claim = make_claim(pool="gpu-reserved", capacity_type="reserved", instance_types=("p5.48xlarge",),
                       zones=("us-east-1a",))
    request = request_for([claim], config=config, context=make_context(config))
    assert request.reservation is not None
    assert request.reservation.reservation_types == ("on-demand-capacity-reservation", "capacity-block")
    assert set(request.reservation.reservation_ids) == {"cr-0b10c4000000000aa", "cr-0123456789abcdef0"}


def test_capacity_block_claim_names_the_block() -> None:
    config = make_config(pool_gpu_reserved={"capacityReservations": [
        {"id": "cr-0b10c4000000000aa", "type": "capacity-block"}, {"id": "cr-0123456789abcdef0"}]})
    claim = make_claim(pool="gpu-reserved", capacity_type="reserved", instance_types=("p5.48xlarge",),
                       zones=("us-east-1a",), reservation_id="cr-0b10c4000000000aa")
    params = render_create_fleet(request_for([claim], config=config, context=make_context(config)))
    assert params["ReservedCapacityOptions"]["ReservationTypes"] == ["capacity-block"]
    assert params["ReservedCapacityOptions"]["CapacityReservationTarget"] == {
        "CapacityReservationIds": ["cr-0b10c4000000000aa"]}


def test_gang_is_one_all_or_nothing_request_in_one_zone() -> None:
    gang = make_gang(4)
    [group] = launch_groups(gang, "training/train-42")
    request = request_for(group, gang="training/train-42")
    assert request.claim_ids == tuple(c.id for c in gang)
    assert request.target_capacity == 4 and request.min_target_capacity == 4
    assert request.single_availability_zone and not request.single_instance_type
    params = render_create_fleet(request)
    assert params["OnDemandOptions"] == {"AllocationStrategy": "lowest-price", "MinTargetCapacity": 4,
                                         "SingleAvailabilityZone": True}
    assert request.tags["gpu-autoscaler/gang"] == "training/train-42"
    assert L.TAG_CLAIM not in request.tags


def test_gang_in_an_efa_pool_also_asks_one_instance_type() -> None:
    config = make_config(pool_gpu_reserved={"efa": True})
    request = request_for(make_gang(2, capacity_type="spot"), config=config, context=make_context(config),
                          gang="training/train-42")
    assert request.single_instance_type
    assert render_create_fleet(request)["SpotOptions"] == {
        "AllocationStrategy": "price-capacity-optimized", "MinTargetCapacity": 2,
        "SingleAvailabilityZone": True, "SingleInstanceType": True}


def test_gang_members_share_only_the_offerings_all_of_them_accept() -> None:
    gang = make_gang(2)
    gang[1] = gang[1].model_copy(update={"instance_types": ("p4d.24xlarge",), "zones": ("us-east-1b",)})
    request = request_for(gang, gang="training/train-42")
    assert [(o.instance_type, o.zone) for o in request.overrides] == [("p4d.24xlarge", "us-east-1b")]


def test_identical_claims_share_a_request_and_different_ones_do_not() -> None:
    a, b = make_claim(id="a"), make_claim(id="b")
    c = make_claim(id="c", instance_types=("g5.xlarge",))
    groups = launch_groups([a, b, c])
    assert [[x.id for x in g] for g in groups] == [["a", "b"], ["c"]]
    request = request_for(groups[0])
    assert request.target_capacity == 2 and request.min_target_capacity is None


def test_tags_of_design_on_instances_volumes_and_the_fleet() -> None:
    request = request_for([make_claim()])
    assert request.tags == {**L.cluster_tags("ml-prod"), L.TAG_NODE_POOL: "gpu-burst", L.TAG_CLAIM: "gpu-burst-a1b2c",
                            "Name": "ml-prod/gpu-burst-a1b2c"}
    specs = render_create_fleet(request)["TagSpecifications"]
    assert {s["ResourceType"] for s in specs} == {"fleet", "instance", "volume"}
    for spec in specs:
        assert {t["Key"]: t["Value"] for t in spec["Tags"]} == request.tags


def test_every_launched_resource_carries_the_cluster_tags_of_eks_and_karpenter() -> None:
    """EKS User Guide, "Self-managed nodes" (nodes/worker.adoc): nodes launched by hand carry
    `kubernetes.io/cluster/<cluster>` = `owned`; cloud-provider-aws keeps only instances with it when it looks for
    a LoadBalancer Service's backends (pkg/providers/v1/aws.go `describeInstances` -> `hasClusterTag`); Karpenter
    puts it and `eks:eks-cluster-name` on everything it launches (karpenter-provider-aws pkg/utils/utils.go
    `GetTags`). Ours stays the ownership tag IAM and the code act on."""
    cluster = {L.TAG_CLUSTER: "ml-prod", "kubernetes.io/cluster/ml-prod": "owned", "eks:eks-cluster-name": "ml-prod"}
    for claims in ([make_claim()], [make_claim(id="a"), make_claim(id="b")]):
        for spec in render_create_fleet(request_for(claims))["TagSpecifications"]:
            tags = {t["Key"]: t["Value"] for t in spec["Tags"]}
            assert cluster.items() <= tags.items(), spec["ResourceType"]
    for capacity_type in CAPACITY_TYPES:
        for efa in (0, 4):
            data = launch_template_data(CONFIG, capacity_type, security_groups=["sg-1"], instance_profile_arn="arn:p",
                                        efa_interfaces=efa)
            for spec in data["TagSpecifications"]:
                assert {t["Key"]: t["Value"] for t in spec["Tags"]} == cluster, (capacity_type, spec["ResourceType"])


def test_client_token_is_deterministic_per_claims_and_attempt() -> None:
    token = client_token("ml-prod", ["b", "a"], 0)
    assert token == client_token("ml-prod", ["a", "b"], 0)
    assert token != client_token("ml-prod", ["a", "b"], 1)
    assert token != client_token("ml-prod", ["a"], 0)
    assert token != client_token("ml-dev", ["a", "b"], 0)
    assert len(token) <= 64
    request = request_for([make_claim()])
    assert render_create_fleet(request)["ClientToken"] == client_token("ml-prod", ["gpu-burst-a1b2c"], 0)


def test_arm64_types_launch_the_arm64_image() -> None:
    request = request_for([make_claim(instance_types=("g6.xlarge", "g5g.xlarge"), zones=("us-east-1a",))])
    images = {o.instance_type: o.image_id for o in request.overrides}
    assert images == {"g6.xlarge": None, "g5g.xlarge": "ami-0fedcba9876543210"}
    override = [o for c in render_create_fleet(request)["LaunchTemplateConfigs"] for o in c["Overrides"]
                if o["InstanceType"] == "g5g.xlarge"]
    assert override[0]["ImageId"] == "ami-0fedcba9876543210"


def test_arm64_types_are_left_out_without_an_arm64_image() -> None:
    data_config = make_config(ami={"family": "AL2023", "version": "v1", "x86_64": "ami-0123456789abcdef0"})
    context = make_context(data_config)
    claim = make_claim(instance_types=("g5g.xlarge", "g6.xlarge"), zones=("us-east-1a",))
    assert candidate_offerings([claim], "spot", set(), context) == (("g6.xlarge", "us-east-1a"),)


@pytest.mark.parametrize(("name", "arch"), [("g5g.xlarge", "arm64"), ("c7gn.large", "arm64"),
                                            ("p6e-gb200.36xlarge", "arm64"), ("g6e.xlarge", "x86_64"),
                                            ("p5en.48xlarge", "x86_64"), ("gr6.4xlarge", "x86_64"),
                                            ("g4dn.xlarge", "x86_64"), ("inf2.xlarge", "x86_64")])
def test_architecture_from_the_name_when_the_catalog_does_not_say(name: str, arch: str) -> None:
    assert architecture(name) == arch


def test_unavailable_offerings_and_zones_without_subnets_are_not_asked() -> None:
    claim = make_claim(zones=("us-east-1a", "us-east-1b", "us-east-1d"))
    offerings = candidate_offerings([claim], "spot", {("g6.xlarge", "us-east-1a", "spot")}, CONTEXT)
    assert offerings == (("g6.xlarge", "us-east-1b"), ("g5.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1b"))


def test_at_most_sixty_overrides_and_fifty_types() -> None:
    many = tuple(f"g6.{i}xlarge" for i in range(1, 70))
    claim = make_claim(instance_types=many, zones=("us-east-1a", "us-east-1b", "us-east-1c"))
    offerings = candidate_offerings([claim], "spot", set(), CONTEXT)
    assert len(offerings) == MAX_OVERRIDES
    assert offerings[:3] == (("g6.1xlarge", "us-east-1a"), ("g6.1xlarge", "us-east-1b"), ("g6.1xlarge", "us-east-1c"))
    single_zone = make_claim(instance_types=many, zones=("us-east-1a",))
    offerings = candidate_offerings([single_zone], "spot", set(), CONTEXT)
    assert len({t for t, _ in offerings}) == MAX_LAUNCH_CONFIGS
    request = build_request([single_zone], CONFIG.pool("gpu-burst"), Attempt(0, "spot", offerings), CONTEXT)
    assert len(request.launch_configs) <= MAX_LAUNCH_CONFIGS


def test_each_instance_type_gets_user_data_with_its_own_labels() -> None:
    request = request_for([make_claim(zones=("us-east-1a",))])
    assert len(request.launch_configs) == 2
    params = render_create_fleet(request)
    for config in params["LaunchTemplateConfigs"]:
        [override] = config["Overrides"]
        user_data = base64.b64decode(config["LaunchTemplateSpecification"]["LaunchTemplateSpecificationUserData"])
        family = override["InstanceType"].split(".")[0]
        assert f"karpenter.k8s.aws/instance-family={family}".encode() in user_data
        assert b"gpu-autoscaler/claim=gpu-burst-a1b2c" in user_data


def test_an_instance_type_in_several_zones_is_one_launch_config_with_an_override_per_zone() -> None:
    """One user data per instance type (rendered once: its zones boot the same node), holding its zones' overrides."""
    request = request_for([make_claim(zones=("us-east-1a", "us-east-1b"))])
    assert [len({o.instance_type for o in c.overrides}) for c in request.launch_configs] == [1, 1]
    zones = {c.overrides[0].instance_type: sorted(o.zone for o in c.overrides) for c in request.launch_configs}
    assert zones == {"g6.xlarge": ["us-east-1a", "us-east-1b"], "g5.xlarge": ["us-east-1a", "us-east-1b"]}
    assert len(request.launch_configs) == 2 and len({c.user_data for c in request.launch_configs}) == 2


def test_a_request_ec2_would_refuse_cannot_be_built() -> None:
    request = request_for(make_gang(2), gang="training/train-42")
    with pytest.raises(ValidationError, match="single availability zone"):
        FleetRequest.model_validate({**request.model_dump(), "single_availability_zone": False})
    with pytest.raises(ValidationError, match="reservation"):
        FleetRequest.model_validate({**request.model_dump(), "capacity_type": "reserved"})
    with pytest.raises(ValidationError, match="one instance per claim"):
        FleetRequest.model_validate({**request.model_dump(), "target_capacity": 3, "min_target_capacity": 3})


def test_a_request_for_several_claims_tags_its_instances_with_its_token_at_launch() -> None:
    """Which claim each instance is for is known only from the answer (CreateTags afterwards); until then the
    request's token, in the instant fleet's instance TagSpecifications, lets the garbage collector tell the
    instances of a launch still being recorded from leaks (issue 19, scenario 1)."""
    from gpu_autoscaler.domain.fleet import TAG_LAUNCH

    request = request_for([make_claim(id="a"), make_claim(id="b")])
    assert request.tags[TAG_LAUNCH] == request.client_token
    [instance_spec] = [s for s in render_create_fleet(request)["TagSpecifications"] if s["ResourceType"] == "instance"]
    assert {"Key": TAG_LAUNCH, "Value": request.client_token} in instance_spec["Tags"]

"""EFA pools launch with EFA (issue 14 defect 6): one EFA per network card from a template per EFA count, gangs in
their zone's cluster placement group, and a security group that lets the nodes talk to each other."""

from __future__ import annotations

from typing import Any

from gpu_autoscaler.adapters.aws.fleet import efa_security_group_problem, render_create_fleet
from gpu_autoscaler.domain.fleet import LaunchContext, build_request, first_attempt
from gpu_autoscaler.domain.launch_templates import efa_template_key, launch_template_data
from tests.unit.fleet.builders import TEMPLATE, TYPES, make_claim, make_config, make_gang

CONFIG = make_config(pool_gpu_reserved={"efa": True})
TEMPLATES = {"on-demand": "lt-od", "on-demand/efa32": "lt-od-efa32", "on-demand/efa4": "lt-od-efa4",
             "spot": "lt-spot"}
GROUPS = {"gpu-reserved/us-east-1a": "pg-a", "gpu-reserved/us-east-1b": "pg-b"}


def test_an_efa_template_has_one_efa_per_network_card() -> None:
    data = launch_template_data(CONFIG, "on-demand", security_groups=["sg-1"], instance_profile_arn="arn:p",
                                efa_interfaces=4)
    assert data["NetworkInterfaces"] == [
        {"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "efa", "Groups": ["sg-1"],
         "DeleteOnTermination": True},
        *({"NetworkCardIndex": i, "DeviceIndex": 1, "InterfaceType": "efa", "Groups": ["sg-1"],
           "DeleteOnTermination": True} for i in (1, 2, 3)),
    ]
    assert "SecurityGroupIds" not in data  # EC2 refuses instance-level groups next to network interfaces
    assert efa_template_key("on-demand", 32) == "on-demand/efa32"


def test_an_efa_gang_launches_each_type_from_its_efa_template_in_the_zones_placement_group() -> None:
    context = LaunchContext.from_config(CONFIG, TEMPLATE, instance_types=TYPES.values(), launch_templates=TEMPLATES,
                                        placement_groups=GROUPS)
    gang = make_gang(2)
    pool = CONFIG.pool("gpu-reserved")
    attempt = first_attempt(gang, pool, set(), context)
    assert attempt is not None
    params = render_create_fleet(build_request(gang, pool, attempt, context))
    by_template: dict[str, set[str]] = {}
    for config in params["LaunchTemplateConfigs"]:
        template = config["LaunchTemplateSpecification"]["LaunchTemplateId"]
        for override in config["Overrides"]:
            by_template.setdefault(template, set()).add(override["InstanceType"])
            zone = "us-east-1a" if override["SubnetId"] == "subnet-0aaa" else "us-east-1b"
            assert override["Placement"] == {"GroupName": GROUPS[f"gpu-reserved/{zone}"]}
    assert by_template == {"lt-od-efa32": {"p5.48xlarge"}, "lt-od-efa4": {"p4d.24xlarge"}}


def test_each_template_launches_the_version_the_stack_last_wrote() -> None:
    """Not `$Default`, which a stack update leaves at 1 (infra/nodes.py): an EFA entry its own template's version."""
    versions = {"lt-od": "3", "lt-od-efa32": "2", "lt-od-efa4": "5", "lt-spot": "4"}
    context = LaunchContext.from_config(CONFIG, TEMPLATE, instance_types=TYPES.values(), launch_templates=TEMPLATES,
                                        template_versions=versions, placement_groups=GROUPS)
    launched: dict[str, str] = {}
    for claims in (make_gang(2), [make_claim(capacity_type="on-demand")], [make_claim()]):
        pool = CONFIG.pool(claims[0].pool)
        attempt = first_attempt(claims, pool, set(), context)
        assert attempt is not None
        for config in render_create_fleet(build_request(claims, pool, attempt, context))["LaunchTemplateConfigs"]:
            spec = config["LaunchTemplateSpecification"]
            launched[spec["LaunchTemplateId"]] = spec["Version"]
    assert launched == versions


def _group(group_id: str, ingress: list[dict[str, Any]], egress: list[dict[str, Any]]) -> dict[str, Any]:
    return {"GroupId": group_id, "IpPermissions": ingress, "IpPermissionsEgress": egress}


class FakeEc2:
    def __init__(self, groups: list[dict[str, Any]]) -> None:
        self.groups = groups

    def describe_security_groups(self, GroupIds: list[str]) -> dict[str, Any]:  # noqa: N803 (boto3's name)
        return {"SecurityGroups": [g for g in self.groups if g["GroupId"] in GroupIds]}


def test_the_security_group_must_let_efa_nodes_talk_to_each_other() -> None:
    to_self = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-1"}]}]
    anywhere = [{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]
    good = FakeEc2([_group("sg-1", to_self, anywhere)])
    assert efa_security_group_problem(good, ["sg-1"]) is None
    closed = FakeEc2([_group("sg-1", [{"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443,
                                       "UserIdGroupPairs": [{"GroupId": "sg-1"}]}], anywhere)])
    problem = efa_security_group_problem(closed, ["sg-1"])
    assert problem is not None and "sg-1" in problem and "all traffic from itself" in problem


def test_an_efa_pool_does_not_launch_when_its_nodes_could_not_talk() -> None:
    import random

    from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
    from gpu_autoscaler.clock import FixedClock
    from gpu_autoscaler.models.claims import ClaimState
    from gpu_autoscaler.models.messages import LaunchRequest
    from gpu_autoscaler.services.fleet import FleetService
    from tests.unit.fleet.builders import NOW
    from tests.unit.fleet.fakes import FakeCompute

    checks: list[int] = []

    def check() -> str:
        checks.append(1)
        return "EFA needs a node security group that allows all traffic from itself"

    clock = FixedClock(NOW)
    store = MemoryStateStore("ml-prod", clock)
    compute = FakeCompute()
    service = FleetService(CONFIG, store, compute, clock=clock, launch_template_id=TEMPLATE, efa_check=check,
                           sleep=lambda _: None, rng=random.Random(1))
    gang = make_gang(2)
    for claim in gang:
        store.create_claim(claim)
    first, _ = (service.launch(LaunchRequest(cluster="ml-prod", claim_ids=[c.id for c in gang],
                                             gang="training/train-42")) for _ in range(2))
    assert not compute.requests and len(checks) == 1
    assert {f.code for f in first.failed} == {"EfaSecurityGroup"}
    assert all(f.refused for f in first.failed)  # the operator's to fix: counted as a refused launch
    stored = store.get_claim(gang[0].id)
    assert stored is not None and stored.state is ClaimState.TERMINATED and "allows all traffic" in stored.reason

"""Least privilege: every mutation of EC2 capacity bound to the ownership tag, nothing broader than needed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import botocore.session
import pytest
from botocore import xform_name

import gpu_autoscaler
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER
from gpu_autoscaler.naming import FUNCTIONS
from infra.queues import WorkQueue
from tests.infrastructure.conftest import KUBERNETES_CLIENTS
from tests.infrastructure.sources import function_sources

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized

ACCOUNT = "111122223333"
STAR_ALLOWED = {"xray:PutTraceSegments", "xray:PutTelemetryRecords", "pricing:GetProducts",
                "servicequotas:GetAWSDefaultServiceQuota", "cloudwatch:GetMetricData"}
"""Actions without resource-level permissions (plus ec2:Describe*, checked by prefix)."""
PACKAGE = Path(gpu_autoscaler.__file__).parent
FUNCTIONS_DIR = Path(__file__).resolve().parents[2] / "functions"
LAUNCHED = ("fleet", "instance", "volume", "network-interface", "spot-instances-request")


def flat(value: Any) -> Any:
    """An ARN as a string: pseudo parameters filled in, other references as ${LogicalId}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(flat(part) for part in parts)
    if isinstance(value, dict) and "Ref" in value:
        return {"AWS::Partition": "aws", "AWS::AccountId": ACCOUNT}.get(value["Ref"], "${" + value["Ref"] + "}")
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return "${" + ".".join(value["Fn::GetAtt"]) + "}"
    raise AssertionError(f"unexpected ARN shape {value!r}")


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


TEARDOWN = "teardown"
"""The deletion hook's handlers (`infra.teardown`), one role for both."""


def statements_of(synthesized: Synthesized, function: str) -> list[dict[str, Any]]:
    stack = synthesized.stack
    role_id = synthesized.logical_id(stack.teardown.role if function == TEARDOWN else stack.functions.roles[function])
    found = []
    for policy in synthesized.of_type("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            found.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    assert found, function
    return found


def allowed(synthesized: Synthesized, function: str, action: str) -> list[dict[str, Any]]:
    return [s for s in statements_of(synthesized, function) if action in _listed(s["Action"])]


def _all_statements(synthesized: Synthesized) -> list[dict[str, Any]]:
    statements = []
    for resource in synthesized.resources.values():
        props = resource.get("Properties", {})
        for document in [props.get("PolicyDocument")] + [p["PolicyDocument"] for p in props.get("Policies", [])]:
            if document:
                statements.extend(document["Statement"])
    return statements


def test_no_action_star_and_resource_star_only_where_unavoidable(synthesized: Synthesized) -> None:
    for statement in _all_statements(synthesized):
        actions = _listed(statement["Action"])
        assert "*" not in actions
        if statement["Effect"] == "Allow" and "*" in _listed(statement.get("Resource", [])):
            assert all(a in STAR_ALLOWED or a.startswith("ec2:Describe") for a in actions), actions


def test_describe_calls_are_held_to_the_configured_region(synthesized: Synthesized) -> None:
    for name in FUNCTIONS:
        [statement] = [s for s in statements_of(synthesized, name) if s.get("Sid") == "DescribeEc2"]
        assert statement["Condition"] == {"StringEquals": {"aws:RequestedRegion": synthesized.config.region}}


def test_terminate_only_instances_tagged_with_this_cluster(synthesized: Synthesized) -> None:
    cluster = synthesized.config.cluster_name
    holders = [name for name in (*FUNCTIONS, TEARDOWN) if allowed(synthesized, name, "ec2:TerminateInstances")]
    assert sorted(holders) == ["consolidate", "drain", "fleet", "interruption", TEARDOWN]
    for name in holders:
        for statement in allowed(synthesized, name, "ec2:TerminateInstances"):
            assert statement["Condition"] == {"StringEquals": {f"aws:ResourceTag/{TAG_CLUSTER}": cluster}}
            assert flat(statement["Resource"]) == f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/*"


def test_create_tags_needs_the_tag_on_the_instance_or_the_launch(synthesized: Synthesized) -> None:
    """Only the fleet tags (at launch, and `_tag_claims` after a request for several claims); after
    launch only with the keys it writes then, `gpu-autoscaler/claim` and `Name` (`aws:TagKeys` with ForAllValues:
    IAM User Guide, "Controlling access during AWS requests", and Karpenter's AllowScopedResourceTagging in
    karpenter-provider-aws's getting-started cloudformation.yaml). Without it, CreateTags may rewrite the very tag
    `aws:ResourceTag` authorizes on: hand an instance to another cluster's garbage collector, or to Karpenter."""
    cluster = synthesized.config.cluster_name
    holders = [name for name in (*FUNCTIONS, TEARDOWN) if allowed(synthesized, name, "ec2:CreateTags")]
    assert holders == ["fleet"]
    conditions = sorted((s["Condition"] for s in allowed(synthesized, "fleet", "ec2:CreateTags")), key=len)
    assert conditions == [
        {"StringEquals": {"ec2:CreateAction": ["CreateFleet", "RunInstances"],
                          f"aws:RequestTag/{TAG_CLUSTER}": cluster}},
        {"StringEquals": {f"aws:ResourceTag/{TAG_CLUSTER}": cluster},
         "ForAllValues:StringEquals": {"aws:TagKeys": [TAG_CLAIM, "Name"]}},
    ]  # fmt: skip


def test_launches_must_carry_the_ownership_tag(synthesized: Synthesized) -> None:
    config = synthesized.config
    holders = [
        n
        for n in FUNCTIONS
        if allowed(synthesized, n, "ec2:CreateFleet") or allowed(synthesized, n, "ec2:RunInstances")
    ]
    assert holders == ["fleet"]
    statements = allowed(synthesized, "fleet", "ec2:CreateFleet")
    assert all(_listed(s["Action"]) == ["ec2:CreateFleet", "ec2:RunInstances"] for s in statements)
    tagged = [s for s in statements if "Condition" in s]
    untagged = [s for s in statements if "Condition" not in s]
    assert len(tagged) == 1 and len(untagged) == 1
    assert tagged[0]["Condition"] == {"StringEquals": {f"aws:RequestTag/{TAG_CLUSTER}": config.cluster_name}}
    assert sorted(flat(r) for r in tagged[0]["Resource"]) == sorted(
        f"arn:aws:ec2:us-east-1:{ACCOUNT}:{kind}/*" for kind in LAUNCHED
    )
    # What a launch only uses is named: the configured subnets, groups, AMIs, reservations, our template.
    lt_ids = [synthesized.logical_id(t) for t in synthesized.stack.nodes.templates.values()]
    expected = {
        *(f"arn:aws:ec2:us-east-1:*:subnet/{s}" for s in config.network.subnets.values()),
        *(f"arn:aws:ec2:us-east-1:*:security-group/{g}" for g in config.network.security_groups),
        f"arn:aws:ec2:us-east-1::image/{config.ami.x86_64}",
        f"arn:aws:ec2:us-east-1::image/{config.ami.arm64}",
        "arn:aws:ec2:us-east-1:*:capacity-reservation/cr-0123456789abcdef0",
        *(f"arn:aws:ec2:us-east-1:{ACCOUNT}:launch-template/${{{lt_id}}}" for lt_id in lt_ids),
        "arn:aws:ec2:us-east-1::snapshot/*",
    }
    assert {flat(r) for r in untagged[0]["Resource"]} == expected


def test_shared_subnets_groups_and_reservations_of_another_account_may_be_launched_into(
        synthesized: Synthesized) -> None:
    """A shared VPC's subnets (and security groups) and a capacity reservation shared through AWS RAM belong to
    their owner's account, and their ARNs carry it: pinned to the stack's account, CreateFleet is denied there.
    Their ids stay named; what the stack creates itself (launch templates, placement groups) stays its own."""
    config = synthesized.config
    [statement] = [s for s in allowed(synthesized, "fleet", "ec2:CreateFleet") if "Condition" not in s]
    used = {flat(r) for r in statement["Resource"]}
    for subnet in config.network.subnets.values():
        assert f"arn:aws:ec2:us-east-1:*:subnet/{subnet}" in used
    for group in config.network.security_groups:
        assert f"arn:aws:ec2:us-east-1:*:security-group/{group}" in used
    assert "arn:aws:ec2:us-east-1:*:capacity-reservation/cr-0123456789abcdef0" in used
    assert all(f":{ACCOUNT}:" in arn for arn in used if ":launch-template/" in arn)


_NOT_IN_FUNCTIONS = {"emulator", "simulation", "cli"}
"""Stand-ins for AWS, and the command line, which runs with its user's credentials rather than a function's role."""


def operations_called(service: str = "ec2", prefix: str = "ec2", root: Path = PACKAGE) -> set[str]:
    """Every API action of `service` (its botocore name; `prefix`: its IAM prefix) the functions' code calls
    (`client.describe_instances(`, `get_paginator("...")`), found by name in the import closure of their handlers."""
    model = botocore.session.get_session().get_service_model(service)
    operations = {xform_name(op): op for op in model.operation_names}
    called: set[str] = set()
    for path in function_sources():
        if path.is_relative_to(root) and path.relative_to(root).parts[0] in _NOT_IN_FUNCTIONS:
            continue
        source = path.read_text()
        names = re.findall(r"\.([a-z_]+)\(", source) + re.findall(r"""get_paginator\(["']([a-z_]+)["']\)""", source)
        called.update(f"{prefix}:{operations[name]}" for name in names if name in operations)
    return called


def _granted(synthesized: Synthesized, prefix: str) -> set[str]:
    return {
        action
        for name in (*FUNCTIONS, TEARDOWN)
        for statement in statements_of(synthesized, name)
        for action in _listed(statement["Action"])
        if action.startswith(f"{prefix}:")
    }


def test_ec2_permissions_are_exactly_what_the_code_calls(synthesized: Synthesized) -> None:
    """Nothing granted that no code calls (issue 14, defect 12), nothing called that is not granted. An instant
    CreateFleet also needs ec2:RunInstances: EC2 authorizes the launches it makes with the caller's permissions
    (EC2 User Guide, "EC2 Fleet prerequisites")."""
    assert _granted(synthesized, "ec2") == operations_called() | {"ec2:RunInstances"}
    assert not any(allowed(synthesized, n, "ec2:CreateLaunchTemplate") for n in FUNCTIONS)


@pytest.mark.parametrize(("service", "prefix"), [("service-quotas", "servicequotas"), ("pricing", "pricing"),
                                                ("cloudwatch", "cloudwatch"), ("cloudformation", "cloudformation")])
def test_quota_price_and_stack_permissions_are_exactly_what_the_code_calls(
        synthesized: Synthesized, service: str, prefix: str) -> None:
    assert _granted(synthesized, prefix) == operations_called(service, prefix)


def test_pass_role_only_for_the_node_role_to_ec2(synthesized: Synthesized) -> None:
    holders = [name for name in FUNCTIONS if allowed(synthesized, name, "iam:PassRole")]
    assert holders == ["fleet"]
    [statement] = allowed(synthesized, "fleet", "iam:PassRole")
    assert statement["Resource"] == synthesized.config.node_role
    # EC2's service principal is ec2.amazonaws.com.cn in the China partition: AWS's own EC2 Fleet and Spot service
    # role policies and Karpenter's controller policy allow both.
    assert statement["Condition"] == {
        "StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}}


def test_queue_sends_follow_each_function_s_job(synthesized: Synthesized) -> None:
    queues = synthesized.stack.queues.queues

    def senders(kind: WorkQueue) -> list[str]:
        arn = {"Fn::GetAtt": [synthesized.logical_id(queues[kind]), "Arn"]}
        return [n for n in FUNCTIONS if any(s["Resource"] == arn for s in allowed(synthesized, n, "sqs:SendMessage"))]

    assert senders(WorkQueue.LAUNCH) == ["packer", "fleet", "interruption", "prewarm", "consolidate"]
    assert senders(WorkQueue.DRAIN) == ["interruption", "drain", "consolidate"]
    assert senders(WorkQueue.PENDING_PODS) == []


def test_every_function_reads_the_config_and_uses_the_table(synthesized: Synthesized) -> None:
    table = {"Fn::GetAtt": [synthesized.logical_id(synthesized.stack.table), "Arn"]}
    parameter_ref = "${" + synthesized.logical_id(synthesized.stack.parameter) + "}"
    for name in FUNCTIONS:
        [read] = allowed(synthesized, name, "ssm:GetParameter")
        assert flat(read["Resource"]) == f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter{parameter_ref}"
        [write] = allowed(synthesized, name, "dynamodb:PutItem")
        assert write["Resource"] == [table]


def test_kubernetes_access_is_describe_cluster_on_this_cluster(synthesized: Synthesized) -> None:
    """The Kubernetes API's users read the endpoint and CA; the fleet reads the CA and service CIDR for the nodes'
    user data, and is not a Kubernetes client (no role output to grant RBAC to); nor is prewarm, which reads
    neither."""
    cluster = synthesized.config.cluster_name
    holders = [name for name in FUNCTIONS if allowed(synthesized, name, "eks:DescribeCluster")]
    assert holders == ["packer", "fleet", "interruption", "drain", "consolidate"]
    for name in holders:
        [statement] = allowed(synthesized, name, "eks:DescribeCluster")
        assert flat(statement["Resource"]) == f"arn:aws:eks:us-east-1:{ACCOUNT}:cluster/{cluster}"
        assert statement["Action"] == "eks:DescribeCluster" and "Condition" not in statement
    role_outputs = [name for name in FUNCTIONS if f"{name.title()}RoleArn" in synthesized.outputs]
    assert role_outputs == KUBERNETES_CLIENTS


def test_quotas_only_for_ec2(synthesized: Synthesized) -> None:
    """Applied values on the EC2 quotas only; defaults on `*`, as GetAWSDefaultServiceQuota has no resource type."""
    for statement in allowed(synthesized, "packer", "servicequotas:GetServiceQuota"):
        assert flat(statement["Resource"]) == f"arn:aws:servicequotas:us-east-1:{ACCOUNT}:ec2/*"
    [defaults] = allowed(synthesized, "packer", "servicequotas:GetAWSDefaultServiceQuota")
    assert defaults["Action"] == "servicequotas:GetAWSDefaultServiceQuota" and defaults["Resource"] == "*"
    assert not allowed(synthesized, "drain", "pricing:GetProducts")
    assert not allowed(synthesized, "drain", "servicequotas:GetAWSDefaultServiceQuota")


def test_the_price_list_may_be_asked_outside_the_configured_region(synthesized: Synthesized) -> None:
    """The Price List endpoint of a region's partition is often another region (eu-central-1 for eu-west-1):
    GetProducts carries no aws:RequestedRegion condition, unlike the EC2 Describe calls."""
    for name in FUNCTIONS:
        for statement in allowed(synthesized, name, "pricing:GetProducts"):
            assert statement["Resource"] == "*" and "Condition" not in statement


def test_function_roles_use_no_managed_policies(synthesized: Synthesized) -> None:
    """No role carries a managed policy (AWS's are broader than what the code calls), except the agent's role its own
    AgentPolicyArn, the policy an IRSA role of the user's carries instead."""
    agent_role = synthesized.logical_id(synthesized.stack.agent.role)
    for key, role in synthesized.of_type("AWS::IAM::Role").items():
        managed = role["Properties"].get("ManagedPolicyArns")
        assert managed is None or (key == agent_role and managed == [
            {"Ref": synthesized.logical_id(synthesized.stack.agent.policy)}]), key


def test_the_fleet_may_create_the_spot_service_linked_role_and_nothing_else(synthesized: Synthesized) -> None:
    """A fresh account has no AWSServiceRoleForEC2Spot; the first Spot launch creates it (or fails with
    AuthFailure.ServiceLinkedRoleCreationNotPermitted)."""
    (statement,) = allowed(synthesized, "fleet", "iam:CreateServiceLinkedRole")
    assert statement["Condition"] == {"StringEquals": {"iam:AWSServiceName": "spot.amazonaws.com"}}
    assert flat(statement["Resource"]) == (
        f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot")
    others = [f for f in FUNCTIONS if f != "fleet" and allowed(synthesized, f, "iam:CreateServiceLinkedRole")]
    assert others == []


def test_only_the_packer_may_dead_letter_a_document_itself(synthesized: Synthesized) -> None:
    """A document that can never parse goes to the pending-pods DLQ at once (FIFO: it would hold the group back)."""
    queues = synthesized.stack.queues
    dlq = synthesized.logical_id(queues.dead_letter_queues[WorkQueue.PENDING_PODS])

    def may_send(function: str) -> bool:
        return any(flat(resource) == "${" + dlq + ".Arn}"
                   for s in allowed(synthesized, function, "sqs:SendMessage") for resource in _listed(s["Resource"]))

    assert [f for f in FUNCTIONS if may_send(f)] == ["packer"]
    packer = synthesized.stack.functions.functions["packer"]
    env = synthesized.resources[synthesized.logical_id(packer)]["Properties"]["Environment"]["Variables"]
    assert env["PENDING_PODS_DLQ_URL"] == {"Ref": dlq}


def test_efa_placement_groups_and_latest_images_are_allowed_to_launch() -> None:
    import aws_cdk as cdk

    from gpu_autoscaler.config import parse_config
    from infra.permissions import Ec2Permissions
    from tests.infrastructure.conftest import infrastructure_config_data

    data = infrastructure_config_data()
    parameter = "/aws/service/eks/optimized-ami/1.31/amazon-linux-2023/x86_64/nvidia/recommended/image_id"
    pool = next(p for p in data["nodePools"] if p["name"] == "gpu-burst")
    pool["ami"] = {"family": "AL2023", "version": "latest", "x86_64": f"resolve:ssm:{parameter}"}
    stack = cdk.Stack(cdk.App(), "P", env=cdk.Environment(account=ACCOUNT, region="us-east-1"))
    grant = Ec2Permissions(stack, parse_config(data), launch_template_ids=["lt-1"],
                           placement_groups=["pg-a"]).launch()
    statements = {s["Sid"]: s for s in (stack.resolve(x.to_statement_json()) for x in grant.statements)}
    used = {flat(r) for r in statements["LaunchFromConfiguredResources"]["Resource"]}
    assert f"arn:aws:ec2:us-east-1:{ACCOUNT}:placement-group/pg-a" in used
    assert "arn:aws:ec2:us-east-1::image/*" in used
    resolve = statements["ResolveLatestImages"]
    assert resolve["Action"] == "ssm:GetParameters"
    assert flat(resolve["Resource"]) == f"arn:aws:ssm:us-east-1::parameter{parameter}"


def test_an_image_parameter_of_the_account_is_granted_by_its_own_arn() -> None:
    """Only AWS's public parameters (`/aws/service/...`) have an ARN without an account; one the account owns (a
    golden-AMI pipeline's, EC2 Image Builder's `ssmParameterConfigurations`) carries it (Service Authorization
    Reference, Systems Manager, resource type `parameter`), and CreateFleet resolves it with the caller's
    permissions: granted on the public form, every launch of its pool was refused."""
    import aws_cdk as cdk

    from gpu_autoscaler.config import parse_config
    from infra.permissions import Ec2Permissions
    from tests.infrastructure.conftest import infrastructure_config_data

    data = infrastructure_config_data()
    data["ami"] = {"family": "AL2023", "version": "latest", "x86_64": "resolve:ssm:/golden/eks-gpu/x86_64"}
    stack = cdk.Stack(cdk.App(), "P", env=cdk.Environment(account=ACCOUNT, region="us-east-1"))
    grant = Ec2Permissions(stack, parse_config(data), launch_template_ids=["lt-1"]).launch()
    statements = {s["Sid"]: s for s in (stack.resolve(x.to_statement_json()) for x in grant.statements)}
    assert flat(statements["ResolveLatestImages"]["Resource"]) == \
        f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter/golden/eks-gpu/x86_64"

"""The stack's resources on an AWS endpoint: created from the configuration, or found again by name.

`provision` creates on an empty emulator what `cdk deploy` creates on AWS (rules and schedules
included; plus the network, role and images the configuration only names, since an emulator starts
empty). `discover` finds them again from the configuration alone, on a running emulator or on a real
deployment, through `ResourceNames` and tags: that is how `invoke --endpoint-url` and `invoke --aws`
know where to point a handler.

Only boto3 calls here, so both functions work against any endpoint.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from gpu_autoscaler.domain.launch_templates import (
    TAG_ZONE,
    launch_template_data,
    placement_group_key,
    template_variants,
)
from gpu_autoscaler.emulator.moto_fixes import NODE_ROLE_POLICIES
from gpu_autoscaler.emulator.triggers import create_rules, create_schedules
from gpu_autoscaler.models.labels import TAG_CLUSTER, TAG_NODE_POOL
from gpu_autoscaler.naming import FUNCTIONS, PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE, ResourceNames
from gpu_autoscaler.wiring import FUNCTION_WIRING, MAX_RECEIVE_COUNT, QUEUES, visibility_timeout

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.config import Config

__all__ = [
    "DLQ_SUFFIX",
    "FUNCTION_TIMEOUTS",
    "MAX_RECEIVE_COUNT",
    "QUEUES",
    "SCHEDULER_DLQ",
    "TAG_EMULATES",
    "QueueSpec",
    "ResourcesNotFound",
    "StackResources",
    "discover",
    "provision",
    "queue_specs",
    "update_launch_templates",
]

DLQ_SUFFIX = "-dlq"
SCHEDULER_DLQ = "scheduler-dlq"
TAG_EMULATES = "gpu-autoscaler/emulates"
"""On an emulator's subnet or security group: the configuration's id it stands in for."""

VPC_CIDR = "10.0.0.0/16"
SUBNET_PREFIX = 20
FOURTEEN_DAYS = 14 * 24 * 3600


@dataclass(frozen=True)
class QueueSpec:
    """One work queue and its dead-letter queue, as the stack declares them."""

    logical: str
    """`pending-pods`, `interruption`, `launch`, `drain`: the key of `StackResources.queue_urls`."""
    name: str
    dlq_name: str
    fifo: bool
    visibility_timeout: int
    """Seconds; six times the consuming function's timeout, as AWS advises for event source mappings."""

    @property
    def dlq_logical(self) -> str:
        return self.logical + DLQ_SUFFIX


FUNCTION_TIMEOUTS = {name: wiring.timeout_seconds for name, wiring in FUNCTION_WIRING.items()}
"""Seconds, as the stack sets them (both read `gpu_autoscaler.wiring`)."""


def queue_specs(names: ResourceNames) -> list[QueueSpec]:
    pairs = {
        "pending-pods": (names.pending_pods_queue, names.pending_pods_dlq),
        "interruption": (names.interruption_queue, names.interruption_dlq),
        "launch": (names.launch_queue, names.launch_dlq),
        "drain": (names.drain_queue, names.drain_dlq),
    }
    return [
        QueueSpec(logical, name, dlq, name.endswith(".fifo"), visibility_timeout(logical))
        for logical, (name, dlq) in pairs.items()
    ]


class ResourcesNotFound(LookupError):
    """A resource the configuration implies is missing at the endpoint (not deployed, or another cluster)."""


@dataclass(frozen=True)
class StackResources:
    """Where everything is, at one endpoint. Ids are the endpoint's own (an emulator's differ from the config's)."""

    cluster: str
    region: str
    table_name: str
    config_parameter: str
    queue_urls: dict[str, str]
    """Logical name (`pending-pods`, `pending-pods-dlq`, …, `scheduler-dlq`) → URL."""
    queue_arns: dict[str, str]
    launch_template_id: str | None = None
    launch_template_name: str | None = None
    launch_templates: dict[str, str] = field(default_factory=dict)
    """Template key (`domain.launch_templates`) → launch template id (`launch_template_id` is the On-Demand one)."""
    launch_template_versions: dict[str, str] = field(default_factory=dict)
    """Launch template id → its `LatestVersionNumber`: the version the stack hands the fleet function to launch
    (infra/nodes.py says why not `$Default`)."""
    placement_groups: dict[str, str] = field(default_factory=dict)
    """`pool/zone` → an EFA pool's cluster placement group."""
    vpc_id: str | None = None
    subnet_ids: dict[str, str] = field(default_factory=dict)
    """Configuration subnet id → subnet id at the endpoint (identity on real AWS)."""
    zone_subnets: dict[str, str] = field(default_factory=dict)
    """Availability zone → subnet id at the endpoint."""
    security_group_ids: dict[str, str] = field(default_factory=dict)
    """Configuration security group id → security group id at the endpoint."""
    node_role_arn: str | None = None
    instance_profile_arn: str | None = None
    image_ids: dict[str, str] = field(default_factory=dict)
    """Architecture (`x86_64`, `arm64`) → AMI id; the configuration's ids, which resolve at the endpoint."""
    function_roles: dict[str, str] = field(default_factory=dict)
    """Function → its execution role's ARN (the emulator's; the stack's are named by CloudFormation)."""

    def queue_url(self, logical: str) -> str:
        try:
            return self.queue_urls[logical]
        except KeyError:
            raise KeyError(f"no queue '{logical}'; known: {', '.join(sorted(self.queue_urls))}") from None

    def function_environment(self, function: str | None = None) -> dict[str, str]:
        """The variables the stack sets on a function (and those Lambda itself sets that our code reads)."""
        names = ResourceNames(self.cluster)
        env = {
            "TABLE_NAME": self.table_name,
            "CONFIG_PARAMETER": self.config_parameter,
            "LAUNCH_QUEUE_URL": self.queue_urls["launch"],
            "DRAIN_QUEUE_URL": self.queue_urls["drain"],
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "POWERTOOLS_SERVICE_NAME": function or "gpu-autoscaler",
            "POWERTOOLS_METRICS_NAMESPACE": names.metrics_namespace,
        }
        if self.launch_template_id:
            env["LAUNCH_TEMPLATE_ID"] = self.launch_template_id
        if self.launch_templates:
            env["LAUNCH_TEMPLATES"] = json.dumps(
                {key: {"id": template, "version": self.launch_template_versions[template]}
                 for key, template in self.launch_templates.items()}, sort_keys=True)
        if function in (None, "packer"):
            env["PENDING_PODS_DLQ_URL"] = self.queue_urls["pending-pods-dlq"]
        if self.placement_groups:
            env["PLACEMENT_GROUPS"] = json.dumps(self.placement_groups, sort_keys=True)
        if function:
            env["AWS_LAMBDA_FUNCTION_NAME"] = names.function(function)
        return env


def provision(clients: AwsClients, config: Config, *, visibility_timeout: int | None = None) -> StackResources:
    """Create every resource on an empty endpoint. `visibility_timeout` overrides the queues' (fast redrive)."""
    names = ResourceNames(config.cluster_name)
    tags = {TAG_CLUSTER: config.cluster_name}
    vpc_id, zone_subnets, subnet_ids = _create_network(clients.client("ec2"), config, names, tags)
    security_groups = _create_security_groups(clients.client("ec2"), config, names, vpc_id, tags)
    role_arn, profile_arn = _create_node_identity(clients.client("iam"), config, names, tags)
    function_roles = _create_function_roles(clients.client("iam"), names, tags)
    _create_cluster(clients.client("eks"), config, zone_subnets)
    templates = _create_launch_templates(
        clients.client("ec2"), config, names, list(security_groups.values()), profile_arn, tags
    )
    placement_groups = _create_placement_groups(clients.client("ec2"), config, names, tags)
    urls, arns = _create_queues(clients.client("sqs"), names, tags, visibility_timeout)
    create_rules(clients, names, arns["interruption"], arns["interruption" + DLQ_SUFFIX], tags)
    create_schedules(clients, config, names, arns[SCHEDULER_DLQ], tags)
    _create_table(clients.client("dynamodb"), names, tags)
    clients.client("ssm").put_parameter(
        Name=names.config_parameter, Value=config.to_json(), Type="String", Tier="Advanced", Overwrite=True,
        Description=f"gpu-autoscaler configuration of cluster {config.cluster_name}",
    )
    return StackResources(
        cluster=config.cluster_name, region=config.region, table_name=names.table,
        config_parameter=names.config_parameter, queue_urls=urls, queue_arns=arns,
        launch_template_id=templates["on-demand"][0], launch_template_name=names.launch_template,
        launch_templates={key: template for key, (template, _) in templates.items()},
        launch_template_versions=dict(templates.values()), placement_groups=placement_groups, vpc_id=vpc_id,
        subnet_ids=subnet_ids,
        zone_subnets=zone_subnets, security_group_ids=security_groups,
        node_role_arn=role_arn, instance_profile_arn=profile_arn, image_ids=_image_ids(config),
        function_roles=function_roles,
    )


def discover(clients: AwsClients, config: Config) -> StackResources:
    """Find the resources of `config`'s cluster by name and tag; raise `ResourcesNotFound` naming what is missing.

    Queues, table and parameter must exist. Network ids map through the `gpu-autoscaler/emulates` tag
    where an emulator made stand-ins, and are the configuration's own otherwise (a real deployment).
    """
    names = ResourceNames(config.cluster_name)
    urls, arns = _find_queues(clients.client("sqs"), names)
    _require(clients.client("dynamodb").describe_table, "table", names.table, TableName=names.table)
    _require(clients.client("ssm").get_parameter, "SSM parameter", names.config_parameter, Name=names.config_parameter)
    ec2 = clients.client("ec2")
    vpc_id, subnet_ids, security_groups = _find_network(ec2, config)
    found = {key: template for key in template_variants(config)
             if (template := _find_launch_template(ec2, names.capacity_launch_template(key.replace("/", "-"))))}
    templates = {key: template for key, (template, _) in found.items()}
    template_id = templates.get("on-demand")
    role_arn, profile_arn = _find_node_identity(clients.client("iam"), names, config.region)
    return StackResources(
        cluster=config.cluster_name, region=config.region, table_name=names.table,
        config_parameter=names.config_parameter, queue_urls=urls, queue_arns=arns,
        launch_template_id=template_id, launch_template_name=names.launch_template if template_id else None,
        launch_templates=templates, launch_template_versions=dict(found.values()),
        placement_groups=_find_placement_groups(ec2, config),
        vpc_id=vpc_id, subnet_ids=subnet_ids,
        zone_subnets={zone: subnet_ids[subnet] for zone, subnet in config.network.subnets.items()},
        security_group_ids=security_groups, node_role_arn=role_arn, instance_profile_arn=profile_arn,
        image_ids=_image_ids(config), function_roles=_find_function_roles(clients.client("iam"), names),
    )


# ---- creation ----------------------------------------------------------------------------------------------


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _create_network(
    ec2: Any, config: Config, names: ResourceNames, tags: dict[str, str]
) -> tuple[str, dict[str, str], dict[str, str]]:
    """One VPC, one subnet per configured zone, each tagged with the configuration id it stands in for."""
    known = {z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]}
    unknown = sorted(set(config.network.subnets) - known)
    if unknown:
        raise ValueError(f"network.subnets names zones that {config.region} does not have: {', '.join(unknown)}")
    vpc_id = ec2.create_vpc(
        CidrBlock=VPC_CIDR,
        TagSpecifications=[{"ResourceType": "vpc", "Tags": _tag_list({**tags, "Name": names.prefix})}],
    )["Vpc"]["VpcId"]
    blocks = ipaddress.ip_network(VPC_CIDR).subnets(new_prefix=SUBNET_PREFIX)
    zone_subnets: dict[str, str] = {}
    subnet_ids: dict[str, str] = {}
    for zone in config.zones:
        configured = config.network.subnets[zone]
        subnet_tags = {**tags, "Name": f"{names.prefix}-{zone}", TAG_EMULATES: configured}
        subnet = ec2.create_subnet(
            VpcId=vpc_id, CidrBlock=str(next(blocks)), AvailabilityZone=zone,
            TagSpecifications=[{"ResourceType": "subnet", "Tags": _tag_list(subnet_tags)}],
        )["Subnet"]["SubnetId"]
        zone_subnets[zone] = subnet
        subnet_ids[configured] = subnet
    return vpc_id, zone_subnets, subnet_ids


CLUSTER_SERVICE_CIDR = "172.20.0.0/16"
"""The emulated EKS cluster's service CIDR (what DescribeCluster answers)."""


def _create_cluster(eks: Any, config: Config, zone_subnets: dict[str, str]) -> None:
    """The customer's EKS cluster: not ours to create on AWS, but the fleet reads its certificate authority and
    service CIDR from DescribeCluster when the configuration leaves them out, as on a real account. Its API
    endpoint is public (EKS's default) and it takes access entries and aws-auth (API_AND_CONFIG_MAP, the console's
    default), as the stack's access entries need."""
    eks.create_cluster(
        name=config.cluster_name,
        roleArn=f"arn:aws:iam::{config.node_role.split(':')[4]}:role/{config.cluster_name}-eks-cluster",
        resourcesVpcConfig={"subnetIds": sorted(zone_subnets.values())},
        kubernetesNetworkConfig={"serviceIpv4Cidr": CLUSTER_SERVICE_CIDR},
        accessConfig={"authenticationMode": "API_AND_CONFIG_MAP"},
    )


def _create_security_groups(
    ec2: Any, config: Config, names: ResourceNames, vpc_id: str, tags: dict[str, str]
) -> dict[str, str]:
    groups: dict[str, str] = {}
    for configured in config.network.security_groups:
        group_id = groups[configured] = ec2.create_security_group(
            GroupName=f"{names.prefix}-{configured}", VpcId=vpc_id,
            Description=f"stands in for {configured} of cluster {config.cluster_name}",
            TagSpecifications=[{
                "ResourceType": "security-group",
                "Tags": _tag_list({**tags, "Name": f"{names.prefix}-nodes", TAG_EMULATES: configured}),
            }],
        )["GroupId"]
        # As an EKS cluster security group: all traffic from members to members (EKS User Guide, "Amazon EKS
        # security group requirements"), which EFA needs too (EC2 User Guide, "Get started with EFA").
        ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}])
        ec2.authorize_security_group_egress(GroupId=group_id, IpPermissions=[
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}])
    return groups


def _role_name_and_path(role_arn: str) -> tuple[str, str]:
    resource = role_arn.split(":", 5)[5].removeprefix("role")
    path, _, name = resource.rpartition("/")
    return name, path + "/"


def _create_node_identity(
    iam: Any, config: Config, names: ResourceNames, tags: dict[str, str]
) -> tuple[str, str]:
    """The node role the configuration names (it pre-exists on AWS) and the stack's instance profile for it."""
    role_name, path = _role_name_and_path(config.node_role)
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
    role_arn = iam.create_role(
        RoleName=role_name, Path=path, AssumeRolePolicyDocument=json.dumps(trust), Tags=_tag_list(tags),
        Description=f"GPU nodes of cluster {config.cluster_name}",
    )["Role"]["Arn"]
    profile = names.instance_profile(config.region)
    profile_arn = iam.create_instance_profile(InstanceProfileName=profile, Tags=_tag_list(tags))["InstanceProfile"][
        "Arn"
    ]
    iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=role_name)
    partition = role_arn.split(":")[1]
    for policy in NODE_ROLE_POLICIES:  # a ready account's node role holds them (create-node-role.adoc)
        iam.attach_role_policy(RoleName=role_name, PolicyArn=f"arn:{partition}:iam::aws:policy/{policy}")
    # An account that has launched Spot before holds EC2's Spot service-linked role (EC2 User Guide, "Service-
    # linked role for Spot Instance requests"); the emulator's account is one.
    # moto's CreateServiceLinkedRole would name it `AWSServiceRoleForspot`; AWS's name and path are these.
    if any("spot" in pool.capacity_types for pool in config.node_pools):
        spot_trust = {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "spot.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
        iam.create_role(RoleName="AWSServiceRoleForEC2Spot", Path="/aws-service-role/spot.amazonaws.com/",
                        AssumeRolePolicyDocument=json.dumps(spot_trust))
    return role_arn, profile_arn


def _create_function_roles(iam: Any, names: ResourceNames, tags: dict[str, str]) -> dict[str, str]:
    """An execution role per function, trusting Lambda, as the stack gives each one (its policies are not
    modelled: moto does not enforce IAM). The emulator runs each function with its role's credentials, as Lambda
    does, so its EKS token names that role (`EmbeddedAws.function_environment`)."""
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
    return {function: str(iam.create_role(
        RoleName=names.role(function), AssumeRolePolicyDocument=json.dumps(trust), Tags=_tag_list(tags),
        Description=f"execution role of the {function} function")["Role"]["Arn"]) for function in FUNCTIONS}


def _create_launch_templates(
    ec2: Any, config: Config, names: ResourceNames, security_groups: list[str], profile_arn: str,
    tags: dict[str, str],
) -> dict[str, tuple[str, str]]:
    """The templates CreateFleet names, one per capacity type (and EFA count, for EFA pools), as the stack
    writes them (infra/nodes.py and `domain.launch_templates`, which says why). Template key → (id, version).

    Instance type, subnet, volumes and the image come from each fleet request's overrides, so these
    templates serve every pool.
    """
    ids: dict[str, tuple[str, str]] = {}
    for key, (capacity_type, efa) in template_variants(config).items():
        data = launch_template_data(config, capacity_type, security_groups=security_groups,
                                    instance_profile_arn=profile_arn, efa_interfaces=efa)
        created = ec2.create_launch_template(
            LaunchTemplateName=names.capacity_launch_template(key.replace("/", "-")), LaunchTemplateData=data,
            VersionDescription=f"{config.ami.family} {config.ami.version} {key}",
            TagSpecifications=[{"ResourceType": "launch-template", "Tags": _tag_list(tags)}],
        )["LaunchTemplate"]
        ids[key] = (str(created["LaunchTemplateId"]), str(created["LatestVersionNumber"]))
    return ids


def update_launch_templates(clients: AwsClients, config: Config, resources: StackResources) -> None:
    """What a stack update does to the templates: each one whose data changed gets a new version, and its default
    version stays where it was — "The default version of a launch template cannot be specified in AWS
    CloudFormation" (CloudFormation Template Reference, AWS::EC2::LaunchTemplate, `DefaultVersionNumber`; users
    see "a new version 2, but the default was still set to 1", aws-cloudformation/cloudformation-coverage-roadmap
    #1518). Security groups and the instance profile are the deployed ones (the emulator's stand-ins)."""
    ec2 = clients.client("ec2")
    groups = [resources.security_group_ids[group] for group in config.network.security_groups]
    for key, (capacity_type, efa) in template_variants(config).items():
        template = resources.launch_templates[key]
        data = launch_template_data(config, capacity_type, security_groups=groups,
                                    instance_profile_arn=resources.instance_profile_arn or "", efa_interfaces=efa)
        [latest] = ec2.describe_launch_template_versions(LaunchTemplateId=template, Versions=["$Latest"])[
            "LaunchTemplateVersions"]
        if latest["LaunchTemplateData"] != data:
            ec2.create_launch_template_version(LaunchTemplateId=template, LaunchTemplateData=data,
                                               VersionDescription=f"{config.ami.family} {config.ami.version} {key}")


def _create_placement_groups(ec2: Any, config: Config, names: ResourceNames, tags: dict[str, str]) -> dict[str, str]:
    """An EFA pool's cluster placement group per zone, as the stack makes them: `pool/zone` → name."""
    groups: dict[str, str] = {}
    for pool in config.node_pools:
        if not pool.efa:
            continue
        for zone in config.zones:
            name = f"{names.prefix}-{pool.name}-{zone}"
            group_tags = {**tags, TAG_NODE_POOL: pool.name, TAG_ZONE: zone}
            ec2.create_placement_group(GroupName=name, Strategy="cluster", TagSpecifications=[
                {"ResourceType": "placement-group", "Tags": _tag_list(group_tags)}])
            groups[placement_group_key(pool.name, zone)] = name
    return groups


def _find_placement_groups(ec2: Any, config: Config) -> dict[str, str]:
    found = _optional(ec2.describe_placement_groups,
                      Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [config.cluster_name]}])
    groups: dict[str, str] = {}
    for group in (found or {}).get("PlacementGroups", []):
        tags = {t["Key"]: t["Value"] for t in group.get("Tags") or []}
        if TAG_NODE_POOL in tags and TAG_ZONE in tags:
            groups[placement_group_key(tags[TAG_NODE_POOL], tags[TAG_ZONE])] = group["GroupName"]
    return groups


def _create_queues(
    sqs: Any, names: ResourceNames, tags: dict[str, str], visibility_timeout: int | None
) -> tuple[dict[str, str], dict[str, str]]:
    urls: dict[str, str] = {}
    arns: dict[str, str] = {}

    def create(logical: str, name: str, attributes: dict[str, str]) -> None:
        attributes = {"SqsManagedSseEnabled": "true", **attributes}
        if name.endswith(".fifo"):
            attributes.update(FifoQueue="true", ContentBasedDeduplication="false")
        urls[logical] = sqs.create_queue(QueueName=name, Attributes=attributes, tags=tags)["QueueUrl"]
        arns[logical] = sqs.get_queue_attributes(QueueUrl=urls[logical], AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]

    for spec in queue_specs(names):
        create(spec.dlq_logical, spec.dlq_name, {"MessageRetentionPeriod": str(FOURTEEN_DAYS)})
        redrive = {"deadLetterTargetArn": arns[spec.dlq_logical], "maxReceiveCount": MAX_RECEIVE_COUNT}
        create(spec.logical, spec.name, {
            "VisibilityTimeout": str(spec.visibility_timeout if visibility_timeout is None else visibility_timeout),
            "RedrivePolicy": json.dumps(redrive),
        })
    create(SCHEDULER_DLQ, names.scheduler_dlq, {"MessageRetentionPeriod": str(FOURTEEN_DAYS)})
    return urls, arns


def _create_table(dynamodb: Any, names: ResourceNames, tags: dict[str, str]) -> None:
    dynamodb.create_table(
        TableName=names.table,
        AttributeDefinitions=[
            {"AttributeName": PARTITION_KEY, "AttributeType": "S"}, {"AttributeName": SORT_KEY, "AttributeType": "S"}
        ],
        KeySchema=[
            {"AttributeName": PARTITION_KEY, "KeyType": "HASH"}, {"AttributeName": SORT_KEY, "KeyType": "RANGE"}
        ],
        BillingMode="PAY_PER_REQUEST",
        SSESpecification={"Enabled": True},
        Tags=_tag_list(tags),
    )
    dynamodb.get_waiter("table_exists").wait(TableName=names.table, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    dynamodb.update_time_to_live(
        TableName=names.table, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
    )
    dynamodb.update_continuous_backups(
        TableName=names.table, PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True}
    )


def _image_ids(config: Config) -> dict[str, str]:
    images = {"x86_64": config.ami.x86_64}
    if config.ami.arm64:
        images["arm64"] = config.ami.arm64
    return images


# ---- discovery ---------------------------------------------------------------------------------------------


def _require(call: Any, what: str, name: str, **kwargs: Any) -> Any:
    try:
        return call(**kwargs)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if "NotFound" in code or "NonExistent" in code or code == "ParameterNotFound":
            raise ResourcesNotFound(f"{what} '{name}' not found at the endpoint (is the stack deployed?)") from error
        raise


def _find_queues(sqs: Any, names: ResourceNames) -> tuple[dict[str, str], dict[str, str]]:
    wanted = {SCHEDULER_DLQ: names.scheduler_dlq}
    for spec in queue_specs(names):
        wanted[spec.logical] = spec.name
        wanted[spec.dlq_logical] = spec.dlq_name
    urls: dict[str, str] = {}
    arns: dict[str, str] = {}
    for logical, name in wanted.items():
        urls[logical] = _require(sqs.get_queue_url, "queue", name, QueueName=name)["QueueUrl"]
        arns[logical] = sqs.get_queue_attributes(QueueUrl=urls[logical], AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
    return urls, arns


def _find_network(ec2: Any, config: Config) -> tuple[str | None, dict[str, str], dict[str, str]]:
    cluster_filter = {"Name": f"tag:{TAG_CLUSTER}", "Values": [config.cluster_name]}
    configured_subnets = list(config.network.subnets.values())
    subnets = ec2.describe_subnets(
        Filters=[cluster_filter, {"Name": "tag-key", "Values": [TAG_EMULATES]}]
    )["Subnets"]
    standins = {_tag(s, TAG_EMULATES): s["SubnetId"] for s in subnets}
    subnet_ids = {c: standins.get(c, c) for c in configured_subnets}
    groups = ec2.describe_security_groups(
        Filters=[cluster_filter, {"Name": "tag-key", "Values": [TAG_EMULATES]}]
    )["SecurityGroups"]
    group_standins = {_tag(g, TAG_EMULATES): g["GroupId"] for g in groups}
    security_groups = {c: group_standins.get(c, c) for c in config.network.security_groups}
    vpc_id = subnets[0]["VpcId"] if subnets else None
    return vpc_id, subnet_ids, security_groups


def _tag(resource: dict[str, Any], key: str) -> str:
    return next((t["Value"] for t in resource.get("Tags", []) if t["Key"] == key), "")


_ABSENT = ("NotFound", "NoSuchEntity", "AccessDenied", "UnauthorizedOperation")


def _optional(call: Any, **kwargs: Any) -> Any:
    """Resources the functions can run without: absent (or not ours to see) is None, not an error."""
    try:
        return call(**kwargs)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if any(marker in code for marker in _ABSENT):
            return None
        raise


def _find_launch_template(ec2: Any, name: str) -> tuple[str, str] | None:
    """(id, `LatestVersionNumber`) of the template named so, as CloudFormation's `Fn::GetAtt` gives them."""
    found = _optional(ec2.describe_launch_templates, LaunchTemplateNames=[name])
    templates = found["LaunchTemplates"] if found else []
    return (str(templates[0]["LaunchTemplateId"]), str(templates[0]["LatestVersionNumber"])) if templates else None


def _find_function_roles(iam: Any, names: ResourceNames) -> dict[str, str]:
    roles: dict[str, str] = {}
    for function in FUNCTIONS:
        if found := _optional(iam.get_role, RoleName=names.role(function)):
            roles[function] = str(found["Role"]["Arn"])
    return roles


def _find_node_identity(iam: Any, names: ResourceNames, region: str) -> tuple[str | None, str | None]:
    found = _optional(iam.get_instance_profile, InstanceProfileName=names.instance_profile(region))
    if not found:
        return None, None
    profile = found["InstanceProfile"]
    roles = profile.get("Roles") or []
    return (roles[0]["Arn"] if roles else None), profile["Arn"]

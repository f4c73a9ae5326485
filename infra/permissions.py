"""IAM statements per capability, so each function's role holds exactly the capabilities its spec lists.

Anything that can change or create EC2 capacity is bound to the ownership tag `gpu-autoscaler/cluster =
<clusterName>`: on existing resources through `aws:ResourceTag`, on launches through `aws:RequestTag` (the
launch template tags every launched resource, see `infra.nodes`). Each wildcard left carries the reason
cdk-nag is told, next to the statement that needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from aws_cdk import aws_iam as iam

from gpu_autoscaler.models.labels import POST_LAUNCH_TAG_KEYS, TAG_CLUSTER

if TYPE_CHECKING:
    from aws_cdk import Stack

    from gpu_autoscaler.config import Config

__all__ = ["EC2_READ_ACTIONS", "Capability", "Ec2Permissions", "PolicyGrant", "Wildcard"]

EC2_READ_ACTIONS = (
    "ec2:DescribeCapacityReservations",
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstances",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSpotPriceHistory",
    "ec2:DescribeSubnets",
)
"""Exactly the Describe calls the functions make (the infrastructure tests compare this with the code);
DescribeSecurityGroups: the fleet checks an EFA pool's security group lets all traffic in from itself."""

_CREATED_BY_LAUNCH = ("fleet", "instance", "volume", "network-interface", "spot-instances-request")


class Capability(StrEnum):
    SEND_LAUNCH = "send-launch"
    """Send LaunchRequests to the launch queue."""
    SEND_DRAIN = "send-drain"
    """Send DrainRequests to the drain queue (the drain function re-enqueues its own progress)."""
    READ_EC2 = "read-ec2"
    """EC2 Describe* calls in the configured region: instance types, offerings, spot prices, reservations."""
    READ_PRICES = "read-prices"
    """The Pricing API and the EC2 service quotas (applied values, and defaults where none is applied)."""
    LAUNCH = "launch"
    """CreateFleet / RunInstances with the ownership tag, pass the node role, and
    eks:DescribeCluster on this cluster for what the nodes' user data needs and the configuration leaves out
    (certificate authority, service CIDR)."""
    OWNED_INSTANCES = "owned-instances"
    """Terminate instances that carry this cluster's ownership tag, and no others."""
    TAG_CLAIMS = "tag-claims"
    """Tag this cluster's instances with their claim and Name after launch (`_tag_claims`, after a request for
    several claims), with those two keys only."""
    KUBERNETES = "kubernetes"
    """eks:DescribeCluster for the endpoint and CA; the bearer token is a presigned sts:GetCallerIdentity."""


@dataclass(frozen=True)
class Wildcard:
    """A cdk-nag AwsSolutions-IAM5 finding this grant causes on purpose, matched by regex, with its reason."""

    pattern: str
    reason: str


@dataclass
class PolicyGrant:
    statements: list[iam.PolicyStatement] = field(default_factory=list)
    wildcards: list[Wildcard] = field(default_factory=list)


class Ec2Permissions:
    """Builds the statements of the AWS-facing capabilities for one stack and configuration."""

    def __init__(self, stack: Stack, config: Config, *, launch_template_ids: list[str],
                 placement_groups: list[str] | None = None) -> None:
        self.stack = stack
        self.config = config
        self.launch_template_ids = launch_template_ids
        self.placement_groups = placement_groups or []
        self.owner = {TAG_CLUSTER: config.cluster_name}

    def grant(self, capability: Capability) -> PolicyGrant:
        builders = {
            Capability.READ_EC2: self.read_ec2,
            Capability.READ_PRICES: self.read_prices,
            Capability.LAUNCH: self.launch,
            Capability.OWNED_INSTANCES: self.owned_instances,
            Capability.TAG_CLAIMS: self.tag_claims,
            Capability.KUBERNETES: self.kubernetes,
        }
        return builders[capability]()

    def _ec2_arn(self, resource: str, name: str, *, account: str | None = None) -> str:
        """`account`: None for the stack's own, `""` for a resource of no account (a public image, its snapshots),
        `"*"` for one another account may own and share with this one."""
        return self.stack.format_arn(service="ec2", resource=resource, resource_name=name, account=account)

    def read_ec2(self) -> PolicyGrant:
        statement = iam.PolicyStatement(
            sid="DescribeEc2",
            actions=list(EC2_READ_ACTIONS),
            resources=["*"],
            conditions={"StringEquals": {"aws:RequestedRegion": self.config.region}},
        )
        return PolicyGrant([statement])

    def read_prices(self) -> PolicyGrant:
        return PolicyGrant(
            [
                iam.PolicyStatement(sid="ReadPrices", actions=["pricing:GetProducts"], resources=["*"]),
                iam.PolicyStatement(
                    sid="ReadEc2Quotas",
                    actions=["servicequotas:GetServiceQuota"],
                    resources=[self.stack.format_arn(service="servicequotas", resource="ec2", resource_name="*")],
                ),
                # A quota with no applied value is read at its AWS default. The Service Authorization Reference
                # lists no resource type for GetAWSDefaultServiceQuota (GetServiceQuota has `quota`), so it
                # cannot be held to the EC2 quotas.
                iam.PolicyStatement(
                    sid="ReadEc2QuotaDefaults", actions=["servicequotas:GetAWSDefaultServiceQuota"], resources=["*"]
                ),
                # The account's use of each quota, from the CloudWatch metric its answer names (AWS/Usage). The
                # Service Authorization Reference lists no resource type for GetMetricData, and no condition key
                # narrows it to a namespace (cloudwatch:namespace applies to PutMetricData only).
                iam.PolicyStatement(sid="ReadQuotaUsage", actions=["cloudwatch:GetMetricData"], resources=["*"]),
            ],
            [
                Wildcard(
                    r"/^Resource::arn:<AWS::Partition>:servicequotas:.*:ec2\/\*$/g",
                    "Only the EC2 service's quotas (vCPU limits per instance family and capacity type); the quota "
                    "codes depend on the families the pools select.",
                )
            ],
        )

    def _cluster_arn(self) -> str:
        return self.stack.format_arn(service="eks", resource="cluster", resource_name=self.config.cluster_name)

    def kubernetes(self) -> PolicyGrant:
        return PolicyGrant([
            iam.PolicyStatement(sid="DescribeCluster", actions=["eks:DescribeCluster"], resources=[self._cluster_arn()])
        ])

    def _owned_instances_wildcard(self) -> Wildcard:
        return Wildcard(
            r"/^Resource::arn:<AWS::Partition>:ec2:.*:instance\/\*$/g",
            "Instance ids are not known in advance; the statement only applies to instances tagged "
            f"{TAG_CLUSTER}={self.config.cluster_name} (aws:ResourceTag condition).",
        )

    def owned_instances(self) -> PolicyGrant:
        statement = iam.PolicyStatement(
            sid="TerminateOwnedInstances",
            actions=["ec2:TerminateInstances"],
            resources=[self._ec2_arn("instance", "*")],
            conditions={"StringEquals": {f"aws:ResourceTag/{TAG_CLUSTER}": self.config.cluster_name}},
        )
        return PolicyGrant([statement], [self._owned_instances_wildcard()])

    def tag_claims(self) -> PolicyGrant:
        """CreateTags after launch, on this cluster's instances and with the keys the fleet then writes only
        (`adapters.aws.fleet._tag_claims`). Without `aws:TagKeys` it could rewrite the very tag `aws:ResourceTag`
        authorizes on, handing an instance to another cluster's garbage collector (or, with Karpenter's tags, to
        Karpenter). ForAllValues: every key of the request is one of these (IAM User Guide, "Controlling access
        during AWS requests" and "Single-valued vs. multivalued condition keys"); Karpenter's
        AllowScopedResourceTagging holds its own post-launch tagging to its keys the same way (karpenter-provider-aws
        website/.../getting-started-with-karpenter/cloudformation.yaml). Tagging at launch is `launch`'s
        `TagOnLaunch` (ec2:CreateAction)."""
        statement = iam.PolicyStatement(
            sid="TagOwnedInstancesWithTheirClaim",
            actions=["ec2:CreateTags"],
            resources=[self._ec2_arn("instance", "*")],
            conditions={"StringEquals": {f"aws:ResourceTag/{TAG_CLUSTER}": self.config.cluster_name},
                        "ForAllValues:StringEquals": {"aws:TagKeys": list(POST_LAUNCH_TAG_KEYS)}},
        )
        return PolicyGrant([statement], [self._owned_instances_wildcard()])

    def teardown(self) -> PolicyGrant:
        """The deletion hook's (`infra.teardown`): list this cluster's instances, terminate only those carrying its
        ownership tag (`owned_instances`), and read this stack's status, the stack named by its own id."""
        owned = self.owned_instances()
        return PolicyGrant(
            [
                iam.PolicyStatement(
                    sid="DescribeInstances",
                    actions=["ec2:DescribeInstances"],
                    resources=["*"],
                    conditions={"StringEquals": {"aws:RequestedRegion": self.config.region}},
                ),
                *owned.statements,
                iam.PolicyStatement(
                    sid="ReadOwnStack", actions=["cloudformation:DescribeStacks"], resources=[self.stack.stack_id]
                ),
            ],
            owned.wildcards,
        )

    def launch(self) -> PolicyGrant:
        created = [self._ec2_arn(kind, "*") for kind in _CREATED_BY_LAUNCH]
        launch_templates = [self._ec2_arn("launch-template", t) for t in self.launch_template_ids]
        # Subnets, security groups and capacity reservations may be another account's, shared with this one: a
        # shared VPC's subnets and groups (VPC User Guide, "Share your VPC subnets with other accounts") and a
        # reservation shared through AWS RAM (EC2 User Guide, "Shared Capacity Reservations") keep their owner's
        # account in their ARN, and RunInstances authorizes them by that ARN. Named by id, in any account
        # (Karpenter's policy allows `arn:...:ec2:<region>:*:subnet/*` likewise).
        used = [
            *launch_templates,
            *(self._ec2_arn("subnet", subnet, account="*") for subnet in sorted(self.config.network.subnets.values())),
            *(self._ec2_arn("security-group", group, account="*") for group in self.config.network.security_groups),
            *(self._ec2_arn("image", ami, account="") for ami in self._amis()),
            *(self._ec2_arn("capacity-reservation", cr, account="*") for cr in self._reservations()),
            self._ec2_arn("snapshot", "*", account=""),
            *(self._ec2_arn("placement-group", group) for group in self.placement_groups),
            *([self._ec2_arn("image", "*", account="")] if self._followed_images() else []),
        ]
        statements = [
            iam.PolicyStatement(
                sid="LaunchTaggedCapacity",
                actions=["ec2:CreateFleet", "ec2:RunInstances"],
                resources=created,
                conditions={"StringEquals": {f"aws:RequestTag/{TAG_CLUSTER}": self.config.cluster_name}},
            ),
            iam.PolicyStatement(
                sid="LaunchFromConfiguredResources",
                actions=["ec2:CreateFleet", "ec2:RunInstances"],
                resources=used,
            ),
            iam.PolicyStatement(
                sid="TagOnLaunch",
                actions=["ec2:CreateTags"],
                resources=created,
                conditions={
                    "StringEquals": {
                        "ec2:CreateAction": ["CreateFleet", "RunInstances"],
                        f"aws:RequestTag/{TAG_CLUSTER}": self.config.cluster_name,
                    }
                },
            ),
            iam.PolicyStatement(
                sid="PassNodeRole",
                actions=["iam:PassRole"],
                resources=[self.config.node_role],
                # EC2's service principal is ec2.amazonaws.com.cn in the China partition (AWS's managed
                # AWSEC2FleetServiceRolePolicy and Karpenter's controller policy list both).
                conditions={"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}},
            ),
            *self._spot_service_linked_role(),
            iam.PolicyStatement(
                sid="ReadNodeBootstrap",
                actions=["eks:DescribeCluster"],
                resources=[self._cluster_arn()],
            ),
        ]
        wildcards = [
            Wildcard(
                r"/^Resource::arn:<AWS::Partition>:ec2:.*:(fleet|instance|volume|network-interface|"
                r"spot-instances-request)\/\*$/g",
                "These resources are created by the call itself, so their ids cannot be named; CreateFleet, "
                f"RunInstances and CreateTags on them require the request to carry {TAG_CLUSTER}="
                f"{self.config.cluster_name} (aws:RequestTag), and tagging only as part of the launch "
                "(ec2:CreateAction).",
            ),
            Wildcard(
                r"/^Resource::arn:<AWS::Partition>:ec2:.*:\*:(subnet|security-group|capacity-reservation)\/"
                r"[a-z]+-[0-9a-f]+$/g",
                "The configured subnets, security groups and capacity reservations, each named by id, may belong "
                "to the account that shares them (a shared VPC, a reservation shared through AWS RAM), whose id "
                "is in their ARN: any account, not any resource.",
            ),
            Wildcard(
                r"/^Resource::arn:<AWS::Partition>:ec2:.*::snapshot\/\*$/g",
                "RunInstances authorizes the EBS snapshots behind the pinned AMIs; they belong to the AMI "
                "publisher and their ids are not in the configuration. The AMIs themselves are named.",
            ),
        ]
        followed = self._followed_images()
        if followed:
            # EC2 resolves `resolve:ssm:` image ids with the caller's permissions (EC2 User Guide, "Use a
            # Systems Manager parameter instead of an AMI ID"). AWS's public parameters (`/aws/service/...`) have
            # no account in their ARN; one the account owns has its own (Service Authorization Reference, Systems
            # Manager, resource type `parameter`).
            statements.append(iam.PolicyStatement(
                sid="ResolveLatestImages", actions=["ssm:GetParameters"],
                resources=[self.stack.format_arn(
                    service="ssm", resource="parameter", resource_name=name.lstrip("/"),
                    account="" if name.startswith("/aws/service/") else self.stack.account) for name in followed],
            ))
            wildcards.append(Wildcard(
                r"/^Resource::arn:<AWS::Partition>:ec2:.*::image\/\*$/g",
                "A pool follows the latest AMI (version 'latest', resolve:ssm: image ids): its image id is only "
                "known when EC2 resolves the parameter at launch.",
            ))
        return PolicyGrant(statements, wildcards)

    def _spot_service_linked_role(self) -> list[iam.PolicyStatement]:
        """The first Spot launch in an account creates `AWSServiceRoleForEC2Spot` on the caller's behalf; without
        this, EC2 answers `AuthFailure.ServiceLinkedRoleCreationNotPermitted` (EC2 User Guide, "Service-linked role
        for Spot Instance requests"). Only that role, only for spot.amazonaws.com, only if a pool may use Spot."""
        if not any("spot" in pool.capacity_types for pool in self.config.node_pools):
            return []
        role = self.stack.format_arn(service="iam", region="", resource="role",
                                     resource_name="aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot")
        return [iam.PolicyStatement(
            sid="CreateSpotServiceLinkedRole",
            actions=["iam:CreateServiceLinkedRole"],
            resources=[role],
            conditions={"StringEquals": {"iam:AWSServiceName": "spot.amazonaws.com"}},
        )]

    def _followed_images(self) -> list[str]:
        """The SSM parameters of images that follow the latest release (`resolve:ssm:<parameter>`)."""
        amis = [self.config.ami, *(pool.ami for pool in self.config.node_pools if pool.ami)]
        ids = [i for ami in amis for i in (ami.x86_64, ami.arm64) if i and i.startswith("resolve:ssm:")]
        return list(dict.fromkeys(i.removeprefix("resolve:ssm:") for i in ids))

    def _amis(self) -> list[str]:
        """Every pinned image a launch may use: the global one and the pools' own (`resolve:ssm:` ids
        name no image in advance)."""
        amis = [self.config.ami, *(pool.ami for pool in self.config.node_pools if pool.ami)]
        images = [i for ami in amis for i in (ami.x86_64, ami.arm64) if i and i.startswith("ami-")]
        return list(dict.fromkeys(images))

    def _reservations(self) -> list[str]:
        return sorted({cr.id for pool in self.config.node_pools for cr in pool.capacity_reservations})

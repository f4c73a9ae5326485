"""The preflight checks of `gpu-autoscaler doctor`: one function per check, each returning pass / warn / fail lines.

Each check reads the account (EC2, IAM, EKS, KMS, Service Quotas) through boto3 clients and compares it with the
configuration; none changes anything. A check that cannot read what it needs warns and says why, so a missing
permission or an API the emulator lacks never ends in a traceback. The fix names the command or setting to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.adapters.aws.catalog import unusable_reason
from gpu_autoscaler.adapters.aws.service_quotas import ServiceQuotasSource
from gpu_autoscaler.domain.packing.index import BY_OFFERING, type_allowed
from gpu_autoscaler.domain.packing.quotas import QUOTA_CODES, quota_group, quota_keys
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.naming import FUNCTIONS, FUNCTIONS_KUBERNETES_GROUP, ResourceNames

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.config import Config, NodePool
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.models.catalog import InstanceType

__all__ = ["CHECKS", "FUNCTIONS_RBAC", "Check", "DoctorContext", "run_checks"]

Status = Literal["pass", "warn", "fail"]
SPOT_ROLE = "AWSServiceRoleForEC2Spot"
AWS_MANAGED_EBS_KEY = "alias/aws/ebs"
EBS_KEY_ACTIONS = ("kms:CreateGrant", "kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKeyWithoutPlaintext",
                   "kms:ReEncrypt*")
"""What a principal launching instances with volumes under a customer managed key needs of it (EBS creates a
grant for each volume)."""
FUNCTIONS_RBAC = "agent/deploy/functions-rbac.yaml"
"""What binds `FUNCTIONS_KUBERNETES_GROUP` to the requests the functions make in the cluster."""
CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"
"""The one EKS access policy that covers what the functions do (access-policy-reference.adoc: `*` on `*`)."""
NODE_ROLE_POLICIES = (("AmazonEKSWorkerNodePolicy",),
                      ("AmazonEC2ContainerRegistryPullOnly", "AmazonEC2ContainerRegistryReadOnly"),
                      ("AmazonEKS_CNI_Policy",))
"""The AWS managed policies a node role needs, each line one need and the policies that meet it (EKS User Guide,
create-node-role.adoc: the kubelet's EC2 reads and ECR pulls "before you can launch nodes and register them", and
the VPC CNI's unless aws-node has a role of its own; Karpenter's getting-started cloudformation.yaml attaches these
three and AmazonSSMManagedInstanceCore)."""
CNI_POLICY = NODE_ROLE_POLICIES[2][0]
OPEN_TO_ALL = "0.0.0.0/0"
"""publicAccessCidrs that admit every address (and EKS's default: VpcConfigRequest)."""


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def as_json(self) -> dict[str, str]:
        return {"check": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class DoctorContext:
    """What the checks read: the configuration, clients at the account, and how its ids map there."""

    config: Config
    clients: AwsClients
    catalog: Catalog | None
    subnet_ids: dict[str, str] = field(default_factory=dict)
    """Configuration subnet id → the account's (identity on AWS; the emulator's stand-ins otherwise)."""
    security_group_ids: dict[str, str] = field(default_factory=dict)
    instance_profile: str | None = None
    """The stack's instance profile name, when the stack is deployed (checked if present)."""

    def subnet(self, configured: str) -> str:
        return self.subnet_ids.get(configured, configured)

    def security_group(self, configured: str) -> str:
        return self.security_group_ids.get(configured, configured)

    def candidates(self, pool: NodePool) -> list[InstanceType]:
        """GPU instance types the pool's requirements allow, read as the packer reads them: on a node's labels (its
        type's, its OS, the pool's own labels and name), with requirements on the zone and the capacity type left to
        the offerings (`offering_allowed`)."""
        if self.catalog is None:
            return []
        return [t for t in self.catalog.instance_types() if t.gpus > 0 and type_allowed(pool, t)]


def offering_allowed(pool: NodePool, zone: str, capacity_type: str) -> bool:
    """Whether the pool's requirements on the zone and the capacity type allow an offering there."""
    labels = {L.ZONE: zone, L.CAPACITY_TYPE: capacity_type}
    return all(r.matches(labels) for r in pool.requirements if r.key in BY_OFFERING)


def _code(error: Exception) -> str:
    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code", "ClientError"))
    return type(error).__name__


# ---- the checks --------------------------------------------------------------------------------------------


def check_offerings(ctx: DoctorContext) -> list[Check]:
    """Each pool's instance types are offered in its zones, for its capacity types."""
    if ctx.catalog is None:
        return [Check("offerings", "warn", "the catalog could not be read", "see the error above; rerun with -v")]
    results = []
    zones = ctx.config.zones
    for pool in ctx.config.node_pools:
        names = {t.name for t in ctx.candidates(pool)}
        wanted = {c for c in pool.capacity_types if c != "reserved"}
        offered = {o.zone for o in ctx.catalog.offerings() if o.instance_type in names and o.capacity_type in wanted
                   and offering_allowed(pool, o.zone, o.capacity_type)}
        missing = [z for z in zones if z not in offered and any(offering_allowed(pool, z, c) for c in wanted)]
        if not names:
            results.append(Check(f"offerings {pool.name}", "fail", "no GPU instance type meets the pool's "
                                 "requirements in this region", "widen nodePools[].requirements"))
        elif not offered:
            results.append(Check(f"offerings {pool.name}", "fail" if wanted else "pass",
                                 f"none of {len(names)} types offered in {', '.join(zones)}" if wanted else
                                 "reserved capacity only (checked with the reservations)",
                                 "add subnets in zones that offer them, or widen the requirements"))
        else:
            results.append(Check(
                f"offerings {pool.name}", "warn" if missing else "pass",
                f"{len(names)} types; offered in {', '.join(sorted(offered))}" +
                (f"; none in {', '.join(missing)}" if missing else ""),
                "drop those zones' subnets or widen the requirements" if missing else ""))
    return results


def check_quotas(ctx: DoctorContext) -> list[Check]:
    """vCPU quotas (G/VT and P, On-Demand and Spot) against what each pool's GPU limit can launch, each with the
    account's usage of it (its CloudWatch usage metric, as the packer reads it); and, for every pool, a warning where
    what the account's other instances use (the usage less this cluster's running instances, by their ownership tag)
    leaves less than the pool's smallest GPU type of the quota: none of its nodes could launch there."""
    source = ServiceQuotasSource(_client(ctx, "service-quotas"), ctx.config.vcpu_quotas,
                                 cloudwatch_client=_client(ctx, "cloudwatch"))
    quotas = source.vcpu_quotas()
    usage = {key: reading.vcpus for key, reading in source.vcpu_usage().items()}
    ours = _our_vcpus(ctx) if usage else {}
    results = []
    for pool in ctx.config.node_pools:
        results.extend(_room_left(ctx, pool, quotas, usage, ours))
        if pool.limits.gpus is None:
            results.append(Check(f"vCPU quota {pool.name}", "pass", "no GPU limit on the pool: quotas bound it"))
            continue
        for capacity in sorted({"on-demand" if c == "reserved" else c for c in pool.capacity_types}):
            types = [t for t in ctx.candidates(pool) if t.gpus >= 1]
            if not types:
                continue
            groups = {quota_group(t) for t in types}
            for group in sorted(groups):
                per_gpu = max(t.vcpu / t.gpus for t in types if quota_group(t) == group)
                need = int(per_gpu * pool.limits.gpus)
                key = f"{group}/{capacity}"
                have = quotas.get(key)
                code = QUOTA_CODES.get(key, "?")
                name = f"vCPU quota {pool.name} {key}"
                if have is None:
                    results.append(Check(name, "warn", f"unknown (Service Quotas {code} not readable); the pool's "
                                         f"limit of {pool.limits.gpus} GPUs needs up to {need} vCPUs",
                                         f'set "vcpuQuotas": {{"{key}": N}} or allow servicequotas:GetServiceQuota '
                                         "and GetAWSDefaultServiceQuota"))
                elif have < need:
                    results.append(Check(name, "fail", f"{have} vCPUs; the pool's limit of {pool.limits.gpus} GPUs "
                                         f"needs up to {need}",
                                         f"aws service-quotas request-service-quota-increase --service-code ec2 "
                                         f"--quota-code {code} --desired-value {need}"))
                else:
                    used = f"; {usage[key]} in use in the account" if key in usage else ""
                    results.append(Check(name, "pass", f"{have} vCPUs ≥ {need} for {pool.limits.gpus} GPUs{used}"))
    return results


def _client(ctx: DoctorContext, service: str) -> Any:
    try:
        return ctx.clients.client(service)
    except (BotoCoreError, ClientError):
        return None


def _room_left(ctx: DoctorContext, pool: NodePool, quotas: dict[str, int], usage: dict[str, int],
               ours: dict[str, int]) -> list[Check]:
    """A warning per quota of the pool where the account's other instances leave less than its smallest type."""
    out = []
    types = [t for t in ctx.candidates(pool) if t.gpus >= 1]
    smallest: dict[str, InstanceType] = {}
    for capacity in pool.capacity_types:  # a reserved instance counts against On-Demand (`quota_keys`)
        for t in types:
            key = quota_keys(t, capacity)[0]
            if key not in smallest or t.vcpu < smallest[key].vcpu:
                smallest[key] = t
    for key, t in sorted(smallest.items()):
        if key not in quotas or key not in usage:
            continue
        others = max(0, usage[key] - ours.get(key, 0))
        left = quotas[key] - others
        if left < t.vcpu:
            out.append(Check(
                f"vCPU quota {pool.name} {key} room", "warn",
                f"{others} of {quotas[key]} vCPUs in use by the account's other instances: {left} left, less "
                f"than the pool's smallest type ({t.name}, {t.vcpu} vCPUs)",
                f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
                f"{QUOTA_CODES.get(key, '?')} --desired-value {others + t.vcpu}, or free what the others use"))
    return out


def _our_vcpus(ctx: DoctorContext) -> dict[str, int]:
    """vCPUs per quota key of this cluster's pending and running instances (by the ownership tag); none when EC2
    cannot be read (the others' use is then the account's whole usage: a warning may come early, never late)."""
    out: dict[str, int] = {}
    ec2 = _client(ctx, "ec2")
    if ctx.catalog is None or ec2 is None:
        return out
    try:
        pages = ec2.get_paginator("describe_instances").paginate(Filters=[
            {"Name": f"tag:{L.TAG_CLUSTER}", "Values": [ctx.config.cluster_name]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        for page in pages:
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    t = ctx.catalog.get(instance["InstanceType"])
                    if t is not None:
                        spot = instance.get("InstanceLifecycle") == "spot"
                        key = quota_keys(t, "spot" if spot else "on-demand")[0]
                        out[key] = out.get(key, 0) + t.vcpu
    except (BotoCoreError, ClientError):
        return {}
    return out


def check_spot_role(ctx: DoctorContext) -> list[Check]:
    """EC2 needs its Spot service-linked role before the first Spot launch of an account."""
    if not any("spot" in p.capacity_types for p in ctx.config.node_pools):
        return [Check("spot service-linked role", "pass", "no pool launches Spot")]
    try:
        ctx.clients.client("iam").get_role(RoleName=SPOT_ROLE)
    except ClientError as error:
        if _code(error) == "NoSuchEntity":
            return [Check("spot service-linked role", "fail", f"{SPOT_ROLE} does not exist",
                          "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com")]
        return [Check("spot service-linked role", "warn", f"cannot read ({_code(error)})", "allow iam:GetRole")]
    return [Check("spot service-linked role", "pass", f"{SPOT_ROLE} exists")]


def check_subnets(ctx: DoctorContext) -> list[Check]:
    """Each subnet has addresses for at least the largest node's pods (VPC CNI: one address per pod)."""
    need = max((t.max_pods for p in ctx.config.node_pools for t in ctx.candidates(p)), default=110)
    results = []
    ec2 = ctx.clients.client("ec2")
    for zone, configured in sorted(ctx.config.network.subnets.items()):
        try:
            [subnet] = ec2.describe_subnets(SubnetIds=[ctx.subnet(configured)])["Subnets"]
        except ClientError as error:
            results.append(Check(f"subnet {zone}", "fail", f"{configured}: {_code(error)}",
                                 "fix network.subnets in the configuration"))
            continue
        free = int(subnet["AvailableIpAddressCount"])
        if subnet["AvailabilityZone"] != zone:
            results.append(Check(f"subnet {zone}", "fail", f"{configured} is in {subnet['AvailabilityZone']}",
                                 "map each zone to a subnet in that zone"))
        elif free < need:
            results.append(Check(f"subnet {zone}", "fail", f"{free} free addresses < {need} pods of the largest node",
                                 "use a larger subnet, or turn on prefixDelegation"))
        else:
            results.append(Check(f"subnet {zone}", "pass", f"{subnet['SubnetId']}: {free} free addresses "
                                 f"(≥ {need}, the largest node's max pods)"))
    return results


def check_amis(ctx: DoctorContext) -> list[Check]:
    """The configured AMIs exist, have their architecture, and carry the pinned version in their name."""
    ami = ctx.config.ami
    results = []
    for architecture, image_id in (("x86_64", ami.x86_64), ("arm64", ami.arm64)):
        if image_id is None:
            continue
        try:
            images = ctx.clients.client("ec2").describe_images(ImageIds=[image_id])["Images"]
        except ClientError as error:
            images, reason = [], _code(error)
        else:
            reason = "not found"
        name = f"AMI {architecture}"
        if not images:
            results.append(Check(name, "fail", f"{image_id}: {reason}",
                                 "aws ssm get-parameter --name /aws/service/eks/optimized-ami/<k8s version>/"
                                 "amazon-linux-2023/x86_64/nvidia/recommended/image_id"))
            continue
        image = images[0]
        if image.get("Architecture") != architecture:
            results.append(Check(name, "fail", f"{image_id} is {image.get('Architecture')}",
                                 f"set ami.{architecture} to an {architecture} image"))
        elif ami.version not in (image.get("Name") or ""):
            results.append(Check(name, "warn",
                                 f"{image_id} ({image.get('Name')}) does not name version {ami.version}",
                                 "set ami.version to the image's release, so drift is visible"))
        else:
            results.append(Check(name, "pass", f"{image_id} {image.get('Name')}"))
    return results


def check_node_identity(ctx: DoctorContext) -> list[Check]:
    """The node role exists, trusts EC2 and holds the policies nodes need; the stack's instance profile (once
    deployed) holds it."""
    role_name = ctx.config.node_role.rsplit("/", 1)[1]
    iam = ctx.clients.client("iam")
    try:
        role = iam.get_role(RoleName=role_name)["Role"]
    except ClientError as error:
        return [Check("node role", "fail", f"{role_name}: {_code(error)}",
                      "create the node role (EKS User Guide, create-node-role.adoc: trusted by ec2.amazonaws.com, "
                      f"with {', '.join(p[0] for p in NODE_ROLE_POLICIES)})")]
    trust = str(role.get("AssumeRolePolicyDocument", ""))
    results = [Check("node role", "pass" if "ec2.amazonaws.com" in trust else "fail", role["Arn"],
                     "" if "ec2.amazonaws.com" in trust else "let ec2.amazonaws.com assume the role"),
               _node_role_policies(ctx, iam, role_name)]
    if ctx.instance_profile:
        try:
            profile = iam.get_instance_profile(InstanceProfileName=ctx.instance_profile)["InstanceProfile"]
            holds = any(r["RoleName"] == role_name for r in profile.get("Roles", []))
            results.append(Check("instance profile", "pass" if holds else "fail", ctx.instance_profile,
                                 "" if holds else f"add {role_name} to the instance profile (cdk deploy does)"))
        except ClientError as error:
            results.append(Check("instance profile", "warn", f"{ctx.instance_profile}: {_code(error)}",
                                 "cdk deploy creates it"))
    return results


def _node_role_policies(ctx: DoctorContext, iam: Any, role_name: str) -> Check:
    """The node role's attached AWS managed policies against `NODE_ROLE_POLICIES`. A missing one warns, not
    fails: an inline or customer managed policy may grant the same, which doctor does not read."""
    try:
        attached = {p["PolicyArn"] for page in iam.get_paginator("list_attached_role_policies").paginate(
            RoleName=role_name) for p in page["AttachedPolicies"]}
        managed = {arn.rsplit("/", 1)[1] for arn in attached if arn.split(":")[4] == "aws"}
        missing = [need for need in NODE_ROLE_POLICIES if not managed.intersection(need)]
        inline = [] if not missing else [name for page in iam.get_paginator("list_role_policies").paginate(
            RoleName=role_name) for name in page["PolicyNames"]]
    except (ClientError, BotoCoreError) as error:
        return Check("node role policies", "warn", f"{role_name}: cannot list its policies ({_code(error)})",
                     "allow iam:ListAttachedRolePolicies and iam:ListRolePolicies")
    if not missing:
        return Check("node role policies", "pass", ", ".join(sorted(managed & {p for need in NODE_ROLE_POLICIES
                                                                               for p in need})))
    partition = ctx.config.node_role.split(":")[1]
    names = [" or ".join(need) + (" (unless aws-node has a role of its own: IRSA or EKS Pod Identity)"
                                  if need[0] == CNI_POLICY else "") for need in missing]
    detail = f"{role_name} has no {'; no '.join(names)}: without them nodes launch and are billed but do not " \
             "register, or stay NotReady"
    if inline:
        detail += f"; its inline policies {', '.join(inline)} may grant the same (doctor does not read them)"
    return Check("node role policies", "warn", detail, "; ".join(
        f"aws iam attach-role-policy --role-name {role_name} --policy-arn arn:{partition}:iam::aws:policy/{need[0]}"
        for need in missing))


def _describe_cluster(ctx: DoctorContext) -> dict[str, Any]:
    """DescribeCluster's `cluster` (EKS API reference: `accessConfig`, `resourcesVpcConfig`, ...)."""
    return dict(ctx.clients.client("eks").describe_cluster(name=ctx.config.cluster_name)["cluster"])


def _authentication_mode(ctx: DoctorContext) -> str | None:
    """CONFIG_MAP, API_AND_CONFIG_MAP or API (grant-k8s-access.adoc, "Set Cluster Authentication Mode"); None when
    DescribeCluster cannot be read or does not say."""
    try:
        mode = _describe_cluster(ctx).get("accessConfig", {}).get("authenticationMode")
    except (ClientError, BotoCoreError):
        return None
    return str(mode) if mode else None


def _access_entries(ctx: DoctorContext) -> list[str]:
    eks = ctx.clients.client("eks")
    entries: list[str] = []
    for page in eks.get_paginator("list_access_entries").paginate(clusterName=ctx.config.cluster_name):
        entries += page["accessEntries"]
    return entries


def _function_roles(ctx: DoctorContext) -> dict[str, str] | None:
    """The deployed stack's `<Function>RoleArn` outputs (the functions that reach Kubernetes); None before a
    deploy."""
    try:
        [stack] = ctx.clients.client("cloudformation").describe_stacks(StackName=ResourceNames(
            ctx.config.cluster_name).stack)["Stacks"]
    except ClientError as error:
        if "does not exist" in str(error):
            return None
        raise
    functions = {f"{name.title()}RoleArn" for name in FUNCTIONS}  # not AgentRoleArn: the agent needs no entry
    return {o["OutputKey"].removesuffix("RoleArn"): o["OutputValue"] for o in stack.get("Outputs", [])
            if o["OutputKey"] in functions}


def check_function_access(ctx: DoctorContext) -> list[Check]:
    """After a deploy, each function that reaches Kubernetes has an access entry that lets it do what it does: in
    the group `FUNCTIONS_KUBERNETES_GROUP` (bound by `FUNCTIONS_RBAC`), or with AmazonEKSClusterAdminPolicy on the
    cluster. An entry alone is no permission (EKS User Guide, grant-k8s-access.adoc, "Create access entries": without
    `--kubernetes-groups` or an access policy, only the API discovery roles' permissions)."""
    roles = _function_roles(ctx)
    if roles is None:
        return [Check("EKS access entries (functions)", "pass", "stack not deployed yet: run doctor again after "
                      "cdk deploy to check the functions' roles")]
    try:
        entries = set(_access_entries(ctx))
    except (ClientError, BotoCoreError) as error:
        return [Check("EKS access entries (functions)", "warn", f"cannot list access entries ({_code(error)})",
                      f"map the stack's …RoleArn outputs to the group {FUNCTIONS_KUBERNETES_GROUP} in aws-auth and "
                      f"kubectl apply -f {FUNCTIONS_RBAC}, or allow eks:ListAccessEntries")]
    # Without the stack's entries (kubernetes.eksAccess false) the roles may be mapped in aws-auth instead, which
    # doctor cannot read and only an API-only cluster ignores.
    mode = None if ctx.config.kubernetes.eks_access or set(roles.values()) <= entries else \
        _authentication_mode(ctx) or "unknown"
    checks = [_function_entry(ctx, name, arn, arn in entries, mode) for name, arn in sorted(roles.items())]
    if all(c.status == "pass" for c in checks):
        return [Check("EKS access entries (functions)", "pass", ", ".join(sorted(roles)))]
    return [c for c in checks if c.status != "pass"]


def _function_entry(ctx: DoctorContext, name: str, arn: str, listed: bool, mode: str | None) -> Check:
    """One function role's access entry: its type, its groups and its access policies. `mode`: the cluster's
    authentication mode where an unlisted role may be mapped in aws-auth instead (None: the stack makes entries)."""
    check = f"EKS access entry {name}"
    cluster = ctx.config.cluster_name
    rbac = f"kubectl apply -f {FUNCTIONS_RBAC}"
    create = (f"aws eks create-access-entry --cluster-name {cluster} --principal-arn {arn} --type STANDARD "
              f"--kubernetes-groups {FUNCTIONS_KUBERNETES_GROUP}, then {rbac}")
    if not listed:
        if mode is not None and mode != "API":
            return Check(check, "warn", f"{arn} has no access entry; authentication mode {mode} also reads the "
                         "aws-auth ConfigMap, which doctor cannot read: the function gets in if it maps the role "
                         f"to the group {FUNCTIONS_KUBERNETES_GROUP}", f"map it there, then {rbac}; or {create}")
        if mode is None:
            return Check(check, "fail", f"{arn} has no access entry", "cdk deploy: the stack makes it while "
                         "kubernetes.eksAccess is on (delete an entry made by hand for the role first, CloudFormation "
                         f"cannot create one that exists), then {rbac}")
        return Check(check, "fail", f"{arn} has no access entry (authentication mode API reads no aws-auth)", create)
    eks = ctx.clients.client("eks")
    try:
        entry = eks.describe_access_entry(clusterName=cluster, principalArn=arn)["accessEntry"]
        policies = [p for page in eks.get_paginator("list_associated_access_policies").paginate(
            clusterName=cluster, principalArn=arn) for p in page["associatedAccessPolicies"]] \
            if entry.get("type") == "STANDARD" else []
    except (ClientError, BotoCoreError) as error:
        return Check(check, "warn", f"{arn}: cannot read its access entry ({_code(error)})",
                     "allow eks:DescribeAccessEntry and eks:ListAssociatedAccessPolicies")
    if entry.get("type") != "STANDARD":
        # grant-k8s-access.adoc: only a STANDARD entry takes groups or access policies, and a type cannot change.
        return Check(check, "fail", f"{arn}: its access entry is of type {entry.get('type')}, which takes no "
                     "Kubernetes groups and no access policies",
                     f"aws eks delete-access-entry --cluster-name {cluster} --principal-arn {arn}, then {create}")
    groups = list(entry.get("kubernetesGroups", []))
    if FUNCTIONS_KUBERNETES_GROUP in groups or any(
            _policy_name(p) == CLUSTER_ADMIN_POLICY and p["accessScope"]["type"] == "cluster" for p in policies):
        return Check(check, "pass", arn)
    update = (f"aws eks update-access-entry --cluster-name {cluster} --principal-arn {arn} --kubernetes-groups "
              f"{' '.join([*groups, FUNCTIONS_KUBERNETES_GROUP])}, then {rbac}")
    if not groups and not policies:
        return Check(check, "fail", f"{arn}: its access entry has no Kubernetes group and no access policy, so it "
                     "allows API discovery only: every request of the function is refused", update)
    held = [f"groups {', '.join(groups)} (doctor cannot see the RBAC that binds them)"] if groups else []
    held += [f"{_policy_name(p)} ({_scope(p)})" for p in policies]
    return Check(check, "warn", f"{arn}: {'; '.join(held)}: EKS's Edit, Admin and View access policies grant "
                 "nothing on nodes, PersistentVolumes or VolumeAttachments, and a namespace scope nothing on "
                 "cluster-wide resources, which the function patches, deletes and reads", update)


def _policy_name(policy: dict[str, Any]) -> str:
    return str(policy["policyArn"]).rsplit("/", 1)[-1]


def _scope(policy: dict[str, Any]) -> str:
    scope = policy["accessScope"]
    return "cluster" if scope["type"] == "cluster" else f"namespaces {', '.join(scope.get('namespaces', []))}"


def check_access_entries(ctx: DoctorContext) -> list[Check]:
    """The node role may join the cluster: an EKS access entry of type EC2_LINUX, or an aws-auth mapping where the
    authentication mode reads aws-auth (grant-k8s-access.adoc: EC2_LINUX is the type for "Linux or Bottlerocket
    self-managed nodes", whose username is system:node:{{EC2PrivateDNSName}}; a STANDARD entry cannot make the
    kubelet a node, and an entry's type cannot change)."""
    name = "EKS access entry (node role)"
    role, cluster = ctx.config.node_role, ctx.config.cluster_name
    create = f"aws eks create-access-entry --cluster-name {cluster} --principal-arn {role} --type EC2_LINUX"
    # auth-configmap.adoc: a node role's mapping; an ARN there cannot include a path.
    aws_auth = (f"map it in the aws-auth ConfigMap: rolearn {role.split(':role/')[0]}:role/{role.rsplit('/', 1)[1]}, "
                "username system:node:{{EC2PrivateDNSName}}, groups system:bootstrappers and system:nodes")
    mode = _authentication_mode(ctx)
    if mode == "CONFIG_MAP":
        return [Check(name, "warn", f"{role}: authentication mode CONFIG_MAP, so nodes join through the aws-auth "
                      "ConfigMap alone, which doctor cannot read", aws_auth)]
    try:
        entries = _access_entries(ctx)
    except (ClientError, BotoCoreError) as error:
        return [Check(name, "warn", f"cannot list access entries ({_code(error)}); "
                      "if the cluster uses the aws-auth ConfigMap, map the node role there", create)]
    if role not in entries:
        if mode == "API":
            return [Check(name, "fail", f"{role} has no access entry, and authentication mode API reads no aws-auth",
                          create)]
        return [Check(name, "warn", f"{role} has no access entry; authentication mode {mode or 'unknown'} also "
                      "reads the aws-auth ConfigMap, which doctor cannot read: nodes join if it maps the role",
                      f"{create} (or {aws_auth})")]
    try:
        entry_type = ctx.clients.client("eks").describe_access_entry(
            clusterName=cluster, principalArn=role)["accessEntry"].get("type")
    except (ClientError, BotoCoreError) as error:
        return [Check(name, "warn", f"{role}: cannot read its access entry ({_code(error)})",
                      "allow eks:DescribeAccessEntry")]
    if entry_type == "EC2_LINUX":
        return [Check(name, "pass", f"{role} (EC2_LINUX)")]
    return [Check(name, "fail", f"{role}: its access entry is of type {entry_type}, not EC2_LINUX: the kubelet "
                  "is not made a node (system:nodes), so nodes launch and are billed but never register",
                  f"aws eks delete-access-entry --cluster-name {cluster} --principal-arn {role}, then {create}")]


def check_cluster_access(ctx: DoctorContext) -> list[Check]:
    """The functions reach the cluster's API: they run outside any VPC, so only over the public endpoint, from
    addresses no fixed list holds (EKS User Guide, cluster-endpoint.adoc: with public access off, "All traffic to
    your cluster API server must come from within your cluster's VPC or a connected network"; with CIDR blocks,
    "the public API server endpoint will only receive requests from the listed blocks"). And the authentication
    mode takes the stack's access entries (`kubernetes.eksAccess`; grant-k8s-access.adoc: access entries need API
    or API_AND_CONFIG_MAP)."""
    cluster = ctx.config.cluster_name
    try:
        described = _describe_cluster(ctx)
    except (ClientError, BotoCoreError) as error:
        if _code(error) == "ResourceNotFoundException":
            return [Check("cluster endpoint", "fail", f"no EKS cluster {cluster} in {ctx.config.region}",
                          "set clusterName and region to the cluster's")]
        return [Check("cluster endpoint", "warn", f"cannot describe cluster {cluster} ({_code(error)})",
                      "allow eks:DescribeCluster")]
    return [_endpoint(cluster, described.get("resourcesVpcConfig", {})),
            _authentication(ctx, described.get("accessConfig", {}).get("authenticationMode"))]


def _endpoint(cluster: str, vpc: dict[str, Any]) -> Check:
    public, cidrs = vpc.get("endpointPublicAccess"), list(vpc.get("publicAccessCidrs", []))
    update = f"aws eks update-cluster-config --name {cluster} --resources-vpc-config"
    if public is None:
        return Check("cluster endpoint", "warn", "DescribeCluster does not say whether the API endpoint is public",
                     f"{update} endpointPublicAccess=true,publicAccessCidrs={OPEN_TO_ALL}")
    if not public:
        return Check("cluster endpoint", "fail", "the API endpoint is private only: the functions run outside any "
                     "VPC and reach it over its public endpoint, so every Kubernetes request of theirs would time out",
                     f"{update} endpointPublicAccess=true,endpointPrivateAccess=true (the nodes keep the private one)")
    if cidrs != [OPEN_TO_ALL]:
        return Check("cluster endpoint", "warn", f"the public API endpoint admits {', '.join(cidrs) or 'no'} "
                     "addresses only: the functions, outside any VPC, connect from Lambda's shared addresses in the "
                     "region, which no fixed list covers, so their requests may time out",
                     f"{update} publicAccessCidrs={OPEN_TO_ALL} (with endpointPrivateAccess=true for the nodes)")
    private = "; private access on" if vpc.get("endpointPrivateAccess") else ""
    return Check("cluster endpoint", "pass", f"public, open to {OPEN_TO_ALL}{private}")


def _authentication(ctx: DoctorContext, mode: str | None) -> Check:
    cluster, name = ctx.config.cluster_name, "cluster authentication mode"
    if mode is None:
        return Check(name, "warn", "DescribeCluster does not report the authentication mode",
                     "see the cluster's Access tab in the EKS console")
    if ctx.config.kubernetes.eks_access:
        if mode == "CONFIG_MAP":
            return Check(name, "fail", "CONFIG_MAP: the cluster takes no access entries, so cdk deploy would fail to "
                         "create the functions' (kubernetes.eksAccess is on)",
                         f"aws eks update-cluster-config --name {cluster} --access-config "
                         "authenticationMode=API_AND_CONFIG_MAP (it cannot be turned back), or set "
                         "kubernetes.eksAccess false and map the stack's …RoleArn outputs in aws-auth to the group "
                         f"{FUNCTIONS_KUBERNETES_GROUP}")
        return Check(name, "pass", f"{mode}: takes the stack's access entries")
    if mode == "API":
        return Check(name, "warn", "API reads no aws-auth, and kubernetes.eksAccess is off: the functions' roles "
                     "need access entries made by hand (checked after cdk deploy)",
                     f"set kubernetes.eksAccess true, or aws eks create-access-entry --cluster-name {cluster} "
                     "--principal-arn <…RoleArn output> --type STANDARD --kubernetes-groups "
                     f"{FUNCTIONS_KUBERNETES_GROUP}")
    return Check(name, "pass", f"{mode}: the functions' roles are mapped in aws-auth (kubernetes.eksAccess is off)")


def check_efa_security_groups(ctx: DoctorContext) -> list[Check]:
    """A pool of EFA instance types needs a security group allowing all traffic to and from itself (EC2 User
    Guide, "Get started with EFA": prepare an EFA-enabled security group)."""
    efa_pools = [p.name for p in ctx.config.node_pools if (t := ctx.candidates(p)) and all(x.efa for x in t)]
    if not efa_pools:
        return [Check("EFA security group", "pass", "no pool of EFA-only instance types")]
    ids = [ctx.security_group(g) for g in ctx.config.network.security_groups]
    try:
        groups = ctx.clients.client("ec2").describe_security_groups(GroupIds=ids)["SecurityGroups"]
    except ClientError as error:
        return [Check("EFA security group", "fail", f"{', '.join(ids)}: {_code(error)}",
                      "fix network.securityGroups")]

    def to_self(group: dict[str, Any], rules: str) -> bool:
        return any(r.get("IpProtocol") == "-1" and any(p.get("GroupId") == group["GroupId"]
                                                      for p in r.get("UserIdGroupPairs", []))
                   for r in group.get(rules, []))

    if any(to_self(g, "IpPermissions") and to_self(g, "IpPermissionsEgress") for g in groups):
        return [Check("EFA security group", "pass", f"pools {', '.join(efa_pools)}: a group allows itself")]
    pools = ", ".join(efa_pools)
    return [Check("EFA security group", "warn", f"pools {pools}: no group allows all traffic to and from itself "
                  "(EFA traffic between nodes would be dropped)",
                  f"aws ec2 authorize-security-group-ingress --group-id {ids[0]} --protocol -1 "
                  f"--source-group {ids[0]} (and the same egress rule)")]


def check_reservations(ctx: DoctorContext) -> list[Check]:
    """Each configured capacity reservation exists, is active, fits its pool (type and zone) and our nodes (platform
    and tenancy: `unusable_reason`)."""
    results = []
    for pool in ctx.config.node_pools:
        allowed = {t.name for t in ctx.candidates(pool)}
        for reservation in pool.capacity_reservations:
            name = f"reservation {reservation.id}"
            try:
                found = ctx.clients.client("ec2").describe_capacity_reservations(
                    CapacityReservationIds=[reservation.id])["CapacityReservations"]
            except (ClientError, BotoCoreError) as error:
                code = _code(error)
                if "NotFound" in code or "Malformed" in code:
                    results.append(Check(name, "fail", f"pool {pool.name}: {code}",
                                         "fix nodePools[].capacityReservations"))
                else:
                    results.append(Check(name, "warn", f"pool {pool.name}: cannot describe ({code})",
                                         "allow ec2:DescribeCapacityReservations"))
                continue
            if not found:
                results.append(Check(name, "fail", f"pool {pool.name}: not found",
                                     "fix nodePools[].capacityReservations"))
                continue
            cr = found[0]
            problems = []
            if cr.get("State") != "active":
                problems.append(f"state {cr.get('State')}")
            if allowed and cr.get("InstanceType") not in allowed:
                problems.append(f"{cr.get('InstanceType')} is not among the pool's types")
            if cr.get("AvailabilityZone") not in ctx.config.zones:
                problems.append(f"zone {cr.get('AvailabilityZone')} has no configured subnet")
            if (unusable := unusable_reason(cr)) is not None:
                problems.append(unusable)
            results.append(Check(name, "fail" if problems else "pass",
                                 f"pool {pool.name}: " + ("; ".join(problems) if problems else
                                 f"active, {cr.get('InstanceType')} in {cr.get('AvailabilityZone')}, "
                                 f"{cr.get('AvailableInstanceCount')} of {cr.get('TotalInstanceCount')} free"),
                                 "match the reservation to the pool, or drop it" if problems else ""))
    return results or [Check("capacity reservations", "pass", "none configured")]


def check_ebs_default_key(ctx: DoctorContext) -> list[Check]:
    """Node volumes are `Encrypted` with no `KmsKeyId`, so EBS uses the account's default key
    (ec2:GetEbsDefaultKmsKeyId). A customer managed one must let the principals that launch them use it — the fleet
    function's role and, for Spot, AWSServiceRoleForEC2Spot (EC2 User Guide: "you must grant the
    AWSServiceRoleForEC2Spot role permission to use the customer managed key") — or each instance is terminated
    right after launch (state reason "Client.InternalError: Client error on launch")."""
    try:
        key_id = str(ctx.clients.client("ec2").get_ebs_default_kms_key_id()["KmsKeyId"])
    except (ClientError, BotoCoreError) as error:
        return [Check("EBS default key", "warn", f"cannot read the account's default EBS key ({_code(error)})",
                      "allow ec2:GetEbsDefaultKmsKeyId")]
    if key_id == AWS_MANAGED_EBS_KEY:
        return [Check("EBS default key", "pass", f"{key_id} (AWS managed)")]
    try:
        key = ctx.clients.client("kms").describe_key(KeyId=key_id)["KeyMetadata"]
    except (ClientError, BotoCoreError) as error:
        return [Check("EBS default key", "warn", f"{key_id} cannot be described ({_code(error)}); if it is customer "
                      "managed, the nodes need its grants", "allow kms:DescribeKey on it, and run doctor again")]
    arn = str(key.get("Arn", key_id))
    if key.get("KeyManager") == "AWS":
        return [Check("EBS default key", "pass", f"{arn} (AWS managed)")]
    principals = "the fleet function's role"
    if any("spot" in pool.capacity_types for pool in ctx.config.node_pools):
        principals += f" and {SPOT_ROLE} (Spot launches)"
    return [Check("EBS default key", "warn", f"node volumes are encrypted with the account's default EBS key "
                  f"{arn}, which is customer managed: without its grants each instance would terminate right "
                  "after launch (Client.InternalError: Client error on launch)",
                  f"in the key's policy, allow {principals} {', '.join(EBS_KEY_ACTIONS)} (kms:CreateGrant with "
                  "kms:GrantIsForAWSResource true), or set the default back: aws ec2 reset-ebs-default-kms-key-id")]


CHECKS: tuple[Callable[[DoctorContext], list[Check]], ...] = (
    check_offerings, check_quotas, check_spot_role, check_subnets, check_amis, check_node_identity,
    check_access_entries, check_function_access, check_cluster_access, check_efa_security_groups,
    check_reservations, check_ebs_default_key,
)


def run_checks(ctx: DoctorContext) -> list[Check]:
    """Every check in order; one that breaks unexpectedly is reported as a failed line, not a traceback."""
    results: list[Check] = []
    for check in CHECKS:
        try:
            results += check(ctx)
        except (ClientError, BotoCoreError) as error:
            results.append(Check(check.__name__.removeprefix("check_"), "fail", f"AWS error: {error}",
                                 "check the credentials' permissions"))
    return results

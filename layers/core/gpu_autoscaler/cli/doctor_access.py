"""The checks of `gpu-autoscaler doctor` that decide whether the nodes and the functions get into the cluster: the
node role (its trust, instance profile, policies and EKS access entry), each function's access entry and its
Kubernetes group, the cluster's API endpoint and authentication mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.cli.doctor_context import Check, DoctorContext, error_code
from gpu_autoscaler.naming import FUNCTIONS, FUNCTIONS_KUBERNETES_GROUP, ResourceNames

if TYPE_CHECKING:
    from gpu_autoscaler.config import FunctionNetwork

__all__ = ["FUNCTIONS_RBAC", "check_access_entries", "check_cluster_access", "check_function_access",
           "check_node_identity"]

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
HTTPS = 443
"""The port of the cluster's API endpoint."""
OPEN_TO_ALL = "0.0.0.0/0"
"""publicAccessCidrs that admit every address (and EKS's default: VpcConfigRequest)."""


def check_node_identity(ctx: DoctorContext) -> list[Check]:
    """The node role exists, trusts EC2 and holds the policies nodes need; the stack's instance profile (once
    deployed) holds it."""
    role_name = ctx.config.node_role.rsplit("/", 1)[1]
    iam = ctx.clients.client("iam")
    try:
        role = iam.get_role(RoleName=role_name)["Role"]
    except ClientError as error:
        return [Check("node role", "fail", f"{role_name}: {error_code(error)}",
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
            results.append(Check("instance profile", "warn", f"{ctx.instance_profile}: {error_code(error)}",
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
        return Check("node role policies", "warn", f"{role_name}: cannot list its policies ({error_code(error)})",
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
        return [Check("EKS access entries (functions)", "warn", f"cannot list access entries ({error_code(error)})",
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
        return Check(check, "warn", f"{arn}: cannot read its access entry ({error_code(error)})",
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
        return [Check(name, "warn", f"cannot list access entries ({error_code(error)}); "
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
        return [Check(name, "warn", f"{role}: cannot read its access entry ({error_code(error)})",
                      "allow eks:DescribeAccessEntry")]
    if entry_type == "EC2_LINUX":
        return [Check(name, "pass", f"{role} (EC2_LINUX)")]
    return [Check(name, "fail", f"{role}: its access entry is of type {entry_type}, not EC2_LINUX: the kubelet "
                  "is not made a node (system:nodes), so nodes launch and are billed but never register",
                  f"aws eks delete-access-entry --cluster-name {cluster} --principal-arn {role}, then {create}")]


def check_cluster_access(ctx: DoctorContext) -> list[Check]:
    """The functions reach the cluster's API. Outside any VPC, only over the public endpoint, from addresses no
    fixed list holds (EKS User Guide, cluster-endpoint.adoc: with public access off, "All traffic to your cluster
    API server must come from within your cluster's VPC or a connected network"; with CIDR blocks, "the public API
    server endpoint will only receive requests from the listed blocks"). In the cluster's VPC (`network.functions`),
    over the private endpoint, through the cluster's security groups. And the authentication mode takes the stack's
    access entries (`kubernetes.eksAccess`; grant-k8s-access.adoc: access entries need API or API_AND_CONFIG_MAP)."""
    cluster = ctx.config.cluster_name
    try:
        described = _describe_cluster(ctx)
    except (ClientError, BotoCoreError) as error:
        if error_code(error) == "ResourceNotFoundException":
            return [Check("cluster endpoint", "fail", f"no EKS cluster {cluster} in {ctx.config.region}",
                          "set clusterName and region to the cluster's")]
        return [Check("cluster endpoint", "warn", f"cannot describe cluster {cluster} ({error_code(error)})",
                      "allow eks:DescribeCluster")]
    vpc = described.get("resourcesVpcConfig", {})
    placed = ctx.config.network.functions
    checks = [_endpoint(cluster, vpc) if placed is None else _private_endpoint(cluster, vpc, placed)]
    if placed is not None:
        checks.append(_functions_admitted(ctx, vpc, placed))
    return [*checks, _authentication(ctx, described.get("accessConfig", {}).get("authenticationMode"))]


def _endpoint(cluster: str, vpc: dict[str, Any]) -> Check:
    public, cidrs = vpc.get("endpointPublicAccess"), list(vpc.get("publicAccessCidrs", []))
    update = f"aws eks update-cluster-config --name {cluster} --resources-vpc-config"
    if public is None:
        return Check("cluster endpoint", "warn", "DescribeCluster does not say whether the API endpoint is public",
                     f"{update} endpointPublicAccess=true,publicAccessCidrs={OPEN_TO_ALL}")
    if not public:
        return Check("cluster endpoint", "fail", "the API endpoint is private only: the functions run outside any "
                     "VPC and reach it over its public endpoint, so every Kubernetes request of theirs would time out",
                     "place the functions in the cluster's VPC with network.functions (README, Deploy), or "
                     f"{update} endpointPublicAccess=true,endpointPrivateAccess=true (the nodes keep the private one)")
    if cidrs != [OPEN_TO_ALL]:
        return Check("cluster endpoint", "warn", f"the public API endpoint admits {', '.join(cidrs) or 'no'} "
                     "addresses only: the functions, outside any VPC, connect from Lambda's shared addresses in the "
                     "region, which no fixed list covers, so their requests may time out",
                     f"{update} publicAccessCidrs={OPEN_TO_ALL} (with endpointPrivateAccess=true for the nodes), or "
                     "place the functions in the cluster's VPC with network.functions (README, Deploy)")
    private = "; private access on" if vpc.get("endpointPrivateAccess") else ""
    return Check("cluster endpoint", "pass", f"public, open to {OPEN_TO_ALL}{private}")


def _private_endpoint(cluster: str, vpc: dict[str, Any], placed: FunctionNetwork) -> Check:
    """The functions in a VPC reach the private endpoint from the cluster's own VPC: its name resolves to the
    private addresses there (cluster-endpoint.adoc, private access needs the VPC's DNS support and hostnames), and
    without private access they reach the public one only through a NAT gateway's addresses."""
    cluster_vpc = vpc.get("vpcId")
    if cluster_vpc and cluster_vpc != placed.vpc_id:
        return Check("cluster endpoint", "warn", f"network.functions places the functions in {placed.vpc_id}, the "
                     f"cluster is in {cluster_vpc}: its private endpoint answers only there or on a connected "
                     "network that resolves its name (cluster-endpoint.adoc)",
                     f"set network.functions to subnets of {cluster_vpc}")
    if not vpc.get("endpointPrivateAccess"):
        return Check("cluster endpoint", "warn", f"private access is off: the functions in {placed.vpc_id} reach "
                     "the public endpoint only through a NAT gateway, whose addresses publicAccessCidrs must admit",
                     f"aws eks update-cluster-config --name {cluster} --resources-vpc-config "
                     "endpointPrivateAccess=true")
    public = "public access on too" if vpc.get("endpointPublicAccess") else "private only"
    return Check("cluster endpoint", "pass", f"private access on ({public}); the functions run in {placed.vpc_id}")


def _admits_https(rule: dict[str, Any]) -> bool:
    if rule.get("IpProtocol") == "-1":
        return True
    return rule.get("IpProtocol") == "tcp" and rule.get("FromPort", 0) <= HTTPS <= rule.get("ToPort", -1)


def _functions_admitted(ctx: DoctorContext, vpc: dict[str, Any], placed: FunctionNetwork) -> Check:
    """The endpoint's security groups admit a function security group on 443. Rules by address (the functions'
    subnets' CIDRs) and prefix list are not read: a warning, not a failure, when none admits by group."""
    name = "functions to endpoint"
    cluster_groups = [g for g in [vpc.get("clusterSecurityGroupId"), *vpc.get("securityGroupIds", [])] if g]
    functions = {ctx.security_group(g): g for g in placed.security_groups}
    if not cluster_groups:
        return Check(name, "warn", "DescribeCluster names no security group of the endpoint",
                     "see the cluster's Networking tab in the EKS console")
    try:
        groups = ctx.clients.client("ec2").describe_security_groups(GroupIds=cluster_groups)["SecurityGroups"]
    except (ClientError, BotoCoreError) as error:
        return Check(name, "warn", f"cannot read the cluster's security groups ({error_code(error)})",
                     "allow ec2:DescribeSecurityGroups")
    for group in groups:
        for rule in group.get("IpPermissions", []):
            admitted = [functions[pair["GroupId"]] for pair in rule.get("UserIdGroupPairs", [])
                        if pair.get("GroupId") in functions]
            if admitted and _admits_https(rule):
                return Check(name, "pass", f"{group['GroupId']} admits {admitted[0]} on {HTTPS}")
    listed = ", ".join(cluster_groups)
    return Check(name, "warn", f"no rule of the endpoint's security groups ({listed}) admits the functions' "
                 f"({', '.join(placed.security_groups)}) on {HTTPS}: unless one admits their subnets' addresses, "
                 "every Kubernetes request of theirs times out",
                 f"aws ec2 authorize-security-group-ingress --group-id {cluster_groups[0]} --protocol tcp --port "
                 f"{HTTPS} --source-group {placed.security_groups[0]}")


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


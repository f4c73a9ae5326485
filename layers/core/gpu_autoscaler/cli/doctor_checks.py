"""The preflight checks of `gpu-autoscaler doctor`: one function per check, each returning pass / warn / fail lines.

Each check reads the account (EC2, IAM, EKS, KMS, Service Quotas) through boto3 clients and compares it with the
configuration; none changes anything. A check that cannot read what it needs warns and says why, so a missing
permission or an API the emulator lacks never ends in a traceback. The fix names the command or setting to change.
The checks of cluster access (node role, access entries, API endpoint) are in `doctor_access`; the line a check
returns and what it reads with, in `doctor_context`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.adapters.aws.catalog import unusable_reason
from gpu_autoscaler.adapters.aws.service_quotas import ServiceQuotasSource
from gpu_autoscaler.cli.doctor_access import (
    check_access_entries,
    check_cluster_access,
    check_function_access,
    check_node_identity,
)
from gpu_autoscaler.cli.doctor_context import Check, DoctorContext, error_code, optional_client
from gpu_autoscaler.domain.packing.index import BY_OFFERING
from gpu_autoscaler.domain.packing.quotas import QUOTA_CODES, quota_group, quota_keys
from gpu_autoscaler.models import labels as L

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.config import NodePool
    from gpu_autoscaler.models.catalog import InstanceType

__all__ = ["CHECKS", "run_checks"]

SPOT_ROLE = "AWSServiceRoleForEC2Spot"
AWS_MANAGED_EBS_KEY = "alias/aws/ebs"
EBS_KEY_ACTIONS = ("kms:CreateGrant", "kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKeyWithoutPlaintext",
                   "kms:ReEncrypt*")
"""What a principal launching instances with volumes under a customer managed key needs of it (EBS creates a
grant for each volume)."""




def offering_allowed(pool: NodePool, zone: str, capacity_type: str) -> bool:
    """Whether the pool's requirements on the zone and the capacity type allow an offering there."""
    labels = {L.ZONE: zone, L.CAPACITY_TYPE: capacity_type}
    return all(r.matches(labels) for r in pool.requirements if r.key in BY_OFFERING)




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
    source = ServiceQuotasSource(optional_client(ctx, "service-quotas"), ctx.config.vcpu_quotas,
                                 cloudwatch_client=optional_client(ctx, "cloudwatch"))
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
    ec2 = optional_client(ctx, "ec2")
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
        if error_code(error) == "NoSuchEntity":
            return [Check("spot service-linked role", "fail", f"{SPOT_ROLE} does not exist",
                          "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com")]
        return [Check("spot service-linked role", "warn", f"cannot read ({error_code(error)})", "allow iam:GetRole")]
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
            results.append(Check(f"subnet {zone}", "fail", f"{configured}: {error_code(error)}",
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
            images, reason = [], error_code(error)
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
        return [Check("EFA security group", "fail", f"{', '.join(ids)}: {error_code(error)}",
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
                code = error_code(error)
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
        return [Check("EBS default key", "warn", f"cannot read the account's default EBS key ({error_code(error)})",
                      "allow ec2:GetEbsDefaultKmsKeyId")]
    if key_id == AWS_MANAGED_EBS_KEY:
        return [Check("EBS default key", "pass", f"{key_id} (AWS managed)")]
    try:
        key = ctx.clients.client("kms").describe_key(KeyId=key_id)["KeyMetadata"]
    except (ClientError, BotoCoreError) as error:
        return [Check("EBS default key", "warn", f"{key_id} cannot be described ({error_code(error)}); if it is "
                      "customer managed, the nodes need its grants",
                      "allow kms:DescribeKey on it, and run doctor again")]
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

"""`Compute` over EC2: CreateFleet (type `instant`) for launches, TerminateInstances for what this cluster owns.

A `FleetRequest` is rendered as it is, nothing decided here: one `LaunchTemplateConfigs` entry per distinct
user data (base64, `LaunchTemplateSpecificationUserData`), the overrides as given, the DESIGN tags on the
fleet, the instances and their volumes. The answer's `Instances` and `Errors` become a `FleetResult` (with
DescribeInstances' word where the answer leaves an instance's zone, or a reserved one's reservation, unknown); a
throttled call, or one EC2 failed on its side (a 5xx), raises `RequestThrottled` (the caller backs off), any other
refusal of the whole call comes back as a request-level error, for the domain to classify like the per-override
ones. The instances of a request for several claims are then tagged with their claims (`_tag_claims`), one not
known yet asked again with backoff.

Termination calls TerminateInstances directly, without describing first: EC2 is eventually consistent, so a
just-launched instance may be missing from DescribeInstances (EC2 API reference, "Eventual consistency in the Amazon
EC2 API"), and skipping it leaked it. What may be terminated is IAM's to say: this role may terminate only instances
carrying `gpu-autoscaler/cluster = <cluster>` (`infra.permissions`), so someone else's instance answers
`UnauthorizedOperation`. A call for several ids fails as a whole when one of them is refused or not known yet
(`InvalidInstanceID.NotFound`): then each id is asked alone, a not-yet-known one again with backoff, and only what
EC2 confirmed is reported terminated; an instance launched long ago is not waited for (`unknown_is_gone`): EC2
forgets a terminated instance about an hour after ("Terminated instances remain visible after termination (for
approximately one hour)", EC2 API reference, TerminateInstances). It is idempotent: EC2 answers for an instance
already shutting down or terminated as for any other. `owned_instances` lists the cluster's instances for the
garbage collector.
"""

from __future__ import annotations

import base64
import functools
import logging
import random
import time
from typing import TYPE_CHECKING, Any, TypeVar

import botocore
from botocore.exceptions import ClientError, ParamValidationError

from gpu_autoscaler.domain.fleet import TAG_LAUNCH, assign_claims, backoff_delay, launched_capacity_type
from gpu_autoscaler.domain.launch_templates import ebs_api
from gpu_autoscaler.errors import RequestThrottled
from gpu_autoscaler.models.fleet import (
    CONFIGURATION_ERROR_CODES,
    PARAM_VALIDATION_ERROR,
    SPOT_ROLE_ERROR,
    ErrorKind,
    FleetError,
    FleetResult,
    LaunchedInstance,
    OwnedInstance,
    classify_error,
)
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER, TAG_SNAPSHOT_BUILDER, claim_tags

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.models.fleet import FleetRequest

__all__ = ["TAG_EMULATES", "Ec2Compute", "efa_security_group_problem", "render_create_fleet",
           "resolve_security_groups", "resolve_subnets"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

TAG_EMULATES = "gpu-autoscaler/emulates"
"""On a subnet an emulator created: the configuration's subnet id it stands in for (`emulator.resources`)."""
_DEFAULT_TARGET = {"spot": "spot", "on-demand": "on-demand", "reserved": "reserved-capacity"}
_CONFIGURATION_HINTS = {
    SPOT_ROLE_ERROR: (
        "the account has no AWSServiceRoleForEC2Spot and this function may not create it: grant "
        "iam:CreateServiceLinkedRole for spot.amazonaws.com (the stack does) or create the role once with "
        "`aws iam create-service-linked-role --aws-service-name spot.amazonaws.com`; meanwhile every Spot "
        "offering is marked unavailable for timeouts.unavailableOfferingTtl at a time, and pools that allow "
        "On-Demand launch there"),
}
_FILTER_CHUNK = 100
_TERMINATE_CHUNK = 1000
"""TerminateInstances takes up to 1000 ids per call."""
NOT_FOUND = "InvalidInstanceID.NotFound"
NOT_FOUND_RETRIES = 4
"""Asks of one id EC2 does not know yet (eventual consistency: seconds after its launch), with backoff whose
half is fixed: 3.75 to 7.5 s in all before giving up, whatever the jitter draws."""
_REFUSED = frozenset({"UnauthorizedOperation", "OperationNotPermitted", "InvalidInstanceID.Malformed"})
"""Per id: not ours (IAM's ownership condition), protected from termination, or not an instance id."""


def _tags(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _reservation_unknown(request: FleetRequest, instance: LaunchedInstance) -> bool:
    """A reserved instance whose reservation the request cannot tell: it names none, or several, of the instance's
    type and zone. CreateFleet's answer does not say (EC2 API Reference, CreateFleetInstance); DescribeInstances'
    `CapacityReservationId` does."""
    if instance.capacity_type != "reserved" or request.reservation is None:
        return False
    return len(request.reservation.named_at(instance.instance_type, instance.zone)) != 1


def _described(instance: LaunchedInstance, item: dict[str, Any] | None) -> LaunchedInstance:
    """What DescribeInstances adds: the zone where the answer left it out, the reservation the instance runs in. An
    instance EC2 does not show yet (eventual consistency) stays as it was."""
    if item is None:
        return instance
    return instance.model_copy(update={
        "zone": instance.zone or item["Placement"]["AvailabilityZone"],
        "reservation_id": item.get("CapacityReservationId") if instance.capacity_type == "reserved" else None,
    })


def render_create_fleet(request: FleetRequest) -> dict[str, Any]:
    """The CreateFleet parameters of a request (what the Stubber tests compare against)."""
    configs = []
    for config in request.launch_configs:
        spec: dict[str, Any] = {
            "LaunchTemplateId": config.launch_template_id or request.launch_template_id,
            "Version": config.launch_template_version or request.launch_template_version,
        }
        if config.user_data:
            spec["LaunchTemplateSpecificationUserData"] = base64.b64encode(config.user_data.encode()).decode()
        overrides = []
        for o in config.overrides:
            override: dict[str, Any] = {"InstanceType": o.instance_type, "SubnetId": o.subnet_id}
            if o.priority is not None:
                override["Priority"] = o.priority
            if o.max_price is not None:
                override["MaxPrice"] = f"{o.max_price:.5f}"
            if o.image_id:
                override["ImageId"] = o.image_id
            if o.placement_group:
                override["Placement"] = {"GroupName": o.placement_group}
            if request.block_device_mappings:
                override["BlockDeviceMappings"] = ebs_api(request.block_device_mappings)
            overrides.append(override)
        configs.append({"LaunchTemplateSpecification": spec, "Overrides": overrides})
    params: dict[str, Any] = {
        "Type": "instant",
        "ClientToken": request.client_token,
        "LaunchTemplateConfigs": configs,
        "TargetCapacitySpecification": {
            "TotalTargetCapacity": request.target_capacity,
            "DefaultTargetCapacityType": _DEFAULT_TARGET[request.capacity_type],
        },
        "TagSpecifications": [
            {"ResourceType": kind, "Tags": _tags(request.tags)} for kind in ("fleet", "instance", "volume")
        ],
    }
    group: dict[str, Any] = {}
    if request.min_target_capacity is not None:
        group["MinTargetCapacity"] = request.min_target_capacity
    if request.single_availability_zone:
        group["SingleAvailabilityZone"] = True
    if request.single_instance_type:
        group["SingleInstanceType"] = True
    if request.capacity_type == "spot":
        params["SpotOptions"] = {"AllocationStrategy": request.allocation_strategy, **group}
    elif request.capacity_type == "on-demand":
        params["OnDemandOptions"] = {"AllocationStrategy": request.allocation_strategy, **group}
    else:
        # Reserved capacity has no MinTargetCapacity: all or nothing is checked on the answer instead
        # (`domain.fleet.read_result` terminates a short gang).
        assert request.reservation is not None
        reserved: dict[str, Any] = {
            "AllocationStrategy": request.allocation_strategy,
            "ReservationTypes": list(request.reservation.reservation_types),
            "CapacityReservationTarget": {"CapacityReservationIds": list(request.reservation.reservation_ids)},
        }
        if request.reservation.fallback_on_demand:
            reserved["ReservedCapacityFallbackOptions"] = {"MarketTypes": ["on-demand"]}
        params["ReservedCapacityOptions"] = reserved
    return params


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _message(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Message", ""))


def _server_error(error: ClientError) -> bool:
    """An HTTP 5xx: EC2 failed on its side, whatever the code (`models.fleet.SERVER_ERROR_CODES`)."""
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0) >= 500


class Ec2Compute:
    """`Compute` for one cluster, over an EC2 client (AWS or moto)."""

    def __init__(self, ec2_client: Any, cluster_name: str, *, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        self._ec2 = ec2_client
        self.cluster = cluster_name
        self._sleep = sleep
        self._rng = rng or random.Random()

    # ---- launch -------------------------------------------------------------------------------------------

    def create_fleet(self, request: FleetRequest) -> FleetResult:
        try:
            response = self._ec2.create_fleet(**render_create_fleet(request))
        except ParamValidationError as error:
            # Not a ClientError: botocore refused before sending. Without this the handler's except misses it and
            # every launch dead-letters; as a request-level error it ends the claim, once, with the SDK named.
            message = (f"botocore {botocore.__version__} in this function does not know a parameter of the request "
                       f"({error}); the function needs the botocore the layer pins")
            logger.error("CreateFleet not sent: %s", message)
            return FleetResult(errors=(FleetError(code=PARAM_VALIDATION_ERROR, message=message,
                                                  capacity_type=request.capacity_type),))
        except ClientError as error:
            code = _code(error)
            if classify_error(code) is ErrorKind.THROTTLED or _server_error(error):
                raise RequestThrottled(f"CreateFleet throttled or unavailable: {code} {_message(error)}") from error
            if code in CONFIGURATION_ERROR_CODES:
                logger.error("CreateFleet refused for a configuration of the account, not capacity: %s %s — %s",
                             code, _message(error), _CONFIGURATION_HINTS.get(code, ""))
            else:
                logger.warning("CreateFleet refused: %s %s", code, _message(error))
            return FleetResult(errors=(FleetError(code=code, message=_message(error),
                                                  capacity_type=request.capacity_type),))
        instances = self._instances(request, response.get("Instances") or [])
        if len(request.claim_ids) > 1:
            instances = assign_claims(request.claim_ids, instances)
            self._tag_claims(instances)
        errors = tuple(self._error(request, item) for item in response.get("Errors") or [])
        for code in sorted({e.code for e in errors} & CONFIGURATION_ERROR_CODES):
            logger.error("CreateFleet: %s for this account's configuration, not capacity — %s", code,
                         _CONFIGURATION_HINTS.get(code, ""))
        return FleetResult(fleet_id=response.get("FleetId"), instances=instances, errors=errors)

    def _instances(self, request: FleetRequest, items: list[dict[str, Any]]) -> tuple[LaunchedInstance, ...]:
        fallback = bool(request.reservation and request.reservation.fallback_on_demand)
        out: list[LaunchedInstance] = []
        unknown_zone: list[str] = []
        for item in items:
            override = (item.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
            subnet = item.get("SubnetId") or override.get("SubnetId")
            zone = item.get("AvailabilityZone") or override.get("AvailabilityZone") or (
                request.zone_of_subnet(subnet) if subnet else None
            )
            lifecycle = item.get("Lifecycle") or ""
            for instance_id in item.get("InstanceIds") or []:
                if zone is None:
                    unknown_zone.append(instance_id)
                out.append(LaunchedInstance(
                    instance_id=instance_id,
                    instance_type=item.get("InstanceType") or override.get("InstanceType", ""),
                    zone=zone or "",
                    capacity_type=launched_capacity_type(request.capacity_type, lifecycle, fallback),
                    subnet_id=subnet,
                    lifecycle=lifecycle,
                ))
        unplaced = [i.instance_id for i in out if _reservation_unknown(request, i)]
        if unknown_zone or unplaced:
            found = {i["InstanceId"]: i for i in self._describe(list(dict.fromkeys([*unknown_zone, *unplaced])))}
            out = [_described(i, found.get(i.instance_id)) for i in out]
        return tuple(out)

    @staticmethod
    def _error(request: FleetRequest, item: dict[str, Any]) -> FleetError:
        override = (item.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
        subnet = override.get("SubnetId")
        zone = override.get("AvailabilityZone") or (request.zone_of_subnet(subnet) if subnet else None)
        lifecycle = item.get("Lifecycle")
        fallback = bool(request.reservation and request.reservation.fallback_on_demand)
        return FleetError(
            code=item.get("ErrorCode") or "Unknown",
            message=item.get("ErrorMessage") or "",
            instance_type=override.get("InstanceType"),
            zone=zone,
            capacity_type=launched_capacity_type(request.capacity_type, lifecycle, fallback)
            if lifecycle else request.capacity_type,
        )

    def _tag_claims(self, instances: Sequence[LaunchedInstance]) -> None:
        """A request for several claims launched untagged by claim: each instance now gets its claim's tags.

        Right after CreateFleet EC2 may not know the instance yet ("Eventual consistency in the Amazon EC2 API":
        CreateTags answers `InvalidInstanceID.NotFound`): asked again with backoff, as termination does. One still
        unknown after that is logged, not raised: the launch worked, the fleet records each claim's instance from
        this answer, and until it has, the instance's launch tag (`gpu-autoscaler/launch`, put on at creation by
        the request's TagSpecifications) keeps the garbage collector off it (`domain.garbage_collection`); only
        its claim tag and Name are missing. Any other refusal (throttling) is raised as before: the message comes
        back, asks the same attempt again (same ClientToken, the same instances) and tags them then."""
        for instance in instances:
            if instance.claim_id is None:
                continue
            tags = _tags(claim_tags(self.cluster, instance.claim_id))  # IAM allows these keys only (aws:TagKeys)
            if self._once_known(functools.partial(self._tag, instance.instance_id, tags), NOT_FOUND_RETRIES) is None:
                logger.warning("instance %s, launched for claim %s, still unknown to EC2 after %d tries: not tagged "
                               "with its claim (its launch tag keeps it from the garbage collector until the claim "
                               "records it)", instance.instance_id, instance.claim_id, NOT_FOUND_RETRIES + 1)

    def _tag(self, instance_id: str, tags: list[dict[str, str]]) -> object:
        return self._ec2.create_tags(Resources=[instance_id], Tags=tags)

    def _once_known(self, call: Callable[[], T], retries: int) -> T | None:
        """`call()`, asked again up to `retries` times with backoff while EC2 answers `InvalidInstanceID.NotFound`
        (an instance too new to be known yet); None if it never knew it. Any other refusal is raised."""
        for retry in range(retries + 1):
            try:
                return call()
            except ClientError as error:
                if _code(error) != NOT_FOUND:
                    raise
                if retry < retries:
                    self._sleep(backoff_delay(retry, self._rng, fixed=0.5))
        return None

    # ---- terminate ----------------------------------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str], *, unknown_is_gone: bool = False) -> list[str]:
        wanted = list(dict.fromkeys(instance_ids))
        done: list[str] = []
        retries = 0 if unknown_is_gone else NOT_FOUND_RETRIES
        for start in range(0, len(wanted), _TERMINATE_CHUNK):
            chunk = wanted[start:start + _TERMINATE_CHUNK]
            if len(chunk) == 1:
                done += self._terminate_one(chunk[0], retries)
                continue
            try:
                done += self._terminate_call(chunk)
            except ClientError as error:
                if _code(error) not in {NOT_FOUND, *_REFUSED}:
                    raise self._terminate_error(error) from error
                # The whole call failed for one id: nothing was terminated. Each id alone, so the rest go.
                for instance_id in chunk:
                    done += self._terminate_one(instance_id, retries)
        return done

    def _terminate_call(self, instance_ids: list[str]) -> list[str]:
        answer = self._ec2.terminate_instances(InstanceIds=instance_ids)
        return [i["InstanceId"] for i in answer.get("TerminatingInstances") or []]

    def _terminate_one(self, instance_id: str, retries: int) -> list[str]:
        """`retries`: how often an id EC2 does not know is asked again (none when it is known to be long gone:
        EC2 forgets a terminated instance about an hour after, and then answers `InvalidInstanceID.NotFound`)."""
        try:
            done = self._once_known(functools.partial(self._terminate_call, [instance_id]), retries)
        except ClientError as error:
            code = _code(error)
            if code in _REFUSED:
                logger.warning("not terminating %s: %s %s (not carrying %s=%s?)", instance_id, code,
                               _message(error), TAG_CLUSTER, self.cluster)
                return []
            raise self._terminate_error(error) from error
        if done is None:
            if retries:
                logger.warning("instance %s still unknown to EC2 after %d tries: not terminated here (the garbage "
                               "collector ends it if it appears)", instance_id, retries + 1)
            else:
                logger.info("instance %s is unknown to EC2: gone long ago", instance_id)
            return []
        return done

    @staticmethod
    def _terminate_error(error: ClientError) -> Exception:
        if _code(error) == "RequestLimitExceeded":
            return RequestThrottled(f"TerminateInstances throttled: {_message(error)}")
        return error

    def instance_states(self, instance_ids: Sequence[str]) -> dict[str, str]:
        return {i["InstanceId"]: i["State"]["Name"] for i in self._describe(list(dict.fromkeys(instance_ids)))}

    def owned_instances(self) -> list[OwnedInstance]:
        out = []
        filters = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster]}]
        for page in self._ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                for item in reservation.get("Instances", []):
                    tags = {t["Key"]: t["Value"] for t in item.get("Tags") or []}
                    if tags.get(TAG_CLUSTER) != self.cluster or TAG_SNAPSHOT_BUILDER in tags:
                        continue  # another cluster's, or `gpu-autoscaler snapshot`'s builder: no node
                    out.append(OwnedInstance(
                        instance_id=item["InstanceId"], state=item["State"]["Name"],
                        launched_at=item.get("LaunchTime"), claim_id=tags.get(TAG_CLAIM),
                        launch_token=tags.get(TAG_LAUNCH),
                        capacity_reservation_id=item.get("CapacityReservationId"),
                    ))
        return out

    def _describe(self, instance_ids: Sequence[str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for start in range(0, len(instance_ids), _FILTER_CHUNK):
            filters = [{"Name": "instance-id", "Values": list(instance_ids[start:start + _FILTER_CHUNK])}]
            for page in self._ec2.get_paginator("describe_instances").paginate(Filters=filters):
                for reservation in page.get("Reservations", []):
                    out.extend(reservation.get("Instances", []))
        return out


def efa_security_group_problem(ec2_client: Any, group_ids: Sequence[str]) -> str | None:
    """Why EFA traffic would not flow between the nodes, or None. EC2 User Guide, "Get started with EFA",
    "Prepare an EFA-enabled security group": the group must allow all inbound and all outbound traffic from
    and to itself — otherwise NCCL (libfabric) times out once the job starts. Enough if one of the nodes'
    groups does."""
    groups = ec2_client.describe_security_groups(GroupIds=list(group_ids)).get("SecurityGroups", [])

    def to_itself(group: dict[str, Any], rules: list[dict[str, Any]]) -> bool:
        return any(rule.get("IpProtocol") == "-1" and any(
            pair.get("GroupId") == group["GroupId"] for pair in rule.get("UserIdGroupPairs") or [])
            for rule in rules)

    def outbound(group: dict[str, Any]) -> bool:
        rules = group.get("IpPermissionsEgress") or []
        return to_itself(group, rules) or any(
            rule.get("IpProtocol") == "-1" and any(r.get("CidrIp") == "0.0.0.0/0" for r in rule.get("IpRanges") or [])
            for rule in rules)

    if any(to_itself(g, g.get("IpPermissions") or []) and outbound(g) for g in groups):
        return None
    names = ", ".join(group_ids)
    return (f"EFA needs a node security group that allows all traffic from itself (inbound and outbound); "
            f"none of {names} does. Add an inbound rule 'All traffic' with source the group itself "
            "(and outbound all traffic), or NCCL jobs will time out")


def resolve_subnets(ec2_client: Any, config: Config) -> dict[str, str]:
    """Configuration subnet id → the subnet to launch in. Identity on AWS; on an emulator, the stand-in
    subnets it tagged with `gpu-autoscaler/emulates` (moto cannot create a subnet with a chosen id)."""
    configured = list(config.network.subnets.values())
    response = ec2_client.describe_subnets(Filters=[
        {"Name": f"tag:{TAG_CLUSTER}", "Values": [config.cluster_name]},
        {"Name": "tag-key", "Values": [TAG_EMULATES]},
    ])
    stand_ins: dict[str, str] = {}
    for subnet in response.get("Subnets", []):
        tags = {t["Key"]: t["Value"] for t in subnet.get("Tags") or []}
        if tags.get(TAG_EMULATES) in configured:
            stand_ins[tags[TAG_EMULATES]] = subnet["SubnetId"]
    return {subnet: stand_ins.get(subnet, subnet) for subnet in configured}


def resolve_security_groups(ec2_client: Any, config: Config) -> dict[str, str]:
    """Configuration security group id → the group at the endpoint: identity on AWS, the emulator's
    stand-ins (tagged `gpu-autoscaler/emulates`) on an emulator."""
    response = ec2_client.describe_security_groups(Filters=[
        {"Name": f"tag:{TAG_CLUSTER}", "Values": [config.cluster_name]},
        {"Name": "tag-key", "Values": [TAG_EMULATES]},
    ])
    stand_ins = {}
    for group in response.get("SecurityGroups", []):
        tags = {t["Key"]: t["Value"] for t in group.get("Tags") or []}
        stand_ins[tags.get(TAG_EMULATES)] = group["GroupId"]
    return {group: stand_ins.get(group, group) for group in config.network.security_groups}

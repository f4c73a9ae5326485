"""EC2 instance behaviour moto does not have: who may terminate, eventual consistency, the Spot role.

- **Ownership.** The stack lets its functions terminate only instances tagged `gpu-autoscaler/cluster =
  <cluster>` (an `aws:ResourceTag` condition on `ec2:TerminateInstances`). IAM refuses a request for any
  resource the policy does not allow as a whole, with `UnauthorizedOperation` ("You are not authorized to
  perform this operation.": EC2 API Reference, "Error codes for the Amazon EC2 API"; IAM User Guide, "Policy
  evaluation logic"). moto does not evaluate IAM, so the emulator applies the stack's condition for the cluster
  it was started for (`register_owner`).
- **Eventual consistency.** "Amazon EC2 ... follows an eventual consistency model ... If you run a command
  immediately after a resource is created, it might not be visible yet: DescribeInstances may not return the
  instance, and actions on it may return `InvalidInstanceID.NotFound`" (EC2 API Reference, "Eventual
  consistency in the Amazon EC2 API"). moto shows every instance at once; with `set_visibility_lag(seconds)`
  an instance is missing from DescribeInstances and unknown to TerminateInstances and CreateTags (the tags of
  a request for several claims, put on right after CreateFleet) for that long after its launch. Off (0) unless
  a test or the emulator asks for it.
- **The Spot service-linked role.** The first Spot launch in an account creates `AWSServiceRoleForEC2Spot`
  on the caller's behalf; a caller without `iam:CreateServiceLinkedRole` for spot.amazonaws.com is refused
  with `AuthFailure.ServiceLinkedRoleCreationNotPermitted` ("The provided credentials do not have permission
  to create the service-linked role for EC2 Spot Instances."; EC2 User Guide, "Service-linked role for Spot
  Instance requests"): RunInstances as an error, an instant CreateFleet per override in its `Errors`.
  `set_spot_role_creation(permitted=False)` plays an account whose callers lack that permission; by default
  callers have it (the stack grants it), and the role is created in moto's IAM on the first Spot launch.

`InvalidInstanceID.NotFound` for a TerminateInstances naming an id EC2 has never had fails the whole call,
as on EC2; moto already does that, so there is no rule for it here.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.strict.core import Answer, Refusal, answer, check, on_reset
from gpu_autoscaler.emulator.strict.ec2 import spot_instances_requested

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.strict.core import AwsRequest

__all__ = ["SPOT_ROLE", "register_owner", "set_spot_role_creation", "set_visibility_lag"]

OWNER_TAG = "gpu-autoscaler/cluster"
SPOT_ROLE = "AWSServiceRoleForEC2Spot"
SPOT_ROLE_MESSAGE = ("The provided credentials do not have permission to create the service-linked role for "
                     "EC2 Spot Instances.")
UNAUTHORIZED_MESSAGE = "You are not authorized to perform this operation."

_lock = threading.Lock()
_owners: dict[tuple[str, str], str] = {}
_lag = timedelta(0)
_spot_role_creation: dict[str, bool] = {}


@on_reset
def _forget() -> None:
    global _lag
    with _lock:
        _owners.clear()
        _spot_role_creation.clear()
        _lag = timedelta(0)


def register_owner(account: str, region: str, cluster: str) -> None:
    """The cluster whose ownership tag the stack's roles may terminate instances by, in this account and region."""
    with _lock:
        _owners[(account, region)] = cluster


def set_visibility_lag(seconds: float) -> None:
    """How long a launched instance stays invisible to DescribeInstances and unknown to TerminateInstances."""
    global _lag
    with _lock:
        _lag = timedelta(seconds=max(0.0, seconds))


def set_spot_role_creation(account: str, permitted: bool) -> None:
    """Whether callers in `account` may create the Spot service-linked role (the stack grants it)."""
    with _lock:
        _spot_role_creation[account] = permitted


# ---- ownership ---------------------------------------------------------------------------------------------


def _instances(request: AwsRequest, ids: list[str]) -> dict[str, Any]:
    backend = request.moto_backend()
    found = {}
    for reservation in backend.reservations.values():
        for instance in reservation.instances:
            if instance.id in ids:
                found[instance.id] = instance
    return found


def _tags(instance: Any) -> dict[str, str]:
    return {str(t["key"]): str(t["value"]) for t in instance.get_tags()}


@check("ec2", "TerminateInstances")
def _only_owned_instances(request: AwsRequest) -> None:
    with _lock:
        owner = _owners.get((request.account, request.region))
    if owner is None:
        return
    ids = [str(i) for i in request.params.get("InstanceIds", [])]
    for instance in _instances(request, ids).values():
        if _tags(instance).get(OWNER_TAG) != owner:
            raise Refusal("UnauthorizedOperation", UNAUTHORIZED_MESSAGE, 403)


# ---- eventual consistency ----------------------------------------------------------------------------------


def _invisible(request: AwsRequest) -> set[str]:
    """Instances launched less than the lag ago: EC2 does not show them yet."""
    with _lock:
        lag = _lag
    if lag <= timedelta(0):
        return set()
    now = datetime.now(UTC)
    hidden = set()
    for reservation in request.moto_backend().reservations.values():
        for instance in reservation.instances:
            launched = datetime.fromisoformat(str(instance.launch_time).replace("Z", "+00:00"))
            if launched.tzinfo is None:
                launched = launched.replace(tzinfo=UTC)
            if now - launched < lag:
                hidden.add(instance.id)
    return hidden


def _not_found(instance_id: str) -> Refusal:
    return Refusal("InvalidInstanceID.NotFound", f"The instance ID '{instance_id}' does not exist")


@check("ec2", "TerminateInstances", "CreateTags")
def _unknown_until_consistent(request: AwsRequest) -> None:
    hidden = _invisible(request)
    named = request.params.get("InstanceIds") if request.action == "TerminateInstances" else \
        request.params.get("Resources")
    for instance_id in named or []:
        if instance_id in hidden:
            raise _not_found(str(instance_id))


@answer("ec2", "DescribeInstances")
def _describe_when_consistent(request: AwsRequest) -> Answer | None:
    hidden = _invisible(request)
    if not hidden:
        return None
    for instance_id in request.params.get("InstanceIds", []):
        if instance_id in hidden:
            raise _not_found(str(instance_id))
    status, result = request.forward()
    if status >= 300:
        return None  # moto's own refusal: ask it again and let it answer
    reservations = []
    for reservation in result.get("Reservations", []):
        shown = [i for i in reservation.get("Instances", []) if i.get("InstanceId") not in hidden]
        if shown:
            reservations.append({**reservation, "Instances": shown})
    answered = {k: v for k, v in result.items() if k != "ResponseMetadata"}
    return Answer(result={**answered, "Reservations": reservations})


# ---- the Spot service-linked role --------------------------------------------------------------------------


def _spot_role_ready(request: AwsRequest) -> bool:
    """True if the role exists or the caller may create it (then it now exists, as EC2 creates it)."""
    iam = request.moto_backend("iam")
    try:
        iam.get_role(SPOT_ROLE)
        return True
    except Exception:  # moto's NotFoundException: no role yet
        pass
    with _lock:
        permitted = _spot_role_creation.get(request.account, True)
    if not permitted:
        return False
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": ["spot.amazonaws.com"]}, "Action": ["sts:AssumeRole"]}]}
    iam.create_role(SPOT_ROLE, json.dumps(trust), "/aws-service-role/spot.amazonaws.com/", permissions_boundary=None,
                    description="Default EC2 Spot Service Linked Role", tags=[], max_session_duration="3600",
                    linked_service="spot.amazonaws.com")
    return True


@check("ec2", "RunInstances")
def _spot_run_needs_the_role(request: AwsRequest) -> None:
    if spot_instances_requested(request) and not _spot_role_ready(request):
        raise Refusal("AuthFailure.ServiceLinkedRoleCreationNotPermitted", SPOT_ROLE_MESSAGE)


@answer("ec2", "CreateFleet")
def _spot_fleet_needs_the_role(request: AwsRequest) -> Answer | None:
    if not spot_instances_requested(request) or _spot_role_ready(request):
        return None
    if request.params.get("Type") != "instant":
        raise Refusal("AuthFailure.ServiceLinkedRoleCreationNotPermitted", SPOT_ROLE_MESSAGE)
    errors = [
        {"LaunchTemplateAndOverrides": {"LaunchTemplateSpecification": config.get("LaunchTemplateSpecification"),
                                        "Overrides": override},
         "Lifecycle": "spot", "ErrorCode": "AuthFailure.ServiceLinkedRoleCreationNotPermitted",
         "ErrorMessage": SPOT_ROLE_MESSAGE}
        for config in request.params.get("LaunchTemplateConfigs", [])
        for override in config.get("Overrides") or [{}]
    ]
    return Answer(result={"FleetId": f"fleet-{abs(hash(json.dumps(request.params, default=str))) % 16**17:017x}",
                          "Instances": [], "Errors": errors})

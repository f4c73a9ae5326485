"""What moto's fleets leave out: the network interfaces a launch template asks for, EFAs included.

EC2 API Reference, LaunchTemplateInstanceNetworkInterfaceSpecificationRequest (`NetworkCardIndex`, `DeviceIndex`,
`InterfaceType`: `interface`, `efa` or `efa-only`) and InstanceNetworkInterface in DescribeInstances (its
`InterfaceType` and its `Attachment`'s `NetworkCardIndex` and `DeviceIndex`): an instance launched from a template
with network interfaces has exactly those, one per entry, the one at device index 0 of network card 0 its primary.
moto's CreateFleet gives every instance one plain interface whatever the template says (and keys interfaces by
device index alone, which cannot hold an EFA at device index 1 on each of several network cards), so the layer
records what each instance was launched with and DescribeInstances shows it: what an EFA node's device plugin, and
the emulator's kubelet, see of the instance.
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.strict.core import Answer, after, answer, ask_after, on_reset
from gpu_autoscaler.emulator.strict.ec2 import fleet_launch

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.strict.core import AwsRequest

__all__: list[str] = []

_lock = threading.Lock()
_launched: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
"""(account, region, instance id) → the network interfaces its template launched it with."""


@on_reset
def _forget() -> None:
    with _lock:
        _launched.clear()


@after("ec2", "CreateFleet")
def _record(request: AwsRequest, result: dict[str, Any]) -> None:
    for item in result.get("Instances", []):
        launch = fleet_launch(request, item)
        interfaces = (launch[0].get("NetworkInterfaces") or []) if launch is not None else []
        if not interfaces:
            continue
        launched = [{"NetworkCardIndex": int(i.get("NetworkCardIndex") or 0),
                     "DeviceIndex": int(i.get("DeviceIndex") or 0),
                     "InterfaceType": str(i.get("InterfaceType") or "interface"),
                     "DeleteOnTermination": bool(i.get("DeleteOnTermination", True))} for i in interfaces]
        with _lock:
            for instance_id in item.get("InstanceIds", []):
                _launched[(request.account, request.region, instance_id)] = launched


@answer("ec2", "DescribeInstances", first=True)
def _describe_with_interfaces(request: AwsRequest) -> Answer | None:
    with _lock:
        known = {key[2]: value for key, value in _launched.items() if key[:2] == (request.account, request.region)}
    if not known:
        return None
    result = ask_after(_describe_with_interfaces, request).result or {}
    reservations = []
    for reservation in result.get("Reservations", []):
        instances = [_with_interfaces(i, known[i["InstanceId"]]) if i.get("InstanceId") in known else i
                     for i in reservation.get("Instances", [])]
        reservations.append({**reservation, "Instances": instances})
    return Answer(result={**result, "Reservations": reservations})


def _with_interfaces(instance: dict[str, Any], launched: list[dict[str, Any]]) -> dict[str, Any]:
    """The instance with the interfaces it was launched with: the primary keeps what moto gave it (addresses,
    groups, subnet), with the template's type; each other one is attached on its card and device index."""
    primary: dict[str, Any] = next(iter(instance.get("NetworkInterfaces") or ()), {})
    interfaces = []
    for spec in launched:
        card, device = spec["NetworkCardIndex"], spec["DeviceIndex"]
        attachment = {"NetworkCardIndex": card, "DeviceIndex": device, "Status": "attached",
                      "DeleteOnTermination": spec["DeleteOnTermination"]}
        if card == 0 and device == 0:
            interfaces.append({**primary, "InterfaceType": spec["InterfaceType"],
                               "Attachment": {**(primary.get("Attachment") or {}), **attachment}})
            continue
        digest = hashlib.sha256(f"{instance['InstanceId']}/{card}/{device}".encode()).hexdigest()
        interfaces.append({"NetworkInterfaceId": f"eni-{digest[:17]}", "InterfaceType": spec["InterfaceType"],
                           "Status": "in-use", "SubnetId": primary.get("SubnetId", ""),
                           "VpcId": primary.get("VpcId", ""), "Groups": primary.get("Groups", []),
                           "Attachment": attachment})
    return {**instance, "NetworkInterfaces": interfaces}

"""A stand-in for EC2 placement groups, which moto's server does not implement, from the EC2 documentation.

EC2 User Guide, "Placement groups"; EC2 API Reference, CreatePlacementGroup, DescribePlacementGroups,
DeletePlacementGroup: a group has a name unique in the Region, a strategy (`cluster`, `spread`,
`partition`) and tags. A launch that names an unknown group is refused with `InvalidPlacementGroup.Unknown`
(EC2 API Reference, Common error codes: "The specified placement group cannot be found"); a cluster group
holds instances of one Availability Zone only ("A cluster placement group can't span multiple Availability
Zones"), so a launch into a cluster group already used in another zone is refused.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.strict.core import Answer, Refusal, answer, check, on_reset

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.strict.core import AwsRequest

__all__ = ["PlacementGroup"]


@dataclass
class PlacementGroup:
    name: str
    id: str
    strategy: str
    tags: list[dict[str, str]] = field(default_factory=list)
    zone: str | None = None
    """A cluster group's zone, fixed by its first launch."""

    def describe(self) -> dict[str, Any]:
        return {"GroupName": self.name, "GroupId": self.id, "Strategy": self.strategy, "State": "available",
                "Tags": self.tags}


_lock = threading.Lock()
_groups: dict[tuple[str, str, str], PlacementGroup] = {}


@on_reset
def _forget() -> None:
    with _lock:
        _groups.clear()


def _mine(request: AwsRequest) -> dict[str, PlacementGroup]:
    with _lock:
        return {name: g for (account, region, name), g in _groups.items()
                if (account, region) == (request.account, request.region)}


@answer("ec2", "CreatePlacementGroup")
def _create(request: AwsRequest) -> Answer:
    name = str(request.params.get("GroupName", ""))
    if name in _mine(request):
        raise Refusal("InvalidPlacementGroup.Duplicate", f"The placement group '{name}' already exists.")
    tags = [t for spec in request.params.get("TagSpecifications", [])
            if spec.get("ResourceType") == "placement-group" for t in spec.get("Tags", [])]
    group = PlacementGroup(name=name, id=f"pg-{secrets.token_hex(9)[:17]}",
                           strategy=str(request.params.get("Strategy") or "cluster"), tags=tags)
    with _lock:
        _groups[(request.account, request.region, name)] = group
    return Answer(result={"PlacementGroup": group.describe()})


@answer("ec2", "DescribePlacementGroups")
def _describe(request: AwsRequest) -> Answer:
    groups = list(_mine(request).values())
    names = request.params.get("GroupNames")
    if names:
        groups = [g for g in groups if g.name in names]
    for spec in request.params.get("Filters", []):
        name = str(spec.get("Name", ""))
        if name.startswith("tag:"):
            key = name.removeprefix("tag:")
            groups = [g for g in groups if any(t["Key"] == key and t["Value"] in spec.get("Values", [])
                                               for t in g.tags)]
        elif name == "strategy":
            groups = [g for g in groups if g.strategy in spec.get("Values", [])]
    return Answer(result={"PlacementGroups": [g.describe() for g in groups]})


@answer("ec2", "DeletePlacementGroup")
def _delete(request: AwsRequest) -> Answer:
    name = str(request.params.get("GroupName", ""))
    with _lock:
        if _groups.pop((request.account, request.region, name), None) is None:
            raise Refusal("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
    return Answer(result={})


@check("ec2", "CreateFleet", "RunInstances")
def _known_group_in_one_zone(request: AwsRequest) -> None:
    groups = _mine(request)
    for name, zone in _placements(request):
        group = groups.get(name)
        if group is None:
            raise Refusal("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        if group.strategy == "cluster" and zone:
            if group.zone not in (None, zone):
                raise Refusal("InvalidParameterCombination", f"The placement group '{name}' is in Availability "
                              f"Zone {group.zone}; a cluster placement group cannot span Availability Zones.")
            group.zone = group.zone or zone


def _placements(request: AwsRequest) -> list[tuple[str, str | None]]:
    backend = request.moto_backend()

    def zone_of(subnet_id: str | None) -> str | None:
        try:
            return str(backend.get_subnet(subnet_id).availability_zone) if subnet_id else None
        except Exception:  # moto answers an unknown subnet itself
            return None

    out: list[tuple[str, str | None]] = []
    if request.action == "CreateFleet":
        for config in request.params.get("LaunchTemplateConfigs", []):
            for override in config.get("Overrides") or []:
                name = (override.get("Placement") or {}).get("GroupName")
                if name:
                    out.append((str(name), override.get("AvailabilityZone") or zone_of(override.get("SubnetId"))))
    else:
        name = (request.params.get("Placement") or {}).get("GroupName")
        if name:
            out.append((str(name), zone_of(request.params.get("SubnetId"))))
    return out

"""EC2's rules for launches (RunInstances, CreateFleet) that moto does not enforce.

Each rule cites the EC2 documentation it follows and answers with EC2's error code and message. They read
the request and moto's stored state (launch templates, snapshots, capacity reservations), nothing else.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.strict.core import Answer, AwsRequest, Refusal, ask_after, check

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.emulator.strict.core import Respond

__all__ = ["fleet_launch", "instant_fleet_refusing", "launch_template_data", "launch_template_specs",
           "spot_instances_requested", "zone_of_subnet"]


# ---- what a launch uses ------------------------------------------------------------------------------------


def launch_template_specs(request: AwsRequest) -> list[dict[str, Any]]:
    """Every `LaunchTemplateSpecification` the request launches from."""
    if request.action == "CreateFleet":
        return [c["LaunchTemplateSpecification"] for c in request.params.get("LaunchTemplateConfigs", [])
                if "LaunchTemplateSpecification" in c]
    spec = request.params.get("LaunchTemplate")
    return [spec] if spec else []


def launch_template_data(request: AwsRequest, spec: dict[str, Any]) -> dict[str, Any]:
    """The stored `LaunchTemplateData` of the version `spec` names, as moto keeps it (boto3's names);
    `{}` when the template is unknown (moto then answers with its own not-found error)."""
    backend = request.moto_backend()
    try:
        if spec.get("LaunchTemplateId"):
            template = backend.get_launch_template(spec["LaunchTemplateId"])
        else:
            template = backend.get_launch_template_by_name(spec.get("LaunchTemplateName", ""))
        version = template.get_version(spec.get("Version") or "$Default")
    except Exception:  # moto's own not-found errors: moto answers them
        return {}
    data = version.data
    return dict(data) if isinstance(data, dict) else {}



def fleet_launch(request: AwsRequest, item: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(template data, override) a CreateFleet answer's `Instances` item was launched from: the override of its
    instance type (and subnet, when the answer names one) and its config's template; None if none matches."""
    chosen = (item.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
    for config in request.params.get("LaunchTemplateConfigs", []):
        for override in config.get("Overrides") or []:
            same_type = override.get("InstanceType") == item.get("InstanceType")
            same_subnet = not chosen.get("SubnetId") or override.get("SubnetId") == chosen.get("SubnetId")
            if same_type and same_subnet:
                return launch_template_data(request, config.get("LaunchTemplateSpecification") or {}), override
    return None


def instant_fleet_refusing(respond: Respond, request: AwsRequest,
                           refuse: Callable[[dict[str, Any], dict[str, Any]], Refusal | None]) -> Answer | None:
    """An instant CreateFleet some of whose overrides EC2 refuses, answered as EC2 answers one: each refused override
    in `Errors` (its `LaunchTemplateAndOverrides`, `Lifecycle`, `ErrorCode`, `ErrorMessage`: CreateFleet's
    CreateFleetError), the others launched by what answers after `respond`, their instances and errors beside these;
    an empty fleet when it refuses them all; None when it refuses none. `refuse(override, data)`: EC2's refusal of
    one override (`{}` for a config without overrides), given its launch template's data, or None."""
    lifecycle = "spot" if spot_instances_requested(request) else "on-demand"
    errors: list[dict[str, Any]] = []
    configs: list[dict[str, Any]] = []
    for config in request.params.get("LaunchTemplateConfigs", []):
        spec = config.get("LaunchTemplateSpecification")
        data = launch_template_data(request, spec or {})
        kept = []
        for override in config.get("Overrides") or [{}]:
            refusal = refuse(override, data)
            if refusal is None:
                kept.append(override)
                continue
            errors.append({"LaunchTemplateAndOverrides": {"LaunchTemplateSpecification": spec, "Overrides": override},
                           "Lifecycle": lifecycle, "ErrorCode": refusal.code, "ErrorMessage": refusal.message})
        if kept:
            configs.append({**config, "Overrides": kept} if config.get("Overrides") else config)
    if not errors:
        return None
    if not configs:
        fleet_id = f"fleet-{secrets.token_hex(4)}-{secrets.token_hex(2)}-{secrets.token_hex(2)}-" \
                   f"{secrets.token_hex(2)}-{secrets.token_hex(6)}"
        return Answer(result={"FleetId": fleet_id, "Instances": [], "Errors": errors})
    rest = ask_after(respond, dataclasses.replace(request, params={**request.params, "LaunchTemplateConfigs": configs}))
    result = dict(rest.result or {})
    result["Errors"] = [*result.get("Errors", []), *errors]
    return Answer(result=result)

def spot_instances_requested(request: AwsRequest) -> bool:
    """Whether the request creates Spot Instances (and so Spot Instance requests)."""
    params = request.params
    if request.action == "CreateFleet":
        target = params.get("TargetCapacitySpecification", {})
        return target.get("DefaultTargetCapacityType") == "spot" or int(target.get("SpotTargetCapacity") or 0) > 0
    market = (params.get("InstanceMarketOptions") or {}).get("MarketType")
    if market is None:
        for spec in launch_template_specs(request):
            market = (launch_template_data(request, spec).get("InstanceMarketOptions") or {}).get("MarketType")
    return market == "spot"


def zone_of_subnet(request: AwsRequest, subnet_id: str | None) -> str | None:
    """The Availability Zone of a subnet moto knows; None for an unknown one (moto answers its own not-found)."""
    if not subnet_id:
        return None
    try:
        return str(request.moto_backend().get_subnet(subnet_id).availability_zone)
    except Exception:  # moto's own not-found: moto answers it
        return None


def _tag_resource_types(request: AwsRequest) -> set[str]:
    kinds = {s.get("ResourceType") for s in request.params.get("TagSpecifications", [])}
    for spec in launch_template_specs(request):
        kinds |= {s.get("ResourceType") for s in launch_template_data(request, spec).get("TagSpecifications", [])}
    return {k for k in kinds if k}


# ---- tags --------------------------------------------------------------------------------------------------


@check("ec2", "RunInstances", "CreateFleet")
def _spot_request_tags_need_spot(request: AwsRequest) -> None:
    # EC2 User Guide, "Tag Spot Instance requests" (spot-requests.html#concepts-spot-instances-request-tags):
    # the `spot-instances-request` resource type tags the Spot Instance request a launch creates; a launch
    # that creates none (On-Demand, reserved capacity) is refused, whether the tag specification is in the
    # request or in the launch template it uses (aws/karpenter-provider-aws keeps it in Spot templates only).
    if "spot-instances-request" in _tag_resource_types(request) and not spot_instances_requested(request):
        raise Refusal(
            "InvalidParameterValue",
            "You cannot specify tags for Spot instances requests if there are no Spot instances requests "
            "being created by the request",
        )


# ---- CreateFleet -------------------------------------------------------------------------------------------

_MAX_LAUNCH_TEMPLATE_CONFIGS = 50
"""EC2 API Reference, CreateFleet `LaunchTemplateConfigs`: "Array Members: Maximum number of 50 items"."""


def _options(params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, params[name]) for name in ("SpotOptions", "OnDemandOptions") if params.get(name)]


@check("ec2", "CreateFleet")
def _instant_fleet_limits(request: AwsRequest) -> None:
    # EC2 API Reference: CreateFleet (`LaunchTemplateConfigs`, at most 50), SpotOptionsRequest and
    # OnDemandOptionsRequest (`MinTargetCapacity`, `SingleInstanceType`, `SingleAvailabilityZone`:
    # "Supported only for fleets of type instant"; with MinTargetCapacity "at least one of the following must
    # be specified: SingleAvailabilityZone | SingleInstanceType"), ReservedCapacityOptionsRequest ("can only be
    # used if the EC2 Fleet is of type instant"; "you must also set DefaultTargetCapacityType to
    # reserved-capacity"). The messages are ours where EC2 documents only the code (InvalidParameterCombination:
    # "an incorrect combination of parameters, or a missing parameter", EC2 API Reference, Common error codes).
    params = request.params
    configs = params.get("LaunchTemplateConfigs", [])
    if len(configs) > _MAX_LAUNCH_TEMPLATE_CONFIGS:
        raise Refusal("InvalidParameterValue", f"The request contains {len(configs)} launch template configs; "
                      f"the maximum is {_MAX_LAUNCH_TEMPLATE_CONFIGS}.")
    instant = params.get("Type") == "instant"
    target = params.get("TargetCapacitySpecification", {})
    total = int(target.get("TotalTargetCapacity") or 0)
    for name, options in _options(params):
        instant_only = [k for k in ("MinTargetCapacity", "SingleInstanceType", "SingleAvailabilityZone")
                        if options.get(k) not in (None, False)]
        if instant_only and not instant:
            raise Refusal("InvalidParameterCombination",
                          f"{name}.{instant_only[0]} is supported only for fleets of type instant.")
        minimum = options.get("MinTargetCapacity")
        if minimum is None:
            continue
        if not (options.get("SingleInstanceType") or options.get("SingleAvailabilityZone")):
            raise Refusal("InvalidParameterCombination",
                          f"{name}.MinTargetCapacity requires SingleInstanceType or SingleAvailabilityZone.")
        if int(minimum) > total:
            raise Refusal("InvalidParameterValue", f"{name}.MinTargetCapacity ({minimum}) cannot be greater than "
                          f"TotalTargetCapacity ({total}).")
    reserved = params.get("ReservedCapacityOptions")
    if reserved is not None:
        if not instant:
            raise Refusal("InvalidParameterCombination",
                          "ReservedCapacityOptions is supported only for fleets of type instant.")
        if target.get("DefaultTargetCapacityType") != "reserved-capacity":
            raise Refusal("InvalidParameterCombination", "ReservedCapacityOptions requires "
                          "TargetCapacitySpecification.DefaultTargetCapacityType reserved-capacity.")
    elif target.get("DefaultTargetCapacityType") == "reserved-capacity":
        raise Refusal("InvalidParameterCombination",
                      "DefaultTargetCapacityType reserved-capacity requires ReservedCapacityOptions.")


# ---- EFA network interfaces --------------------------------------------------------------------------------


def _instance_type_info(request: AwsRequest, instance_type: str) -> dict[str, Any] | None:
    """EC2's description of a type (DescribeInstanceTypes), from moto's bundled data."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    info = INSTANCE_TYPES.get(instance_type)
    return dict(info) if info else None


def _launches(request: AwsRequest) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(instance type, merged launch data, override) for every way the request may launch: each CreateFleet
    override over its template's data, or RunInstances' parameters over its template's."""
    params = request.params
    out = []
    if request.action == "CreateFleet":
        for config in params.get("LaunchTemplateConfigs", []):
            data = launch_template_data(request, config.get("LaunchTemplateSpecification", {}))
            for override in config.get("Overrides") or [{}]:
                merged = {**data, **override}
                out.append((str(merged.get("InstanceType", "")), merged, override))
    else:
        stored: dict[str, Any] = {}
        for spec in launch_template_specs(request):
            stored = launch_template_data(request, spec)
        merged = {**stored, **{k: v for k, v in params.items() if k not in ("LaunchTemplate", "MinCount", "MaxCount")}}
        out.append((str(merged.get("InstanceType", "")), merged, {}))
    return out


@check("ec2", "RunInstances", "CreateFleet")
def _network_interfaces(request: AwsRequest) -> None:
    # EC2 User Guide, "Elastic Fabric Adapter": EFA only on supported instance types ("EfaSupported" in
    # DescribeInstanceTypes), at most `EfaInfo.MaximumEfaInterfaces` EFAs, one EFA per network card; network
    # card indexes below `MaximumNetworkCards`; the primary interface (device index 0) on network card 0.
    # EC2 API Reference, RunInstances `NetworkInterface.N`: "If you specify a network interface, you must
    # specify any security groups and subnets as part of the network interface", so instance-level security
    # groups and network interfaces together are refused.
    for instance_type, data, _ in _launches(request):
        interfaces = data.get("NetworkInterfaces") or []
        if not interfaces:
            continue
        if data.get("SecurityGroupIds") or data.get("SecurityGroups"):
            raise Refusal("InvalidParameterCombination",
                          "Network interfaces and an instance-level security groups may not be specified on "
                          "the same request")
        info = _instance_type_info(request, instance_type) if instance_type else None
        if info is None:
            continue
        network = info.get("NetworkInfo") or {}
        cards = int(network.get("MaximumNetworkCards") or 1)
        efas = [i for i in interfaces if i.get("InterfaceType") in ("efa", "efa-only")]
        if efas and not network.get("EfaSupported"):
            raise Refusal("InvalidParameterCombination",
                          f"The instance type '{instance_type}' does not support Elastic Fabric Adapter (EFA).")
        maximum = int((network.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 0)
        if len(efas) > maximum:
            raise Refusal("InvalidParameterValue", f"The instance type '{instance_type}' supports at most {maximum} "
                          f"EFA interfaces; the request specifies {len(efas)}.")
        used_cards: set[int] = set()
        primary = False
        for interface in interfaces:
            card = int(interface.get("NetworkCardIndex") or 0)
            device = int(interface.get("DeviceIndex") or 0)
            if card >= cards:
                raise Refusal("InvalidParameterValue", f"Network card index {card} is not valid for instance type "
                              f"'{instance_type}', which has {cards} network card(s).")
            if interface in efas:
                if card in used_cards:
                    raise Refusal("InvalidParameterValue",
                                  f"Only one EFA can be attached per network card; network card {card} has more.")
                used_cards.add(card)
            if device == 0:
                if card != 0:
                    raise Refusal("InvalidParameterValue",
                                  "The primary network interface (device index 0) must be on network card 0.")
                primary = True
        if not primary:
            raise Refusal("InvalidParameterValue", "A network interface with device index 0 is required.")


# ---- block device mappings ---------------------------------------------------------------------------------

_SIZES_GIB = {"gp2": (1, 16384), "gp3": (1, 16384), "io1": (4, 16384), "io2": (4, 65536),
              "st1": (125, 16384), "sc1": (125, 16384), "standard": (1, 1024)}
_IOPS = {"gp3": (3000, 16000), "io1": (100, 64000), "io2": (100, 256000)}


def _block_device_mappings(request: AwsRequest) -> list[dict[str, Any]]:
    if request.action == "CreateLaunchTemplate" or request.action == "CreateLaunchTemplateVersion":
        return list((request.params.get("LaunchTemplateData") or {}).get("BlockDeviceMappings") or [])
    out: list[dict[str, Any]] = []
    for _, data, _ in _launches(request):
        out.extend(data.get("BlockDeviceMappings") or [])
    return out


@check("ec2", "RunInstances", "CreateFleet", "CreateLaunchTemplate", "CreateLaunchTemplateVersion")
def _volumes(request: AwsRequest) -> None:
    # EC2 API Reference, LaunchTemplateEbsBlockDeviceRequest / EbsBlockDevice: `VolumeSize` per type (gp2, gp3
    # 1-16,384 GiB; io1 4-16,384; io2 4-65,536; st1, sc1 125-16,384; standard 1-1,024); "If you specify a
    # snapshot, the default is the snapshot size. You can specify a volume size that is equal to or larger than
    # the snapshot size"; `Iops` only for gp3 (3,000-16,000), io1 (100-64,000), io2 (100-256,000), required
    # for io1 and io2; `Throughput` only for gp3 (125-1,000 MiB/s); `SnapshotId` must exist
    # (InvalidSnapshot.NotFound, EC2 API Reference, Common error codes).
    snapshots = None
    for mapping in _block_device_mappings(request):
        ebs = mapping.get("Ebs")
        if not ebs:
            continue
        kind = ebs.get("VolumeType") or "gp2"
        size = ebs.get("VolumeSize")
        snapshot_id = ebs.get("SnapshotId")
        if snapshot_id:
            snapshots = snapshots if snapshots is not None else request.moto_backend().snapshots
            snapshot = snapshots.get(snapshot_id)
            if snapshot is None:
                raise Refusal("InvalidSnapshot.NotFound", f"The snapshot '{snapshot_id}' does not exist.")
            if size is not None and int(size) < int(snapshot.volume.size):
                raise Refusal("InvalidBlockDeviceMapping", f"Volume of size {size}GB is smaller than snapshot "
                              f"'{snapshot_id}', expect size >= {snapshot.volume.size}GB")
        elif size is None:
            raise Refusal("InvalidBlockDeviceMapping",
                          f"The device '{mapping.get('DeviceName')}' needs a volume size or a snapshot.")
        if size is not None and kind in _SIZES_GIB:
            low, high = _SIZES_GIB[kind]
            if not low <= int(size) <= high:
                raise Refusal("InvalidParameterValue", f"Volume size {size} GiB is out of range for {kind} "
                              f"volumes ({low}-{high} GiB).")
        iops = ebs.get("Iops")
        if iops is not None:
            if kind not in _IOPS:
                raise Refusal("InvalidParameterCombination", f"The parameter iops is not supported for {kind} volumes.")
            low, high = _IOPS[kind]
            if not low <= int(iops) <= high:
                raise Refusal("InvalidParameterValue",
                              f"Iops {iops} is out of range for {kind} volumes ({low}-{high}).")
        elif kind in ("io1", "io2"):
            raise Refusal("InvalidParameterCombination", f"The parameter iops must be specified for {kind} volumes.")
        throughput = ebs.get("Throughput")
        if throughput is not None and kind != "gp3":
            raise Refusal("InvalidParameterCombination",
                          f"The parameter throughput is not supported for {kind} volumes.")
        if throughput is not None and not 125 <= int(throughput) <= 1000:
            raise Refusal("InvalidParameterValue", f"Throughput {throughput} MiB/s is out of range for gp3 volumes "
                          "(125-1000).")

"""EC2's rules for launches (RunInstances, CreateFleet) that moto does not enforce.

Each rule cites the EC2 documentation it follows and answers with EC2's error code and message. They read
the request and moto's stored state (launch templates, snapshots, capacity reservations), nothing else.
"""

from __future__ import annotations

from typing import Any

from gpu_autoscaler.emulator.strict.core import AwsRequest, Refusal, check

__all__ = ["launch_template_data", "launch_template_specs", "spot_instances_requested"]


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

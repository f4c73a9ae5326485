"""EC2's vCPU quotas for GPU instances, which moto does not have, written from the AWS documentation.

What it implements, for an emulated account that set its quotas (`set_vcpu_quotas`; one that set none keeps moto's
answers: no EC2 quota at all):

- **The quotas.** EC2 limits the vCPUs of running instances per class and purchase option (EC2 User Guide,
  "On-Demand Instance quotas", "Spot Instance quotas"); Service Quotas (service code `ec2`) names the five GPU
  instances count against: L-DB2E81BA "Running On-Demand G and VT instances", L-417A185B "Running On-Demand P
  instances", L-3819A6DF "All G and VT Spot Instance Requests", L-7212CCBC "All P4, P3 and P2 Spot Instance
  Requests", L-C4BD4855 "All P5 Spot Instance Requests". GetServiceQuota answers a quota the account set with its
  value and its `UsageMetric` (Service Quotas API Reference, ServiceQuota and MetricInfo: "Information about the
  CloudWatch metric that reflects quota usage"; for these, namespace `AWS/Usage`, metric `ResourceCount`,
  dimensions Service `EC2`, Type `Resource`, Resource `vCPU` and Class `G/OnDemand`, `P/OnDemand`, `G/Spot`,
  `P/Spot`, `P5/Spot`, statistic `Maximum`, as `aws service-quotas list-service-quotas --service-code ec2` shows
  them); GetAWSDefaultServiceQuota the same value. One of the five the account did not set is
  `NoSuchResourceException`, as a quota the region does not have.
- **The usage.** "Service quota usage metrics are in the AWS/Usage namespace and are collected every minute"
  (CloudWatch User Guide, "AWS usage metrics"): `ResourceCount`, "the total number of the specified resource
  running on your account", here the vCPUs (`VCpuInfo.DefaultVCpus`) of the account's pending and running instances
  of each class: On-Demand `G/OnDemand` (G and VT), `P/OnDemand` (every P), Spot `G/Spot`, `P/Spot` (P2-P4),
  `P5/Spot` (P5); instances of other classes are not counted here. A Spot instance is one whose lifecycle is
  `spot`; any other (On-Demand, a capacity reservation's, a Capacity Block's) counts as On-Demand. They are put into
  moto's CloudWatch, timestamped at the start of the current minute (each datapoint a minute's), after every launch
  and before every CloudWatch request of the account: a reader finds the current minute's datapoint, its Maximum
  the most counted in it, as the every-minute collection would show it, with no publication lag (the decision
  code's rule for the lag then over-counts, never under-counts, here).
- **The refusal.** A launch that would take a set quota's usage past it is refused: On-Demand with
  `VcpuLimitExceeded`, "You have requested more vCPU capacity than your current vCPU limit of N allows for the
  instance bucket that the specified instance type belongs to. Please visit http://aws.amazon.com/contact-us/
  ec2-request to request an adjustment to this limit." (EC2's answer, quoted in scrapoxy/scrapoxy#202 and
  firesim/firesim#410); Spot with `MaxSpotInstanceCountExceeded`, "Max spot instance count exceeded" (EC2 API
  Reference, "Error codes for the Amazon EC2 API": "You've reached the limit on the number of Spot Instances that
  you can launch"). RunInstances is refused as a whole (its MinCount); an instant CreateFleet answers the error per
  override that would exceed it and launches the rest, as for any launch error ("EC2 Fleet request types").
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.moto_fixes import EC2_REQUESTS
from gpu_autoscaler.emulator.strict.core import Answer, Refusal, after, answer, before_any, check, on_reset
from gpu_autoscaler.emulator.strict.ec2 import (
    instant_fleet_refusing,
    launch_template_data,
    launch_template_specs,
    spot_instances_requested,
)
from gpu_autoscaler.emulator.strict.ec2_api_idempotency import create_fleet_once_per_token

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.emulator.strict.core import AwsRequest

__all__ = ["QUOTAS", "set_vcpu_quotas"]

QUOTAS: dict[str, tuple[str, str]] = {
    "L-DB2E81BA": ("Running On-Demand G and VT instances", "G/OnDemand"),
    "L-417A185B": ("Running On-Demand P instances", "P/OnDemand"),
    "L-3819A6DF": ("All G and VT Spot Instance Requests", "G/Spot"),
    "L-7212CCBC": ("All P4, P3 and P2 Spot Instance Requests", "P/Spot"),
    "L-C4BD4855": ("All P5 Spot Instance Requests", "P5/Spot"),
}
"""Quota code → (its name in Service Quotas, the `Class` of its usage metric)."""
_NAMESPACE = "AWS/Usage"
_METRIC = "ResourceCount"
_NO_SUCH_QUOTA = ("The request failed because the specified service does not exist or the specified quota does "
                  "not exist in this Region.")
_SPOT_LIMIT = "Max spot instance count exceeded"

_lock = threading.Lock()
_quotas: dict[tuple[str, str], dict[str, int]] = {}
_published: dict[tuple[str, str], set[str]] = {}
"""Per account and region, the classes given a datapoint so far (one that drops to no instance gets a 0)."""


@on_reset
def _forget() -> None:
    with _lock:
        _quotas.clear()
        _published.clear()


def set_vcpu_quotas(account: str, region: str, quotas: Mapping[str, int] | None) -> None:
    """The account's applied vCPU quotas in `region`, by quota code (of `QUOTAS`); the others are not there. None:
    back to moto's account, with no EC2 quota."""
    unknown = set(quotas or {}) - set(QUOTAS)
    if unknown:
        raise ValueError(f"not an EC2 GPU vCPU quota code: {sorted(unknown)}")
    with _lock:
        if quotas is None:
            _quotas.pop((account, region), None)
            _published.pop((account, region), None)
        else:
            _quotas[(account, region)] = dict(quotas)


def _set(account: str, region: str) -> dict[str, int] | None:
    with _lock:
        found = _quotas.get((account, region))
        return dict(found) if found is not None else None


# ---- classes ---------------------------------------------------------------------------------------------------

_LETTERS = re.compile(r"^([a-z]+)(\d*)")


def _class(instance_type: str, spot: bool) -> str | None:
    """The usage class an instance type counts in ("On-Demand Instance quotas": G and VT, P; "Spot Instance
    quotas": G and VT, P4/P3/P2, P5), None for the classes not emulated here."""
    found = _LETTERS.match(instance_type)
    if found is None:
        return None
    letters, generation = found.group(1), int(found.group(2) or 0)
    purchase = "Spot" if spot else "OnDemand"
    if letters.startswith("g") or letters == "vt":
        return f"G/{purchase}"
    if letters.startswith("p"):
        if not spot:
            return "P/OnDemand"
        return "P/Spot" if 2 <= generation <= 4 else "P5/Spot" if generation == 5 else None
    return None


def _vcpus(instance_type: str) -> int:
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    info = INSTANCE_TYPES.get(instance_type) or {}
    return int((info.get("VCpuInfo") or {}).get("DefaultVCpus") or 0)


def _backend(service: str, account: str, region: str) -> Any:
    from moto.backends import get_backend

    return get_backend(service)[account][region]  # type: ignore[call-overload]


def _usage(account: str, region: str) -> dict[str, int]:
    """vCPUs of the account's pending and running instances, by class."""
    out: dict[str, int] = {}
    with EC2_REQUESTS:  # moto's EC2 state, read while no EC2 request changes it
        reservations = list(_backend("ec2", account, region).reservations.values())
        instances = [(str(i.instance_type), i.lifecycle == "spot") for r in reservations for i in r.instances
                     if i.state in ("pending", "running")]
    for instance_type, spot in instances:
        cls = _class(instance_type, spot)
        if cls is not None:
            out[cls] = out.get(cls, 0) + _vcpus(instance_type)
    return out


# ---- Service Quotas --------------------------------------------------------------------------------------------


@answer("servicequotas", "GetServiceQuota", "GetAWSDefaultServiceQuota")
def _ec2_vcpu_quota(request: AwsRequest) -> Answer | None:
    quotas = _set(request.account, request.region)
    code = str(request.params.get("QuotaCode", ""))
    if quotas is None or request.params.get("ServiceCode") != "ec2" or code not in QUOTAS:
        return None
    if code not in quotas:
        raise Refusal("NoSuchResourceException", _NO_SUCH_QUOTA)
    name, cls = QUOTAS[code]
    return Answer(result={"Quota": {
        "ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
        "QuotaArn": f"arn:aws:servicequotas:{request.region}:{request.account}:ec2/{code}", "QuotaCode": code,
        "QuotaName": name, "Value": float(quotas[code]), "Unit": "None", "Adjustable": True, "GlobalQuota": False,
        "UsageMetric": {"MetricNamespace": _NAMESPACE, "MetricName": _METRIC,
                        "MetricDimensions": {"Class": cls, "Resource": "vCPU", "Service": "EC2", "Type": "Resource"},
                        "MetricStatisticRecommendation": "Maximum"},
    }}, content_type="application/x-amz-json-1.1")


# ---- the usage metrics -----------------------------------------------------------------------------------------


def _publish(account: str, region: str) -> None:
    key = (account, region)
    if _set(*key) is None:
        return
    usage = _usage(account, region)
    with _lock:
        classes = _published.setdefault(key, set())
        classes.update(usage)
        shown = sorted(classes)
    if not shown:
        return
    from moto.core.utils import utcnow

    now = utcnow().replace(second=0, microsecond=0)  # the minute's datapoint (moto keeps naive UTC timestamps)
    _backend("cloudwatch", account, region).put_metric_data(_NAMESPACE, [{
        "MetricName": _METRIC, "Value": float(usage.get(cls, 0)), "Timestamp": now, "Unit": "None",
        "Dimensions": [{"Name": "Class", "Value": cls}, {"Name": "Resource", "Value": "vCPU"},
                       {"Name": "Service", "Value": "EC2"}, {"Name": "Type", "Value": "Resource"}],
    } for cls in shown])


@before_any("monitoring")
def _collected_every_minute(account: str, region: str) -> None:
    _publish(account, region)


@after("ec2", "RunInstances", "CreateFleet")
def _after_launch(request: AwsRequest, result: dict[str, Any]) -> None:
    _publish(request.account, request.region)


# ---- the refusal -----------------------------------------------------------------------------------------------


def _too_many(request: AwsRequest, instance_type: str, count: int, spot: bool) -> Refusal | None:
    """EC2's refusal of `count` more instances of this type, or None where they fit (or no quota is set)."""
    quotas = _set(request.account, request.region)
    cls = _class(instance_type, spot)
    if quotas is None or cls is None:
        return None
    code = next((c for c, (_, c_cls) in QUOTAS.items() if c_cls == cls), None)
    if code is None or code not in quotas:
        return None
    if _usage(request.account, request.region).get(cls, 0) + count * _vcpus(instance_type) <= quotas[code]:
        return None
    if spot:
        return Refusal("MaxSpotInstanceCountExceeded", _SPOT_LIMIT)
    return Refusal("VcpuLimitExceeded", f"You have requested more vCPU capacity than your current vCPU limit of "
                   f"{quotas[code]} allows for the instance bucket that the specified instance type belongs to. "
                   "Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.")


@check("ec2", "RunInstances")
def _run_within_the_quota(request: AwsRequest) -> None:
    specs = launch_template_specs(request)
    data = launch_template_data(request, specs[0]) if specs else {}
    instance_type = str(request.params.get("InstanceType") or data.get("InstanceType") or "")
    refusal = _too_many(request, instance_type, int(request.params.get("MinCount") or 1),
                        spot_instances_requested(request)) if instance_type else None
    if refusal is not None:
        raise refusal


@answer("ec2", "CreateFleet", behind=create_fleet_once_per_token)
def _instant_fleet_within_the_quota(request: AwsRequest) -> Answer | None:
    if request.params.get("Type") != "instant" or _set(request.account, request.region) is None:
        return None
    spot = spot_instances_requested(request)
    count = int(request.params.get("TargetCapacitySpecification", {}).get("TotalTargetCapacity") or 1)

    def refuse(override: dict[str, Any], data: dict[str, Any]) -> Refusal | None:
        instance_type = str(override.get("InstanceType") or data.get("InstanceType") or "")
        return _too_many(request, instance_type, count, spot) if instance_type else None

    return instant_fleet_refusing(_instant_fleet_within_the_quota, request, refuse)

"""`gpu-autoscaler doctor`'s quota check with the account's usage: shown beside each quota, and a warning where what
the account's other instances use leaves less than a pool's smallest GPU type."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpu_autoscaler.cli.doctor_checks import check_quotas
from gpu_autoscaler.cli.doctor_context import DoctorContext
from gpu_autoscaler.domain.packing.quotas import QUOTA_CODES
from tests.unit.packing.builders import make_catalog, make_config, make_pool
from tests.unit.packing.fakes import FakeServiceQuotasClient

CLASSES = {"g/on-demand": "G/OnDemand", "p/on-demand": "P/OnDemand", "g/spot": "G/Spot", "p/spot": "P/Spot",
           "p5/spot": "P5/Spot"}


def _metric(cls: str) -> dict[str, Any]:
    return {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
            "MetricDimensions": {"Class": cls, "Resource": "vCPU", "Service": "EC2", "Type": "Resource"},
            "MetricStatisticRecommendation": "Maximum"}


class _Account:
    """Service Quotas with the five quotas and their usage metrics, CloudWatch answering `usage` by class, and EC2
    listing `ours` (instance type → count) as this cluster's running instances."""

    def __init__(self, quotas: dict[str, float], usage: dict[str, float], ours: dict[str, int] | None = None) -> None:
        self.quotas = FakeServiceQuotasClient({QUOTA_CODES[k]: v for k, v in quotas.items()},
                                              metrics={QUOTA_CODES[k]: _metric(CLASSES[k]) for k in quotas})
        self.usage, self.ours = usage, ours or {}

    def client(self, service: str) -> Any:
        account = self

        class CloudWatch:
            def get_metric_data(self, **kwargs: Any) -> dict[str, Any]:
                out = []
                for query in kwargs["MetricDataQueries"]:
                    dims = {d["Name"]: d["Value"] for d in query["MetricStat"]["Metric"]["Dimensions"]}
                    key = next(k for k, c in CLASSES.items() if c == dims["Class"])
                    at = datetime(2026, 11, 22, 10, tzinfo=UTC)
                    found = key in account.usage
                    out.append({"Id": query["Id"], "Timestamps": [at] if found else [],
                                "Values": [account.usage[key]] if found else []})
                return {"MetricDataResults": out}

        class Ec2:
            def get_paginator(self, name: str) -> Any:
                assert name == "describe_instances"

                class Pages:
                    def paginate(self, **kwargs: Any) -> list[dict[str, Any]]:
                        instances = [{"InstanceType": t} for t, n in account.ours.items() for _ in range(n)]
                        return [{"Reservations": [{"Instances": instances}]}]

                return Pages()

        return {"service-quotas": account.quotas, "cloudwatch": CloudWatch(), "ec2": Ec2()}[service]


CONFIG = make_config(make_pool(capacityTypes=["on-demand"], limits={"gpus": 4}),
                     make_pool("open", capacityTypes=["on-demand"]))


def _checks(account: _Account) -> dict[str, Any]:
    return {c.name: c for c in check_quotas(DoctorContext(CONFIG, account, make_catalog()))}  # type: ignore[arg-type]


def test_usage_is_shown_beside_each_quota() -> None:
    checks = _checks(_Account({"g/on-demand": 960, "p/on-demand": 2000}, {"g/on-demand": 100}))
    line = checks["vCPU quota gpu g/on-demand"]
    assert line.status == "pass" and "100 in use in the account" in line.detail
    assert "0 in use in the account" in checks["vCPU quota gpu p/on-demand"].detail  # no datapoint: nothing runs


def test_other_instances_leaving_less_than_the_smallest_type_warn_for_every_pool() -> None:
    """96 G vCPUs, 94 used by other instances: 2 left, less than g5.xlarge's 4. Our own nodes do not count as
    others' (the cluster's two g5.xlarge, 8 vCPUs, are part of the account's 102)."""
    checks = _checks(_Account({"g/on-demand": 96, "p/on-demand": 2000}, {"g/on-demand": 102},
                              ours={"g5.xlarge": 2}))
    for pool in ("gpu", "open"):
        room = checks[f"vCPU quota {pool} g/on-demand room"]
        assert room.status == "warn"
        assert "94 of 96 vCPUs in use by the account's other instances: 2 left" in room.detail
        assert "g5.xlarge, 4 vCPUs" in room.detail
        assert "--quota-code L-DB2E81BA --desired-value 98" in room.fix
    assert "vCPU quota gpu p/on-demand room" not in checks
    roomy = _checks(_Account({"g/on-demand": 96, "p/on-demand": 2000}, {"g/on-demand": 90}, ours={"g5.xlarge": 2}))
    assert "vCPU quota gpu g/on-demand room" not in roomy

"""The packer against an emulated account whose GPU quota other instances already use: Service Quotas and the
`AWS/Usage` metrics as the emulator answers them (written from the AWS docs, not from the packer's code), and the
plan staying within what those instances leave, which the emulated EC2 would otherwise refuse."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.adapters.aws.service_quotas import ServiceQuotasSource
from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.config import Config, parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.strict.ec2_vcpu_quotas import set_vcpu_quotas
from gpu_autoscaler.models.pods import PendingPodsDocument
from gpu_autoscaler.services.packer import PackerService
from tests.conftest import example_config_data
from tests.unit.packing.fakes import RecordingLaunchQueue

if TYPE_CHECKING:
    from collections.abc import Iterator

QUOTAS = {"L-DB2E81BA": 96, "L-417A185B": 0, "L-3819A6DF": 0, "L-7212CCBC": 0, "L-C4BD4855": 0}
"""G and VT On-Demand 96 vCPUs, nothing else."""


@pytest.fixture(scope="module")
def config() -> Config:
    data = example_config_data()
    data["nodePools"] = [{"name": "g5", "capacityTypes": ["on-demand"],
                          "requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In",
                                            "values": ["g5"]}],
                          "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]}]
    data.pop("scalingWindows", None)
    return parse_config(data)


@pytest.fixture(scope="module")
def aws(config: Config) -> Iterator[EmbeddedAws]:
    with EmbeddedAws(config) as embedded:
        yield embedded


def _document(config: Config, count: int) -> PendingPodsDocument:
    pods: list[dict[str, Any]] = [{
        "uid": f"pod-{i}", "namespace": "team", "name": f"pod-{i}",
        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
        "nodeSelector": {"node.kubernetes.io/instance-type": "g5.2xlarge"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    } for i in range(count)]
    return PendingPodsDocument.model_validate({"schemaVersion": 1, "cluster": config.cluster_name,
                                               "sentAt": datetime.now(UTC).isoformat(), "pods": pods})


def test_the_plan_stays_within_what_the_account_s_other_instances_leave(aws: EmbeddedAws, config: Config) -> None:
    account = str(aws.clients.client("sts").get_caller_identity()["Account"])
    set_vcpu_quotas(account, config.region, QUOTAS)
    ec2 = aws.clients.client("ec2")
    # Another workload of the account: a g5.16xlarge (64 vCPUs) nobody here launched or tagged.
    ec2.run_instances(ImageId=config.ami.x86_64, InstanceType="g5.16xlarge", MinCount=1, MaxCount=1)
    clock = SystemClock()
    quotas = ServiceQuotasSource(aws.clients.client("service-quotas"), config.vcpu_quotas,
                                 cloudwatch_client=aws.clients.client("cloudwatch"), clock=clock)
    assert quotas.vcpu_quotas()["g/on-demand"] == 96 and quotas.vcpu_usage()["g/on-demand"].vcpus == 64
    store = DynamoStateStore(aws.clients.client("dynamodb"), aws.resources.table_name, config.cluster_name,
                             clock=clock)
    catalog = Ec2CatalogSource.from_config(aws.clients, config, use_pricing_api=False)
    service = PackerService(config, store, catalog, RecordingLaunchQueue(), clock=clock, quotas=quotas)

    outcome = service.handle(_document(config, 6), source="m-1")

    assert len(outcome.created) == 4  # 4 g5.2xlarge, 8 vCPUs each: the 32 the other instance leaves
    assert all("vCPU quota g/on-demand" in u.reason for u in outcome.unschedulable)
    # The emulated EC2, the witness, takes those four and refuses a fifth.
    subnet = next(iter(aws.zone_subnets.values()))
    ec2.run_instances(ImageId=config.ami.x86_64, InstanceType="g5.2xlarge", MinCount=4, MaxCount=4, SubnetId=subnet)
    with pytest.raises(ClientError) as refused:
        ec2.run_instances(ImageId=config.ami.x86_64, InstanceType="g5.2xlarge", MinCount=1, MaxCount=1,
                          SubnetId=subnet)
    assert refused.value.response["Error"]["Code"] == "VcpuLimitExceeded"

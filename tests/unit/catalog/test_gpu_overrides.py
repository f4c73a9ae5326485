"""The GPU override table: one case per entry, checked against values written down here, not read from it."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from typing import Any

import pytest

from gpu_autoscaler.adapters.aws.instance_types import (
    GpuFacts,
    gpu_facts_from_api,
    instance_type_from_api,
    load_gpu_overrides,
)
from tests.unit.catalog.builders import make_gpu, raw_instance_type

# instance type: (physical GPUs, devices advertised, model, total GPU memory MiB)
EXPECTED = {
    "g6f.large": (0.125, 1, "L4", 2861),
    "g6f.xlarge": (0.125, 1, "L4", 2861),
    "g6f.2xlarge": (0.25, 1, "L4", 5722),
    "g6f.4xlarge": (0.5, 1, "L4", 11444),
    "gr6f.4xlarge": (0.5, 1, "L4", 11444),
    "p5.4xlarge": (1.0, 1, "H100", 81920),
}


def moto_instance_types() -> dict[str, Any]:
    """moto's bundled copy of real DescribeInstanceTypes answers."""
    path = resources.files("moto") / "ec2" / "resources" / "instance_types.json.gz"
    data: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
    return data


def test_every_table_entry_has_a_case_here() -> None:
    assert set(load_gpu_overrides()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_entry_corrects_a_zero_gpu_answer(name: str) -> None:
    gpus, devices, model, memory = EXPECTED[name]
    # What DescribeInstanceTypes said for these types: a GPU entry with Count 0 and nothing else to go on.
    wrong = raw_instance_type(name, gpus=[make_gpu(Name=model, Count=0, LogicalGpuCount=None, GpuPartitionSize=None,
                                                   MemoryInfo={"SizeInMiB": 0})], total_gpu_memory=0)
    api = gpu_facts_from_api(wrong)
    assert api is not None and api.gpus == 0 and api.gpu_devices == 0

    corrected = instance_type_from_api(wrong, load_gpu_overrides())

    assert (corrected.gpus, corrected.gpu_devices, corrected.gpu_model, corrected.gpu_memory_mib) == (
        gpus, devices, model, memory)
    assert corrected.gpu_manufacturer == "NVIDIA"
    assert corrected.is_gpu
    assert corrected.labels["karpenter.k8s.aws/instance-gpu-count"] == str(devices)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_entry_supplies_missing_gpu_info(name: str) -> None:
    gpus, devices, model, memory = EXPECTED[name]
    corrected = instance_type_from_api(raw_instance_type(name, gpus=[]), load_gpu_overrides())
    assert (corrected.gpus, corrected.gpu_devices, corrected.gpu_model, corrected.gpu_memory_mib) == (
        gpus, devices, model, memory)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_entry_agrees_with_what_the_api_now_states(name: str) -> None:
    """Where the API's own fields (LogicalGpuCount × GpuPartitionSize) give the answer, the table must match it."""
    raw = moto_instance_types()[name]
    facts = gpu_facts_from_api(raw)
    assert facts is not None
    gpus, devices, model, memory = EXPECTED[name]
    assert (facts.gpus, facts.gpu_devices, facts.gpu_model, facts.gpu_memory_mib) == (gpus, devices, model, memory)
    disagreements: list[str] = []
    instance_type_from_api(raw, load_gpu_overrides(), on_disagreement=lambda n, api, table: disagreements.append(n))
    assert disagreements == []


def test_partition_is_read_from_the_api_without_the_table() -> None:
    raw = raw_instance_type("g6f.large", vcpus=2, gpus=[
        make_gpu(Count=0, LogicalGpuCount=1, GpuPartitionSize=0.125, MemoryInfo={"SizeInMiB": 2861})])
    derived = instance_type_from_api(raw, overrides={})
    assert (derived.gpus, derived.gpu_devices, derived.gpu_memory_mib) == (0.125, 1, 2861)


def test_whole_gpus_come_from_count() -> None:
    raw = raw_instance_type("g5.12xlarge", vcpus=48, gpus=[
        make_gpu(Name="A10G", Count=4, LogicalGpuCount=4, MemoryInfo={"SizeInMiB": 22888})], total_gpu_memory=91552)
    parsed = instance_type_from_api(raw, overrides={})
    assert (parsed.gpus, parsed.gpu_devices, parsed.gpu_model, parsed.gpu_memory_mib) == (4, 4, "A10G", 91552)


def test_type_without_gpu_is_not_a_gpu_type() -> None:
    parsed = instance_type_from_api(raw_instance_type("m5.large", gpus=[]), overrides={})
    assert (parsed.gpus, parsed.gpu_devices, parsed.gpu_model, parsed.is_gpu) == (0, 0, None, False)


def test_a_different_nonzero_api_answer_is_reported_and_the_table_wins() -> None:
    table = {"g6f.large": GpuFacts(0.125, 1, "L4", "NVIDIA", 2861)}
    raw = raw_instance_type("g6f.large", gpus=[make_gpu(Count=1, MemoryInfo={"SizeInMiB": 22888})])
    reported: list[tuple[str, GpuFacts, GpuFacts]] = []
    parsed = instance_type_from_api(raw, table, on_disagreement=lambda *args: reported.append(args))
    assert parsed.gpus == 0.125
    assert [(name, api.gpus, kept.gpus) for name, api, kept in reported] == [("g6f.large", 1.0, 0.125)]


def test_other_api_fields_are_read() -> None:
    raw = raw_instance_type("g5g.xlarge", vcpus=4, memory_mib=8192, architectures=("arm64",), efa=True,
                            usage_classes=("on-demand",))
    parsed = instance_type_from_api(raw, overrides={})
    assert (parsed.vcpu, parsed.memory_mib, parsed.architecture, parsed.efa) == (4, 8192, "arm64", True)
    assert parsed.capacity_types == ("reserved", "on-demand")
    assert parsed.labels["kubernetes.io/arch"] == "arm64"

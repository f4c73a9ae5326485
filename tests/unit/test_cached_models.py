"""A frozen model's copy with changed fields computes its cached properties afresh (`models.cached`)."""

from __future__ import annotations

from gpu_autoscaler.models.catalog import InstanceType
from gpu_autoscaler.models.cluster import ClusterNode
from gpu_autoscaler.models.pods import PendingPod


def test_a_pod_copied_with_other_requests_has_their_resources() -> None:
    pod = PendingPod(uid="u", name="web", requests={"cpu": "1"})
    assert pod.resources == {"cpu": 1000} and pod.footprint == {"cpu": 1000, "pods": 1}
    copy = pod.model_copy(update={"requests": {"cpu": "2"}})
    assert copy.resources == {"cpu": 2000} and copy.footprint == {"cpu": 2000, "pods": 1}
    assert pod.model_copy().footprint is pod.footprint, "a plain copy keeps what the same fields gave"


def test_a_node_copied_with_another_provider_id_has_its_instance_id() -> None:
    node = ClusterNode(name="a", provider_id="aws:///us-east-1a/i-1")
    assert node.instance_id == "i-1"
    assert node.model_copy(update={"provider_id": "aws:///us-east-1a/i-2"}).instance_id == "i-2"


def test_an_instance_type_copied_with_another_name_has_its_family() -> None:
    g5 = InstanceType(name="g5.xlarge", vcpu=4, memory_mib=16384)
    assert g5.family == "g5"
    assert g5.model_copy(update={"name": "g6.xlarge"}).family == "g6"

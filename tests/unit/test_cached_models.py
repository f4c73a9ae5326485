"""A frozen model's copy with changed fields computes its cached properties afresh (`models.cached`)."""

from __future__ import annotations

from functools import cached_property

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


def test_a_subclass_copy_forgets_its_own_cached_properties_and_its_bases() -> None:
    class Labelled(ClusterNode):
        @cached_property
        def shout(self) -> str:
            return self.name.upper()

    node = Labelled(name="a", provider_id="aws:///us-east-1a/i-1")
    assert (node.shout, node.instance_id) == ("A", "i-1")
    # The base class's names, found first, are not the subclass's: each class has its own.
    ClusterNode(name="b").model_copy(update={"name": "c"})
    copy = node.model_copy(update={"name": "b", "provider_id": "aws:///us-east-1a/i-2"})
    assert (copy.shout, copy.instance_id) == ("B", "i-2")

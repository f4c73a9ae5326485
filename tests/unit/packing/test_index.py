"""Node label matching over the catalog, vectorised: every operator, absent labels, pool labels."""

from __future__ import annotations

import pytest

from gpu_autoscaler.domain.catalog import ANY
from gpu_autoscaler.domain.packing.index import CatalogIndex
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.requirements import Requirement
from tests.unit.packing.builders import TYPES, make_catalog, make_type


@pytest.fixture(scope="module")
def index() -> CatalogIndex:
    return CatalogIndex(make_catalog())


def matched(index: CatalogIndex, requirement: Requirement, fixed: dict[str, str] | None = None) -> set[str]:
    mask = index.requirement_mask(requirement, fixed or {})
    return {index.offerings[i].instance_type for i in range(len(index)) if mask[i]}


def labels_of(index: CatalogIndex, i: int) -> dict[str, str]:
    o = index.offerings[i]
    out = dict(index.catalog.instance_type(o.instance_type).labels)
    out.update({L.ZONE: o.zone, L.CAPACITY_TYPE: o.capacity_type, "kubernetes.io/os": "linux"})
    return out


@pytest.mark.parametrize("requirement", [
    Requirement(key=L.INSTANCE_GPU_NAME, operator="In", values=("h100", "a100")),
    Requirement(key=L.INSTANCE_FAMILY, operator="NotIn", values=("g5",)),
    Requirement(key=L.INSTANCE_GPU_COUNT, operator="Gt", values=("4",)),
    Requirement(key=L.INSTANCE_GPU_MEMORY, operator="Lt", values=("30000",)),
    Requirement(key=L.CAPACITY_TYPE, operator="In", values=("spot",)),
    Requirement(key=L.ZONE, operator="NotIn", values=("us-east-1a",)),
    Requirement(key=L.INSTANCE_GPU_NAME, operator="Exists"),
    Requirement(key="example.com/absent", operator="DoesNotExist"),
    Requirement(key="example.com/absent", operator="NotIn", values=("x",)),
    Requirement(key="example.com/absent", operator="Exists"),
    Requirement(key="example.com/absent", operator="Gt", values=("1",)),
    Requirement(key=L.INSTANCE_GENERATION, operator="Gt", values=("4",)),
])
def test_masks_agree_with_requirement_matches(index: CatalogIndex, requirement: Requirement) -> None:
    mask = index.requirement_mask(requirement, {})
    for i in range(len(index)):
        assert bool(mask[i]) == requirement.matches(labels_of(index, i)), index.offerings[i].key


def test_operators_pick_the_expected_types(index: CatalogIndex) -> None:
    assert matched(index, Requirement(key=L.INSTANCE_GPU_COUNT, operator="Gt", values=("4",))) == {
        "g5.48xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge"}
    assert matched(index, Requirement(key="example.com/absent", operator="DoesNotExist")) == {
        o.instance_type for o in index.offerings}
    assert matched(index, Requirement(key="example.com/absent", operator="Exists")) == set()


def test_pool_labels_override_and_answer_for_every_offering(index: CatalogIndex) -> None:
    requirement = Requirement(key="team", operator="In", values=("ml",))
    assert matched(index, requirement, {"team": "ml"}) == {o.instance_type for o in index.offerings}
    assert matched(index, requirement, {"team": "web"}) == set()
    assert matched(index, requirement) == set()


def test_excluded_marks_unavailable_offerings(index: CatalogIndex) -> None:
    mask = index.excluded([("p5.48xlarge", "us-east-1a", "spot"), ("nope", "us-east-1a", "spot")])
    assert [index.offerings[i].key for i in range(len(index)) if mask[i]] == [("p5.48xlarge", "us-east-1a", "spot")]


def test_excluded_marks_whole_capacity_types_and_zones(index: CatalogIndex) -> None:
    def marked(keys: list[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
        mask = index.excluded(keys)
        return {index.offerings[i].key for i in range(len(index)) if mask[i]}

    assert marked([(ANY, ANY, "spot")]) == {o.key for o in index.offerings if o.capacity_type == "spot"}
    assert marked([(ANY, "us-east-1a", "on-demand")]) == {
        o.key for o in index.offerings if (o.zone, o.capacity_type) == ("us-east-1a", "on-demand")}
    assert marked([(ANY, "us-east-1z", "spot")]) == set()


def test_excluded_marks_a_reservation_by_its_id_alone() -> None:
    """A reservation's record names it (type, zone, reservation id): two reservations of one type and zone are
    masked apart (`domain.catalog.is_excluded`)."""
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.models.catalog import Offering

    def reservation(reservation_id: str, kind: str) -> Offering:
        return Offering(instance_type="p5.48xlarge", zone="us-east-1a", capacity_type="reserved",
                        price_per_hour=5.5e-6, reservation_id=reservation_id, reservation_type=kind)

    index = CatalogIndex(Catalog([make_type("p5.48xlarge")], [reservation("cr-0aaa", "default"),
                                                               reservation("cr-0bbb", "capacity-block")]))

    def marked(keys: list[tuple[str, str, str]]) -> list[str | None]:
        mask = index.excluded(keys)
        return [index.offerings[i].reservation_id for i in range(len(index)) if mask[i]]

    assert marked([("p5.48xlarge", "us-east-1a", "cr-0aaa")]) == ["cr-0aaa"]
    assert marked([("p5.48xlarge", "us-east-1a", "reserved")]) == ["cr-0aaa", "cr-0bbb"]  # an older record


def test_karpenters_cpu_and_memory_labels_select_types(index: CatalogIndex) -> None:
    """Karpenter labels every node with its type's vCPUs (`instance-cpu`, EC2's DefaultVCpus) and memory in MiB
    (`instance-memory`, MemoryInfo.SizeInMiB; karpenter-provider-aws pkg/providers/instancetype/types.go), and
    NodePools select on them: without them, `instance-cpu Gt 95` would hold no type at all."""
    assert matched(index, Requirement(key="karpenter.k8s.aws/instance-cpu", operator="Gt", values=("95",))) == {
        name for name, row in TYPES.items() if row[0] > 95}
    assert matched(index, Requirement(key="karpenter.k8s.aws/instance-memory", operator="Lt", values=("32768",))) == {
        name for name, row in TYPES.items() if row[1] < 32768}


def test_every_label_a_type_gives_is_one_a_requirement_may_name(index: CatalogIndex) -> None:
    """The configuration refuses requirements on labels no node carries (`NODE_LABEL_KEYS`): a label a type gives
    and that list lacked would be refused while the packer matched it."""
    given = set().union(*(t.labels for t in index.catalog.instance_types()))
    assert given == L.TYPE_LABEL_KEYS

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler_agent.selection import (
    GroupRef,
    PodSelector,
    group_ref,
    is_unschedulable,
    requests_gpus,
    resolve_group,
    tolerates_gpu_pool,
)
from tests.unit.agent.builders import container, make_pod

if TYPE_CHECKING:
    from gpu_autoscaler.models.pods import PodGroup

SELECTOR = PodSelector(["nvidia.com/gpu", "gpu-autoscaler/shared"])


class FakeGroups:
    """Answers from dicts, and records what it was asked."""

    def __init__(self, min_members: dict[str, int] | None = None, counts: dict[str, int] | None = None) -> None:
        self.min_members = min_members or {}
        self.counts = counts or {}
        self.asked: list[tuple[str, str]] = []

    def min_member(self, ref: GroupRef) -> int | None:
        self.asked.append(("minMember", ref.name))
        return self.min_members.get(ref.name)

    def member_count(self, ref: GroupRef) -> int | None:
        self.asked.append(("members", ref.name))
        return self.counts.get(ref.name)

    def workload_size(self, ref: GroupRef) -> int | None:
        """No Kueue-managed Jobs here (the port's third question; none of these gangs is a Job or JobSet)."""
        self.asked.append(("workload", ref.name))
        return None


def resolved(ref: GroupRef, source: FakeGroups) -> PodGroup:
    """`resolve_group` for a gang these tests know it reports (None is only for Jobs Kueue does not manage)."""
    group = resolve_group(ref, source)
    assert group is not None
    return group


def test_an_unschedulable_gpu_pod_is_reported() -> None:
    assert SELECTOR.reportable(make_pod(gpus=1))


def test_a_cpu_only_pod_is_never_reported() -> None:
    pod = make_pod(gpus=None, tolerations=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}])
    assert not SELECTOR.reportable(pod)


def test_a_tolerate_everything_pod_without_gpus_is_cpu_only() -> None:
    assert not SELECTOR.reportable(make_pod(gpus=None, tolerations=[{"operator": "Exists"}]))


@pytest.mark.parametrize("key", ["nvidia.com/gpu", "gpu-autoscaler/shared"])
def test_a_pod_tolerating_a_gpu_pool_taint_is_reported_without_a_gpu_request(key: str) -> None:
    pod = make_pod(gpus=None, tolerations=[{"key": key, "operator": "Exists", "effect": "NoSchedule"}])
    assert SELECTOR.reportable(pod)


def test_a_prefer_no_schedule_toleration_does_not_make_a_gpu_pod() -> None:
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "PreferNoSchedule"}]
    assert not tolerates_gpu_pool(make_pod(gpus=None, tolerations=tolerations), ["nvidia.com/gpu"])


def test_gpus_in_limits_only_count() -> None:
    assert requests_gpus(make_pod(gpus=2, gpu_in="limits"))


def test_mig_slices_count_as_gpus() -> None:
    pod = make_pod(gpus=None, extra_requests={"nvidia.com/mig-1g.10gb": "1"})
    assert SELECTOR.reportable(pod)


def test_zero_gpus_is_not_a_gpu_request() -> None:
    assert not requests_gpus(make_pod(gpus=0))


def test_a_gpu_init_container_counts() -> None:
    pod = make_pod(gpus=None, init_containers=[container("warmup", gpu="1")])
    assert requests_gpus(pod)


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}, True),
        ({"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}, False),
        ({"type": "PodScheduled", "status": "True"}, False),
        ({"type": "Ready", "status": "False", "reason": "Unschedulable"}, False),
    ],
)
def test_only_the_unschedulable_reason_counts(condition: dict[str, str], expected: bool) -> None:
    assert is_unschedulable(make_pod(condition=condition)) is expected


def test_a_pod_the_scheduler_has_not_tried_yet_is_not_reported() -> None:
    assert not SELECTOR.reportable(make_pod(unschedulable=False))


@pytest.mark.parametrize(
    "overrides",
    [
        {"node_name": "ip-10-0-0-1"},
        {"nominated_node": "ip-10-0-0-2"},
        {"deleting": True},
        {"phase": "Failed"},
        {"owner_kind": "DaemonSet"},
    ],
)
def test_pods_new_capacity_cannot_help_are_not_reported(overrides: dict[str, object]) -> None:
    assert not SELECTOR.reportable(make_pod(**overrides))  # type: ignore[arg-type]


def test_a_job_owned_pod_is_reported() -> None:
    assert SELECTOR.reportable(make_pod(owner_kind="Job"))


def test_kueue_gang_takes_its_size_from_the_total_count_annotation() -> None:
    pod = make_pod(labels={"kueue.x-k8s.io/pod-group-name": "train-42"},
                   annotations={"kueue.x-k8s.io/pod-group-total-count": "8"})
    ref = group_ref(pod)
    assert ref == GroupRef("kueue", "team-a", "train-42", 8)
    groups = FakeGroups()
    group = resolved(ref, groups)
    assert (group.name, group.min_member) == ("train-42", 8)
    assert groups.asked == []


def test_kueue_gang_without_a_count_falls_back_to_its_labelled_members() -> None:
    ref = group_ref(make_pod(labels={"kueue.x-k8s.io/pod-group-name": "g"}))
    assert ref is not None
    assert resolved(ref, FakeGroups(counts={"g": 3})).min_member == 3


def test_coscheduling_gang_takes_min_member_from_its_pod_group() -> None:
    ref = group_ref(make_pod(labels={"scheduling.x-k8s.io/pod-group": "nginx"}))
    assert ref == GroupRef("coscheduling", "team-a", "nginx")
    groups = FakeGroups(min_members={"nginx": 3}, counts={"nginx": 5})
    assert resolved(ref, groups).min_member == 3
    assert groups.asked == [("minMember", "nginx")]


def test_coscheduling_gang_without_a_pod_group_counts_its_members() -> None:
    ref = group_ref(make_pod(labels={"scheduling.x-k8s.io/pod-group": "nginx"}))
    assert ref is not None
    assert resolved(ref, FakeGroups(counts={"nginx": 4})).min_member == 4


def test_volcano_gang_prefers_its_min_member_annotation() -> None:
    pod = make_pod(annotations={"scheduling.k8s.io/group-name": "pg", "scheduling.volcano.sh/group-min-member": "9"})
    ref = group_ref(pod)
    assert ref == GroupRef("volcano", "team-a", "pg", 9)
    assert resolved(ref, FakeGroups(min_members={"pg": 2})).min_member == 9


def test_volcano_gang_reads_its_pod_group_and_defaults_to_one() -> None:
    ref = group_ref(make_pod(annotations={"scheduling.k8s.io/group-name": "pg"}))
    assert ref is not None
    assert resolved(ref, FakeGroups(min_members={"pg": 2})).min_member == 2
    assert resolved(ref, FakeGroups()).min_member == 1


def test_a_bad_gang_size_annotation_is_ignored() -> None:
    pod = make_pod(labels={"kueue.x-k8s.io/pod-group-name": "g"},
                   annotations={"kueue.x-k8s.io/pod-group-total-count": "many"})
    ref = group_ref(pod)
    assert ref is not None and ref.min_member is None


def test_a_pod_without_gang_markers_has_no_group() -> None:
    assert group_ref(make_pod(labels={"app": "x"})) is None

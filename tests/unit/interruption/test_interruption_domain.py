from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.domain.interruption import NoticeKind, UnknownEvent, decide, parse_notice
from gpu_autoscaler.models.claims import NodeClaim
from tests.conftest import SHARED_DATA

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def real_event(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SHARED_DATA / "aws-events" / name).read_text())
    return data


def make_claim(**overrides: Any) -> NodeClaim:
    values: dict[str, Any] = {"cluster": "ml-prod", "id": "c-1", "pool": "gpu-burst", "capacity_type": "spot",
                              "zones": ("us-east-1b",), "instance_types": ("g6.xlarge",), "price_per_hour": 0.3,
                              "created_at": NOW, "instance_id": "i-0b662ef9931388ba0"}
    values.update(overrides)
    return NodeClaim(**values)


def test_real_spot_warning_gives_two_minute_deadline() -> None:
    notice = parse_notice(real_event("spot_interruption_warning.json"))
    assert notice.kind is NoticeKind.SPOT_INTERRUPTION
    assert notice.instance_ids == ("i-0b662ef9931388ba0",)
    assert notice.deadline == notice.time + timedelta(minutes=2)


def test_real_health_event_parses_rfc1123_start() -> None:
    notice = parse_notice(real_event("aws_health_scheduled_change.json"))
    assert notice.kind is NoticeKind.SCHEDULED_CHANGE
    assert notice.instance_ids == ("i-12345678",)
    assert notice.deadline == datetime(2016, 6, 5, 15, 10, 9, tzinfo=UTC)


def test_pending_state_is_not_acted_on() -> None:
    with pytest.raises(UnknownEvent, match="pending"):
        parse_notice(real_event("ec2_state_change.json"))


def test_broken_event_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not an EventBridge event"):
        parse_notice({"detail-type": "EC2 Spot Instance Interruption Warning"})


def test_spot_warning_is_involuntary_replace_and_drain(config: Config) -> None:
    notice = parse_notice(real_event("spot_interruption_warning.json"))
    now = notice.time
    response = decide(notice, "i-0b662ef9931388ba0", make_claim(), config.pool("gpu-burst"), now)
    assert response.cordon_now and response.replace and response.mark_unavailable and response.involuntary
    assert not response.wait_for_replacement
    assert response.drain_deadline is not None and now < response.drain_deadline < now + timedelta(minutes=2)


def test_rebalance_replaces_first_or_is_ignored(config: Config) -> None:
    notice = parse_notice(real_event("rebalance_recommendation.json"))
    pool = config.pool("gpu-burst")
    response = decide(notice, "i-0b662ef9931388ba0", make_claim(), pool, NOW)
    assert response.replace and response.wait_for_replacement and not response.involuntary
    assert response.wait_until == NOW + pool.disruption.rebalance_drain_after
    assert response.drain_deadline == NOW + pool.disruption.rebalance_drain_after + timedelta(minutes=30)
    ignoring = pool.model_copy(update={"disruption": pool.disruption.model_copy(update={"rebalance": "ignore"})})
    assert not decide(notice, "i-0b662ef9931388ba0", make_claim(), ignoring, NOW).drain


def test_spot_warning_keeps_the_instance_until_aws_takes_it(config: Config) -> None:
    notice = parse_notice(real_event("spot_interruption_warning.json"))
    response = decide(notice, "i-0b662ef9931388ba0", make_claim(), config.pool("gpu-burst"), notice.time)
    assert response.terminate_after == notice.deadline


def test_a_scheduled_change_is_involuntary_and_a_rebalance_carries_the_pools_grace(config: Config) -> None:
    """Only an involuntary deadline may override budgets; a voluntary drain forces nothing unless its pool's
    terminationGracePeriod says so."""
    health = parse_notice(real_event("aws_health_scheduled_change.json"))
    assert decide(health, health.instance_ids[0], make_claim(), config.pool("gpu-burst"), NOW).involuntary
    pool = config.pool("gpu-burst").model_copy(update={"termination_grace_period": timedelta(hours=1)})
    rebalance = decide(parse_notice(real_event("rebalance_recommendation.json")), "i-0b662ef9931388ba0",
                       make_claim(), pool, NOW)
    assert not rebalance.involuntary and rebalance.termination_grace_period == timedelta(hours=1)


def test_a_scheduled_change_already_started_still_gives_its_pods_an_eviction_window(config: Config) -> None:
    """A Health scheduled change whose start has passed (an update of a change under way, a notice redriven from the
    dead-letter queue) still names an instance that runs: Karpenter and aws-node-termination-handler drain it
    gracefully. Its pods are evicted within `EVICTION_WINDOW`, not deleted at once with a second's grace."""
    from gpu_autoscaler.domain.interruption import EVICTION_WINDOW

    health = parse_notice(real_event("aws_health_scheduled_change.json"))
    assert health.deadline is not None
    late = health.deadline + timedelta(hours=1)
    response = decide(health, health.instance_ids[0], make_claim(), config.pool("gpu-burst"), late)
    assert response.involuntary and response.cordon_now
    assert response.drain_deadline == late + EVICTION_WINDOW and response.wait_until == late


def test_state_change_closes_the_claim(config: Config) -> None:
    event = real_event("ec2_state_change.json")
    event["detail"]["state"] = "terminated"
    response = decide(parse_notice(event), "i-abcd1111", make_claim(), config.pool("gpu-burst"), NOW)
    assert response.close and not response.drain


def test_reservation_interruption_uses_termination_time(config: Config) -> None:
    event = {"version": "0", "id": "e-1", "detail-type": "EC2 Capacity Reservation Instance Interruption Warning",
             "source": "aws.ec2", "time": "2026-11-22T10:00:00Z",
             "detail": {"instance-id": "i-0abc", "instance-action": "terminate",
                        "instance-termination-time": "2026-11-22T10:02:00Z", "azId": "use1-az1"}}
    notice = parse_notice(event)
    assert notice.deadline == datetime(2026, 11, 22, 10, 2, tzinfo=UTC)
    response = decide(notice, "i-0abc", make_claim(instance_id="i-0abc"), config.pool("gpu-reserved"), NOW)
    assert response.involuntary and response.cordon_now and response.replace


def test_replacement_pods_keep_requests_and_placement_and_skip_daemonsets() -> None:
    from gpu_autoscaler.domain.interruption import replacement_pods
    from gpu_autoscaler.models.cluster import ClusterPod
    from gpu_autoscaler.models.requirements import NodeSelectorTerm
    from gpu_autoscaler.models.resources import Resources
    from gpu_autoscaler.models.taints import Toleration

    requests = Resources.from_quantities({"cpu": "1500m", "memory": "3Gi", "nvidia.com/gpu": "2"})
    term = NodeSelectorTerm.model_validate(
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]})
    pod = ClusterPod(uid="u-1", namespace="ml", name="train-0", node_name="n", requests=requests, phase="Running",
                     node_selector={"karpenter.k8s.aws/instance-gpu-name": "l4"}, required_node_affinity=(term,),
                     tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),), priority=7,
                     annotations={"karpenter.sh/do-not-disrupt": "true"}, owner_kind="Job")
    daemon = ClusterPod(uid="u-2", namespace="kube-system", name="dp", node_name="n", owner_kind="DaemonSet")
    (pending,) = replacement_pods([pod, daemon])
    assert pending.resources == requests
    assert pending.node_selector == pod.node_selector and pending.required_node_affinity == (term,)
    assert pending.tolerations == pod.tolerations and pending.priority == 7 and pending.do_not_disrupt


def test_a_replacement_is_planned_only_where_the_pods_volumes_can_attach() -> None:
    """A StatefulSet pod whose EBS volume lives in us-east-1a, on a Spot node there that gets its warning: the
    recreated pod can only run where the volume attaches (kube-scheduler's VolumeBinding filter), so its
    replacement must not list offerings in another zone, even with the interrupted 1a offering unavailable.
    Karpenter plans disrupted pods through the provisioner, which pins them to their volumes' zones
    (`getVolumeTopologyRequirements`, pkg/controllers/provisioning/provisioner.go)."""
    from gpu_autoscaler.clock import FixedClock
    from gpu_autoscaler.domain.interruption import replacement_pods
    from gpu_autoscaler.domain.packing import Solver
    from gpu_autoscaler.models.cluster import ClusterPod
    from gpu_autoscaler.models.resources import Resources
    from gpu_autoscaler.models.taints import Toleration
    from tests.unit.packing import builders

    pod = ClusterPod(uid="u-1", namespace="ml", name="notebook-0", node_name="n", phase="Running",
                     requests=Resources.from_quantities({"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}),
                     tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),), owner_kind="StatefulSet",
                     volume_claims=("home-notebook-0",), volume_zones=("us-east-1a",))
    (pending,) = replacement_pods([pod])
    assert pending.volume_zones == ("us-east-1a",)
    config = builders.make_config(builders.make_pool(capacityTypes=["spot", "on-demand"]))
    result = Solver(config, builders.make_catalog(), FixedClock(builders.NOW)).solve(
        [pending], unavailable=[("g6.xlarge", "us-east-1a", "spot")])
    assert result.claims and {z for c in result.claims for z in c.zones} == {"us-east-1a"}


def test_a_replacement_honours_the_pods_preferred_node_affinity() -> None:
    """Karpenter lets an interrupted node's pods go Pending and provisions for them with their preferences taken as
    required first (preferences.go `Relax`): a pod that prefers On-Demand, on a Spot node that gets its warning, is
    given an On-Demand node. A Spot replacement would take it for good: once it joins, kube-scheduler binds the
    evicted pod to the only node with room, preference or not."""
    from gpu_autoscaler.clock import FixedClock
    from gpu_autoscaler.domain.interruption import replacement_pods
    from gpu_autoscaler.domain.packing import Solver
    from gpu_autoscaler.models.cluster import ClusterPod
    from gpu_autoscaler.models.requirements import PreferredSchedulingTerm
    from gpu_autoscaler.models.resources import Resources
    from gpu_autoscaler.models.taints import Toleration
    from tests.unit.packing import builders

    prefer = PreferredSchedulingTerm.model_validate({"weight": 100, "preference": {"matchExpressions": [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}})
    pod = ClusterPod(uid="u-1", namespace="ml", name="llm-0", node_name="n", phase="Running",
                     requests=Resources.from_quantities({"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}),
                     tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),), owner_kind="ReplicaSet",
                     preferred_node_affinity=(prefer,))
    (pending,) = replacement_pods([pod])
    assert pending.preferred_node_affinity == (prefer,)
    config = builders.make_config(builders.make_pool(capacityTypes=["spot", "on-demand"]))
    result = Solver(config, builders.make_catalog(), FixedClock(builders.NOW)).solve([pending])
    assert [c.capacity_type for c in result.claims] == ["on-demand"]


@pytest.mark.parametrize("detail_type", ["Capacity Block Reservation Expiration Warning",
                                         "Capacity Block Expiration Warning"])
def test_a_capacity_block_warning_names_the_reservation_and_ec2_acts_30_minutes_before_its_end(
        config: Config, detail_type: str) -> None:
    event = {"version": "0", "id": "e-cb", "detail-type": detail_type, "source": "aws.ec2",
             "time": "2026-11-22T11:20:00Z", "resources": ["arn:aws:ec2:us-east-1:1:capacity-reservation/cr-0cb"],
             "detail": {"capacity-reservation-id": "cr-0cb", "end-date": "2026-11-22T12:00:00Z"}}
    notice = parse_notice(event)
    assert notice.kind is NoticeKind.CAPACITY_BLOCK_EXPIRY
    assert notice.instance_ids == () and notice.reservation_id == "cr-0cb"
    assert notice.deadline == datetime(2026, 11, 22, 11, 30, tzinfo=UTC)  # termination starts 30 min before the end
    claim = make_claim(instance_id="i-0cb", reservation_id="cr-0cb")
    response = decide(notice, "i-0cb", claim, config.pool("gpu-reserved"), datetime(2026, 11, 22, 11, 20, tzinfo=UTC))
    assert response.involuntary and response.cordon_now and response.replace and response.mark_unavailable
    assert response.drain_deadline is not None and response.drain_deadline < notice.deadline


def test_the_interruptible_reservation_warning_is_read_in_both_spellings() -> None:
    for detail_type in ("EC2 Capacity Reservation Instance Interruption Warning",
                        "EC2 Interruptible Capacity Reservation Instance Interruption Warning"):
        event = {"version": "0", "id": "e-1", "detail-type": detail_type, "source": "aws.ec2",
                 "time": "2026-11-22T10:00:00Z",
                 "detail": {"instance-id": "i-0abc", "instance-action": "terminate",
                            "instance-termination-time": "2026-11-22T10:02:00Z", "azId": "use1-az1"}}
        assert parse_notice(event).kind is NoticeKind.RESERVATION_INTERRUPTION


def test_replacement_pods_keep_the_anti_affinity_on_the_node_that_counts_themselves() -> None:
    """Replicas that repel each other on the node, recreated elsewhere, each need a node of their own: the packer
    gives them one (`PendingPod.pod_anti_affinity`, the terms the agent sends of pending pods). A term that counts
    other pods only is not one the packer reads (consolidation weighs it against the nodes' pods)."""
    from gpu_autoscaler.domain.interruption import replacement_pods
    from gpu_autoscaler.models.cluster import ClusterPod
    from gpu_autoscaler.models.pods import PodAntiAffinity

    mine = PodAntiAffinity.model_validate({"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": {"app": "web"}}})
    theirs = PodAntiAffinity.model_validate({"topologyKey": "kubernetes.io/hostname",
                                             "labelSelector": {"matchLabels": {"app": "db"}}})
    pod = ClusterPod(uid="u-1", namespace="ml", name="web-0", node_name="n", phase="Running", labels={"app": "web"},
                     pod_anti_affinity=(mine, theirs))
    (pending,) = replacement_pods([pod])
    assert pending.pod_anti_affinity == (mine,)

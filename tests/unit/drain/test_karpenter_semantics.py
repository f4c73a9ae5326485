"""The drain as Karpenter's termination controller drains: initialized replacements, no forced deletion in a
voluntary drain without a terminationGracePeriod, tiers, terminating pods, volumes, Spot timing, do-not-disrupt
durations and the node-level annotation (issue 15 items 3, 4, 6, 7)."""

from __future__ import annotations

from datetime import timedelta

from gpu_autoscaler.domain.drain import DRAIN_TAINT, DrainAction, plan_drain
from gpu_autoscaler.domain.packing.results import REQUESTS_ATTRIBUTE
from gpu_autoscaler.errors import KubernetesApiError
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.cluster import VolumeAttachment
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint, Toleration
from tests.unit.drain.builders import NOW, make_claim, make_node, make_pod, make_request
from tests.unit.drain.test_drain_service import NODE, Harness

NEW = "ip-10-0-2-9.ec2.internal"
CRITICAL = "system-cluster-critical"


def _with_replacement(h: Harness, **node: object) -> None:
    """A replacement claim made for one GPU, Registered, its Node Ready (with `node`'s overrides)."""
    h.store.create_claim(make_claim(id="c-2", instance_id="i-0bbb", node_name=NEW, state=ClaimState.REGISTERED,
                                    attributes={REQUESTS_ATTRIBUTE: '{"nvidia.com/gpu":1}'}))
    h.cluster.add_node(make_node(NEW, instance_id="i-0bbb", **node))


# Item 3: initialized, not merely Ready


def test_a_ready_replacement_whose_gpus_are_not_advertised_yet_is_waited_for() -> None:
    h = Harness("web-0")
    _with_replacement(h, allocatable=Resources.from_quantities({"cpu": "8", "memory": "32Gi"}))
    request = make_request(replacement_claim_id="c-2", wait_until=NOW + timedelta(minutes=10))
    first = h.drain(request, budget=timedelta(0))
    assert first.status == "continued" and first.reason == "replacement not initialized yet"
    assert h.cluster.calls.evicted == [] and h.cluster.calls.cordoned == []
    h.cluster.update_node(NEW, allocatable=Resources.from_quantities({"cpu": "8", "memory": "32Gi",
                                                                      "nvidia.com/gpu": "1"}))
    h.clock.advance(first.delay or timedelta(0))
    (message,) = h.queue.receive()
    assert h.drain(message).status == "finished" and h.cluster.calls.evicted == ["team-a/web-0"]


def test_a_replacement_still_carrying_an_ephemeral_taint_is_not_initialized() -> None:
    h = Harness("web-0")
    _with_replacement(h, taints=(Taint(key="node.cloudprovider.kubernetes.io/uninitialized", value="true"),))
    outcome = h.drain(make_request(replacement_claim_id="c-2", wait_until=NOW + timedelta(minutes=10)),
                      budget=timedelta(0))
    assert outcome.reason == "replacement not initialized yet" and h.cluster.calls.evicted == []


def test_a_replacement_still_carrying_a_node_readiness_taint_is_not_initialized() -> None:
    """Karpenter takes every taint under `readiness.k8s.io/` as ephemeral (`KnownEphemeralTaintKeyPrefixes`): the
    Node Readiness Controller puts one per rule on a node until the rule holds (kubernetes.io blog, 2026-02-03)."""
    h = Harness("web-0")
    _with_replacement(h, taints=(Taint(key="readiness.k8s.io/gpu-driver-ready", effect="NoSchedule"),))
    outcome = h.drain(make_request(replacement_claim_id="c-2", wait_until=NOW + timedelta(minutes=10)),
                      budget=timedelta(0))
    assert outcome.reason == "replacement not initialized yet" and h.cluster.calls.evicted == []


# Item 4: a voluntary drain never forces, unless the pool's terminationGracePeriod says so


def test_a_voluntary_drain_blocked_by_a_budget_never_deletes_past_its_deadline() -> None:
    h = Harness("web-0")
    h.cluster.add_blocker(lambda pod: "PDB never lets go")
    outcomes = h.run_until_done(make_request(reason="consolidation", deadline=NOW + timedelta(minutes=5)), limit=40)
    assert h.clock.now() > NOW + timedelta(minutes=20)
    assert outcomes[-1].status == "continued" and all(o.deleted == [] for o in outcomes)
    assert h.cluster.calls.deleted_pods == [] and h.fleet.terminated == [] and h.cluster.calls.deleted_nodes == []
    assert all(o.delay is not None and o.delay <= timedelta(seconds=60) for o in outcomes)


def test_a_voluntary_drain_with_the_api_down_past_its_deadline_does_not_terminate() -> None:
    h = Harness("web-0")
    h.cluster.fail_next("list_nodes", KubernetesApiError("Kubernetes API unreachable", None))
    outcome = h.drain(make_request(deadline=NOW - timedelta(minutes=1)), budget=timedelta(0))
    assert outcome.status == "continued" and h.fleet.terminated == []


def test_a_termination_grace_period_deletes_blocked_pods_in_time_for_their_grace() -> None:
    """terminationGracePeriod 10m from the cordon: a pod with a 120 s grace is deleted at 8 min, PDB or not."""
    h = Harness("web-0", termination_grace_period_seconds=120)
    h.cluster.add_blocker(lambda pod: "PDB never lets go")
    request = make_request(reason="drift", deadline=NOW + timedelta(minutes=1), termination_grace_period="10m")
    outcomes = h.run_until_done(request)
    assert outcomes[-1].status == "finished" and h.cluster.calls.deleted_pods == ["team-a/web-0"]
    assert h.cluster.calls.delete_graces == [120]
    assert NOW + timedelta(minutes=8) <= h.clock.now() < NOW + timedelta(minutes=9)


# Item 6: what a drain waits for, in which order, and when the instance may go


def test_pods_tolerating_the_drain_taint_are_left_and_do_not_hold_the_node() -> None:
    h = Harness("web-0")
    h.cluster.add_pod(make_pod("agent-0", tolerations=(Toleration(operator="Exists"),)))
    outcome = h.drain(make_request())
    assert outcome.status == "finished" and h.cluster.calls.evicted == ["team-a/web-0"]


def test_a_terminating_pod_is_not_evicted_again_but_waited_for() -> None:
    pods = [make_pod("web-0", deletion_timestamp=NOW + timedelta(seconds=20))]
    step = plan_drain(make_request(), make_node(), pods, NOW)
    assert step.action is DrainAction.EVICT and step.evict == () and step.reason == "waiting for pods to terminate"


def test_a_pod_stuck_terminating_past_a_minute_counts_as_gone() -> None:
    pods = [make_pod("web-0", deletion_timestamp=NOW - timedelta(seconds=61))]
    step = plan_drain(make_request(), make_node(), pods, NOW)
    assert step.action is DrainAction.FINISH and step.reason == "node is empty"


def test_critical_pods_and_daemonset_pods_are_evicted_after_the_others() -> None:
    pods = [make_pod("dns-0", priority_class_name=CRITICAL), make_pod("ds-0", owner_kind="DaemonSet"),
            make_pod("web-0"), make_pod("ds-critical", owner_kind="DaemonSet", priority_class_name=CRITICAL)]
    order = []
    while True:
        step = plan_drain(make_request(), make_node(taints=(DRAIN_TAINT,), unschedulable=True), pods, NOW)
        if step.action is not DrainAction.EVICT:
            break
        order.append([p.name for p in step.evict])
        pods = [p for p in pods if p not in step.evict]
    assert order == [["web-0"], ["ds-0"], ["dns-0"], ["ds-critical"]]


def test_the_instance_waits_for_its_volumes_to_detach() -> None:
    h = Harness("web-0")
    h.cluster.attach(VolumeAttachment(name="csi-abc", node_name=NODE, persistent_volume="pv-1", claim="team-a/data"))
    first = h.drain(make_request())
    assert first.status == "continued" and "csi-abc" in first.reason and h.fleet.terminated == []
    h.cluster.detach("csi-abc")
    h.clock.advance(first.delay or timedelta(0))
    (message,) = h.queue.receive()
    assert h.drain(message).status == "finished" and h.fleet.terminated


def test_a_volume_of_a_pod_that_stays_does_not_hold_the_instance() -> None:
    h = Harness("web-0")
    h.cluster.add_pod(make_pod("agent-0", owner_kind="DaemonSet", tolerations=(Toleration(operator="Exists"),),
                               volume_claims=("state",)))
    h.cluster.attach(VolumeAttachment(name="csi-abc", node_name=NODE, persistent_volume="pv-1",
                                      claim="team-a/state"))
    assert h.drain(make_request()).status == "finished"


def test_a_spot_node_is_not_terminated_before_aws_reclaims_it() -> None:
    h = Harness("web-0")
    action = NOW + timedelta(minutes=2)
    outcomes = h.run_until_done(make_request(involuntary=True, deadline=action - timedelta(seconds=30),
                                             wait_until=NOW, terminate_after=action))
    assert outcomes[0].evicted == ["team-a/web-0"] and outcomes[0].status == "continued"
    assert outcomes[-1].status == "finished" and h.clock.now() == action and h.fleet.terminated


# Item 7: do-not-disrupt durations and the node-level annotation


def test_a_do_not_disrupt_duration_protects_until_the_pod_has_run_that_long() -> None:
    young = make_pod("train-0", annotations={"karpenter.sh/do-not-disrupt": "30m"},
                     started_at=NOW - timedelta(minutes=10))
    assert plan_drain(make_request(), make_node(), [young], NOW).action is DrainAction.ABANDON
    old = young.model_copy(update={"started_at": NOW - timedelta(minutes=31)})
    step = plan_drain(make_request(), make_node(), [old], NOW)
    assert step.action is DrainAction.EVICT and step.evict == (old,)


def test_an_unreadable_do_not_disrupt_value_is_as_if_absent() -> None:
    pod = make_pod("train-0", annotations={"karpenter.sh/do-not-disrupt": "forever"})
    assert plan_drain(make_request(), make_node(), [pod], NOW).action is DrainAction.EVICT


def test_a_node_annotated_do_not_disrupt_is_left_by_a_voluntary_drain_not_by_an_involuntary_one() -> None:
    node = make_node(annotations={"karpenter.sh/do-not-disrupt": "true"})
    voluntary = plan_drain(make_request(), node, [make_pod()], NOW)
    assert voluntary.action is DrainAction.ABANDON and "do-not-disrupt" in voluntary.reason
    assert plan_drain(make_request(involuntary=True), node, [make_pod()], NOW).action is DrainAction.EVICT


def test_a_terminating_pod_needs_no_room_elsewhere_unless_a_statefulset_waits_for_it() -> None:
    from gpu_autoscaler.domain.interruption import replacement_pods

    going = NOW + timedelta(seconds=20)
    pods = [make_pod("web-0", deletion_timestamp=going),
            make_pod("db-0", owner_kind="StatefulSet", deletion_timestamp=going), make_pod("web-1")]
    assert sorted(p.name for p in replacement_pods(pods)) == ["db-0", "web-1"]

"""Consolidation taints what it chooses at once, and acts only on a decision that still holds a tick later
(issue 15 item 5; Karpenter's `karpenter.sh/disrupted:NoSchedule` taint and 15-second validation)."""

from __future__ import annotations

from datetime import timedelta

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.disruption_marks import DISRUPTION_ATTRIBUTE, PROPOSAL_TTL, proposal
from gpu_autoscaler.domain.drain import DRAIN_TAINT
from gpu_autoscaler.models.labels import DO_NOT_DISRUPT
from tests.unit.consolidation.builders import NOW, Cluster, make_config, make_pool, pool_config
from tests.unit.consolidation.test_service import Rig


def _scene() -> tuple[Rig, str]:
    scene = Cluster(pool_config())
    big = scene.node("g5.48xlarge")
    scene.pod(big, gpus=4, cpu="16", memory="64Gi")
    return Rig(scene), big


def _tainted(rig: Rig, node: str) -> bool:
    found = rig.kube.get_node(node)
    assert found is not None
    return DRAIN_TAINT in found.taints and not found.unschedulable


def test_a_chosen_node_is_tainted_at_once_and_nothing_else_happens_until_validated() -> None:
    rig, big = _scene()
    first = rig.service.run()
    assert [d.nodes for d in first.proposed] == [(big,)] and first.acted == []
    assert _tainted(rig, big)  # no new pod lands on it from now on
    assert rig.journal.entries == []  # no replacement launched, no drain asked for
    pending = proposal(rig.claim(big))
    assert pending is not None and pending.validate_after == NOW + timedelta(seconds=15)

    again = rig.service.run()  # a tick before the validation delay: it waits
    assert again.acted == [] and again.rejected == [] and again.proposed == []

    rig.clock.advance(timedelta(minutes=1))
    validated = rig.service.run()
    assert [d.nodes for d in validated.acted] == [(big,)]
    assert [what for what, _ in rig.journal.entries] == ["launch", "drain"]
    assert proposal(rig.claim(big)) is None and _tainted(rig, big)  # the drain's mark now; taint kept


def test_a_decision_that_no_longer_holds_is_dropped_and_the_taint_comes_off() -> None:
    rig, big = _scene()
    rig.service.run()
    assert _tainted(rig, big)
    rig.kube.add_pod(rig.scene.pod(big, gpus=0, annotations={DO_NOT_DISRUPT: "true"}))
    rig.clock.advance(timedelta(minutes=1))
    outcome = rig.service.run()
    assert outcome.acted == [] and [r.nodes for r in outcome.rejected] == [(big,)]
    assert "do-not-disrupt" in outcome.rejected[0].reason
    assert not _tainted(rig, big) and DISRUPTION_ATTRIBUTE not in rig.claim(big).attributes
    assert rig.journal.entries == []


def test_a_proposal_no_tick_validated_lapses_and_its_taint_comes_off() -> None:
    rig, big = _scene()
    rig.service.run()
    rig.kube.add_pod(rig.scene.pod(big, gpus=0, annotations={DO_NOT_DISRUPT: "true"}))  # not proposed again
    rig.clock.advance(PROPOSAL_TTL + timedelta(seconds=1))
    outcome = rig.service.run()
    assert outcome.untainted == [big] and not _tainted(rig, big) and outcome.acted == []


def test_a_do_not_disrupt_duration_protects_only_until_it_has_run_out() -> None:
    scene = Cluster(pool_config())
    big = scene.node("g5.48xlarge")
    scene.pod(big, gpus=4, cpu="16", memory="64Gi", annotations={DO_NOT_DISRUPT: "2h"},
              started_at=NOW - timedelta(hours=1))
    rig = Rig(scene)
    assert rig.service.run().result.skipped[big].startswith("do-not-disrupt")
    rig.clock.advance(timedelta(hours=1, minutes=1))
    assert [d.nodes for d in rig.service.run().proposed] == [(big,)]


def test_a_node_annotated_do_not_disrupt_is_not_consolidated() -> None:
    scene = Cluster(pool_config())
    big = scene.node("g5.48xlarge", node_annotations={DO_NOT_DISRUPT: "true"})
    scene.pod(big, gpus=4, cpu="16", memory="64Gi")
    outcome = Rig(scene).service.run()
    assert outcome.proposed == [] and outcome.result.skipped[big] == "do-not-disrupt: the node is annotated"


def test_a_node_whose_gpus_are_not_advertised_is_not_a_candidate() -> None:
    """Karpenter's candidates are initialized nodes: here the claim was made for 4 GPUs the node does not show."""
    scene = Cluster(pool_config())
    big = scene.node("g5.48xlarge", attributes={"requests": '{"nvidia.com/gpu":4}'})
    scene.pod(big, gpus=4, cpu="16", memory="64Gi")
    outcome = Rig(scene).service.run()
    assert outcome.proposed == [] and outcome.result.skipped[big].startswith("not initialized: nvidia.com/gpu")


def test_a_pod_that_arrives_while_a_proposal_waits_gets_the_node_back() -> None:
    """Karpenter's validation drops a candidate nominated for a pending pod meanwhile: the node is the pod's, not
    removed and bought again a minute later."""
    scene = Cluster(pool_config(consolidateAfter="5m", emptyKeepLeadTimes=0))
    empty = scene.node("g5.12xlarge", empty_for=timedelta(minutes=30))
    rig = Rig(scene)
    rig.service.run()  # the service notes it empty from now
    rig.clock.advance(timedelta(minutes=6))
    assert [d.nodes for d in rig.service.run().proposed] == [(empty,)]
    assert _tainted(rig, empty)  # the arriving pod cannot land on it
    rig.kube.add_pod(scene.pod(None, gpus=1))
    rig.clock.advance(timedelta(minutes=1))
    outcome = rig.service.run()
    assert outcome.acted == [] and [r.nodes for r in outcome.rejected] == [(empty,)]
    assert outcome.rejected[0].reason.startswith(f"{empty}: nominated: pending pod")
    assert not _tainted(rig, empty) and rig.journal.entries == []


def test_a_drift_with_a_termination_grace_period_holds_through_a_do_not_disrupt_pod_and_its_drain_says_so() -> None:
    """Karpenter validates drift with the Eventual class too: a do-not-disrupt pod arriving on a drifted node whose
    pool has a terminationGracePeriod keeps the decision, and the drain request is marked eventual so the drain
    starts rather than refusing (the pod is held until the grace period has run)."""
    scene = Cluster(make_config(make_pool(disruption={"budgets": [{"nodes": "100%"}]}, terminationGracePeriod="1h")))
    old = scene.node("g6.xlarge", capacity_type="spot", attributes={"imageId": "ami-0000000000000000a"})
    scene.pod(old)
    rig = Rig(scene)
    assert [d.reason for d in rig.service.run().proposed] == ["Drifted"]
    rig.kube.add_pod(scene.pod(old, gpus=0, annotations={DO_NOT_DISRUPT: "true"}))
    rig.clock.advance(timedelta(minutes=1))
    outcome = rig.service.run()
    assert [d.nodes for d in outcome.acted] == [(old,)] and outcome.rejected == []
    [drain] = rig.sent("drain")
    assert drain.eventual and drain.termination_grace_period == timedelta(hours=1)


def test_a_consolidation_drain_is_not_eventual() -> None:
    rig, big = _scene()
    rig.decide()
    [drain] = rig.sent("drain")
    assert not drain.eventual


BEFORE_NINE = NOW.replace(hour=8, minute=59, second=30)


def test_a_budget_that_closes_between_proposal_and_validation_drops_the_decision() -> None:
    """Karpenter's validation builds the budgets again (`BuildDisruptionBudgetMapping`) and drops a command whose
    pool allows no more: proposed at 08:59:30, a `nodes: "0"` budget from 09:00 holds it back at 09:00:30."""
    office = [{"nodes": "0", "schedule": "0 9 * * *", "duration": "8h"}, {"nodes": "100%"}]
    scene = Cluster(pool_config(budgets=office), clock=FixedClock(BEFORE_NINE))
    big = scene.node("g5.48xlarge")
    scene.pod(big, gpus=4, cpu="16", memory="64Gi")
    rig = Rig(scene)
    assert [d.nodes for d in rig.service.run().proposed] == [(big,)]
    rig.clock.advance(timedelta(minutes=1))
    outcome = rig.service.run()
    assert outcome.acted == [] and [r.nodes for r in outcome.rejected] == [(big,)]
    assert outcome.rejected[0].reason.startswith("budget: pool gpu")
    assert not _tainted(rig, big) and rig.journal.entries == []


def test_a_proposal_does_not_count_against_its_own_budget_but_the_others_do() -> None:
    """As in Karpenter, where a command's candidates are not yet marked for deletion while it is validated: a
    budget of one node validates the one node proposed; two proposed under a budget of two that became one are
    each checked with the budget the ones validated before them left — the first goes on, the second is dropped."""
    scene = Cluster(pool_config(budgets=[{"nodes": "1"}]))
    big = scene.node("g5.48xlarge")
    scene.pod(big, gpus=4, cpu="16", memory="64Gi")
    rig = Rig(scene)
    assert [d.nodes for d in rig.decide().acted] == [(big,)]

    shrinking = [{"nodes": "1", "schedule": "0 9 * * *", "duration": "8h"}, {"nodes": "2"}]
    scene = Cluster(pool_config(budgets=shrinking, consolidateAfter="5m", emptyKeepLeadTimes=0),
                    clock=FixedClock(BEFORE_NINE - timedelta(minutes=6)))
    first, second = scene.node("g5.12xlarge"), scene.node("g5.12xlarge")
    rig = Rig(scene)
    rig.service.run()  # the service notes them empty from now
    rig.clock.set(BEFORE_NINE)
    assert sorted(n for d in rig.service.run().proposed for n in d.nodes) == sorted([first, second])
    rig.clock.advance(timedelta(minutes=1))
    outcome = rig.service.run()
    assert len(outcome.acted) == 1 and len(outcome.rejected) == 1
    assert outcome.rejected[0].reason.startswith("budget: pool gpu")


def test_the_drift_of_a_pool_gone_from_the_configuration_is_validated_without_its_budgets() -> None:
    """A gone pool's nodes drift bound by no budget (its budgets went with it): their proposal is validated and
    carried out on the next tick, not looked up among the configured pools' budgets."""
    scene = Cluster(pool_config(budgets=[{"nodes": "0"}]))
    retired = scene.node("g5.12xlarge", pool="retired")
    rig = Rig(scene)
    assert [(d.reason, d.nodes) for d in rig.service.run().proposed] == [("Drifted", (retired,))]
    rig.clock.advance(timedelta(minutes=1))
    outcome = rig.service.run()
    assert [(d.reason, d.nodes) for d in outcome.acted] == [("Drifted", (retired,))] and outcome.rejected == []

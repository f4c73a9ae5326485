"""Hand-made traces whose right answers are known: one pod, one gang, a Spot interruption, a scaling window."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.simulation.engine import PolicyRun
from gpu_autoscaler.simulation.policies import build_policy
from tests.unit.simulation.builders import make_catalog, make_config, make_pod, make_pool, make_trace, settings

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.simulation.metrics import RunResult
    from gpu_autoscaler.simulation.trace import Trace

PACK, QUEUE, BOOT, SLOW_BOOT = 10.0, 2.0, 300.0, 600.0
"""Agent batching, queue delay and boot time of the default settings (p4d boots slower)."""


def _run(trace: Trace, config: Config, catalog: Catalog, policy: str = "ours",
         **overrides: Any) -> tuple[PolicyRun, RunResult]:
    run = PolicyRun(build_policy(policy, config, catalog, trace.pods), trace, catalog, settings(**overrides))
    return run, run.run()


def test_one_pod_waits_for_one_node_and_pays_for_it() -> None:
    catalog = make_catalog(spot=False)
    trace = make_trace(make_pod(arrival=100.0, duration=3600.0))
    run, result = _run(trace, make_config(), catalog)
    launched = 100.0 + PACK + QUEUE
    ready = launched + BOOT
    (instance,) = run.cloud.instances.values()
    assert instance.instance_type.name == "g4dn.xlarge"
    assert instance.launched_at == pytest.approx(launched)
    assert result.waits == [pytest.approx(ready - 100.0)]
    assert result.end == pytest.approx(ready + 3600.0)
    assert result.cost == pytest.approx(0.526 * (ready + 3600.0 - launched) / 3600)
    assert result.lower_bound == pytest.approx(0.526)
    assert result.gpu_allocation == pytest.approx(3600.0 / (ready + 3600.0 - launched))
    assert result.never_ran == {}
    assert result.interruptions == 0


def test_a_gang_launches_whole_in_one_zone_and_starts_together() -> None:
    catalog = make_catalog()
    big: dict[str, Any] = {"gpus": 8, "cpu": 64000, "memory": 600_000, "gang": "train", "gang_size": 2}
    trace = make_trace(*(make_pod(i, arrival=0.0, duration=7200.0, **big) for i in range(2)))
    run, result = _run(trace, make_config(), catalog)
    instances = list(run.cloud.instances.values())
    assert [i.instance_type.name for i in instances] == ["p4d.24xlarge", "p4d.24xlarge"]
    assert len({i.zone for i in instances}) == 1
    assert {i.launched_at for i in instances} == {PACK + QUEUE}
    assert run.cloud.create_fleet_calls == 1, "one all-or-nothing request for the whole gang"
    assert result.waits == [pytest.approx(PACK + QUEUE + SLOW_BOOT)] * 2
    assert {p.first_started for p in run.pods} == {PACK + QUEUE + SLOW_BOOT}


def test_an_incomplete_gang_is_never_provisioned() -> None:
    catalog = make_catalog()
    lonely = make_pod(0, arrival=0.0, duration=3600.0, gpus=8, cpu=64000, memory=600_000,
                      gang="train", gang_size=2)
    run, result = _run(make_trace(lonely), make_config(), catalog)
    assert run.cloud.instances == {}
    ((reason, count),) = result.never_ran.items()
    assert count == 1
    assert reason.startswith("never placed: gang trace/train has 1 of its 2 members pending")
    assert result.cancelled == {}


def test_a_pod_the_trace_withdrew_before_any_node_could_boot_is_cancelled_not_never_ran() -> None:
    catalog = make_catalog(spot=False)
    withdrawn = make_pod(0, arrival=100.0, duration=None, deleted_at=160.0)
    run, result = _run(make_trace(withdrawn), make_config(), catalog)
    assert result.never_ran == {}
    assert result.cancelled == {f"deleted within {PACK + QUEUE + BOOT:.0f} s of arriving, before any new node "
                                "could be Ready": 1}
    assert result.to_json()["cancelledWhilePending"]["count"] == 1
    assert result.to_json()["neverRan"] == {"count": 0, "reasons": {}}
    assert result.waits == []


def test_a_spot_interruption_mid_run_is_replaced_and_the_pod_resumes() -> None:
    catalog = make_catalog(band=4)
    config = make_config(make_pool(capacityTypes=["spot", "on-demand"]))
    day = 86400.0
    trace = make_trace(make_pod(arrival=0.0, duration=10 * day))
    # 99.9 % of Spot instances interrupted within a month, whatever the band: a few warnings in ten days.
    run, result = _run(trace, config, catalog, spot_monthly_interruption=(0.999,) * 5, seed=3)
    (pod,) = run.pods
    assert result.interruptions >= 1
    assert pod.evicted == result.interruptions, "each warning moved the pod once"
    assert pod.ran == pytest.approx(10 * day), "it resumed where it stopped and ran its whole duration"
    # First wait: batch, queue, boot. After each warning: evicted a queue delay later, onto the replacement the
    # interruption function asked for at once (launched a queue delay later, Ready a boot later).
    assert pod.waited == pytest.approx(PACK + QUEUE + BOOT + result.interruptions * BOOT)
    claims = run.store.list_claims()
    interrupted = [c for c in claims if any("spot interruption" in h.reason for h in c.history)]
    assert len(interrupted) == result.interruptions
    assert all(c.state is ClaimState.TERMINATED for c in interrupted)
    assert result.nodes_launched == result.interruptions + 1
    assert result.cost >= result.lower_bound


def test_a_scaling_window_has_a_node_ready_before_the_pod_arrives() -> None:
    catalog = make_catalog(spot=False)
    window = {"name": "night-batch", "schedule": "cron(0 1 * * ? *)", "timezone": "UTC", "duration": "2h",
              "nodePool": "gpu", "warm": {"gpus": 1}}
    trace = make_trace(make_pod(arrival=5400.0, duration=600.0))
    with_window, warmed = _run(trace, make_config(scalingWindows=[window]), catalog)
    _, cold = _run(trace, make_config(), catalog)
    assert cold.waits == [pytest.approx(PACK + QUEUE + BOOT)]
    assert warmed.waits == [0.0]
    (warm,) = with_window.store.list_claims()
    assert warm.warm == "window:night-batch"
    # The first prewarm tick (01:15: the longest lead time, 8 minutes, and a period before the pod, on the
    # 5-minute grid) finds the window open.
    (instance,) = with_window.cloud.instances.values()
    assert instance.launched_at == pytest.approx(4500.0 + QUEUE)
    assert warmed.cost == pytest.approx(0.526 * (5400.0 + 600.0 - 4500.0 - QUEUE) / 3600)


def test_an_underused_node_is_consolidated_once_consolidate_after_has_passed_since_its_last_pod_event() -> None:
    """The consolidate function searches for underused nodes every minute. Two 4-GPU nodes each end up with one
    long pod (the short ones finish, the second node's first): once `consolidateAfter` (5 minutes) has passed
    since the second node's last pod event, its pod moves onto the first's free room and it goes — although
    nothing in the cluster changes at that moment (the first node's own last pod event came two minutes after
    the second's), and although the cluster had no node at all on the search's first minutes."""
    catalog = make_catalog(("g4dn.xlarge", "g4dn.12xlarge"), spot=False)
    # too many vCPUs for a g4dn.xlarge: 4 such pods take one g4dn.12xlarge
    wide: dict[str, Any] = {"cpu": 6000, "memory": 8192}
    first_started, second_started = PACK + QUEUE + BOOT, 1000.0 + PACK + QUEUE + BOOT
    second_settles = second_started + 3600.0  # its three short pods finish
    first_settles = second_settles + 120.0
    long = 100 * 3600.0
    pods = [make_pod(i, duration=long if i == 0 else first_settles - first_started, **wide) for i in range(4)]
    pods += [make_pod(i, arrival=1000.0, duration=long if i == 4 else 3600.0, **wide) for i in range(4, 8)]
    config = make_config(make_pool(disruption={"consolidateAfter": "5m", "minNodeAge": "10m"}))
    run, result = _run(make_trace(*pods), config, catalog)
    first, second = sorted(run.cloud.instances.values(), key=lambda i: i.launched_at)
    assert (first.instance_type.name, second.instance_type.name) == ("g4dn.12xlarge", "g4dn.12xlarge")
    assert second.terminated_at is not None
    assert second_settles + 300.0 < second.terminated_at < second_settles + 300.0 + 180.0, (
        "searched on the minute its consolidateAfter ran out, validated on the next, drained")
    assert first.terminated_at == pytest.approx(result.end)
    assert result.evictions == 1


def test_pods_no_pool_can_hold_are_reported_again_together_at_a_doubling_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Three pods asking for 16 GPUs (no type has them), arriving minutes apart, pending for three days. The real
    # agent re-reports every pending pod at each resync window, in one document; the replay backs refused pods
    # off to `max_resync_interval` and keeps them on one grid of each interval, so they go together too: not one
    # packer call per pod per interval (the example cdk.json on gpuspec33, whose pools hold no T4: 29,757 packing
    # passes for ten days' pods, 2,520 together).
    catalog = make_catalog(spot=False)
    three_days = 3 * 86400.0
    refused = [make_pod(i, arrival=arrival, duration=None, deleted_at=three_days, gpus=16, cpu=1000)
               for i, arrival in enumerate((0.0, 100.0, 250.0))]
    trace = make_trace(*refused, make_pod(3, arrival=0.0, duration=three_days))  # runs meanwhile: the replay goes on
    run = PolicyRun(build_policy("ours", make_config(), catalog, trace.pods), trace, catalog, settings())
    documents: list[set[str]] = []
    handle = run.packer.handle

    def counted(document: Any, **kwargs: Any) -> Any:
        documents.append({p.uid for p in document.pods})
        return handle(document, **kwargs)

    monkeypatch.setattr(run.packer, "handle", counted)
    result = run.run()
    assert sum(result.cancelled.values()) == 3, "withdrawn by the trace after three days, never placed"
    assert [i.instance_type.name for i in run.cloud.instances.values()] == ["g4dn.xlarge"], "the other pod's node"
    every = {p.uid for p in run.pods if p.trace.gpus == 16}
    together = [d for d in documents if d == every]
    # Backed off to 6 hours, all three go together at every 6-hour mark of the three days.
    assert len(together) >= three_days // run.settings.max_resync_interval - 1, documents
    assert len(documents) <= 30, "a few steps of each pod's doubling before they meet, then one document each time"

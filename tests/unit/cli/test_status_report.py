"""`status` and `status --cost` arithmetic on builders (issue 18 part 2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpu_autoscaler.cli.account import AccountSnapshot
from gpu_autoscaler.cli.status_report import cost_report, status_report
from gpu_autoscaler.models.claims import ClaimState, NodeClaim, StateTransition
from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
from gpu_autoscaler.models.resources import Resources

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def make_claim(claim_id: str, *, state: ClaimState = ClaimState.REGISTERED, price: float = 8.0,
               instance: str | None = None, **fields: Any) -> NodeClaim:
    return NodeClaim(cluster="ml-prod", id=claim_id, pool=fields.pop("pool", "gpu-burst"), capacity_type="spot",
                     zones=("us-east-1a",), instance_types=("g6.12xlarge",), price_per_hour=price, state=state,
                     created_at=fields.pop("created_at", NOW - timedelta(minutes=5)), instance_id=instance, **fields)


def make_node(name: str, instance: str, *, gpus: int = 4, cpu: str = "48", pool: str = "gpu-burst") -> ClusterNode:
    return ClusterNode(name=name, provider_id=f"aws:///us-east-1a/{instance}",
                       labels={"karpenter.sh/nodepool": pool, "karpenter.k8s.aws/instance-gpu-count": str(gpus)},
                       allocatable=Resources.from_quantities({"cpu": cpu, "nvidia.com/gpu": str(gpus)}), ready=True)


def make_pod(name: str, *, namespace: str = "team-a", node: str | None = None, gpus: int = 1, cpu: str = "4",
             labels: dict[str, str] | None = None) -> ClusterPod:
    requests = {"cpu": cpu, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return ClusterPod(uid=name, namespace=namespace, name=name, node_name=node, labels=labels or {},
                      requests=Resources.from_quantities(requests), created_at=NOW - timedelta(seconds=90))


def test_cost_splits_each_node_by_gpu_share_and_keeps_idle_apart() -> None:
    claims = [make_claim("a", instance="i-a", price=8.0), make_claim("b", instance="i-b", price=2.0)]
    nodes = [make_node("n-a", "i-a", gpus=4), make_node("n-b", "i-b", gpus=1, cpu="8")]
    pods = [make_pod("p1", node="n-a", gpus=2), make_pod("p2", namespace="team-b", node="n-a", gpus=1),
            make_pod("cpu-only", namespace="team-b", node="n-b", gpus=0, cpu="2"),
            make_pod("waiting", namespace="team-c")]
    report = cost_report(claims, nodes, pods, by="namespace")
    assert {r["team"]: r["usdPerHour"] for r in report["teams"]} == {"team-a": 4.0, "team-b": 2.0 + 0.5}
    assert report["idle"] == {"usdPerHour": 2.0 + 1.5, "usdPerDay": 84.0}
    assert report["totalUsdPerHour"] == 10.0
    by_label = cost_report(claims, nodes, [make_pod("p1", node="n-a", gpus=2, labels={"team": "search"}),
                                           make_pod("p2", node="n-a", gpus=1)], by="label", key="team")
    assert {r["team"]: r["usdPerHour"] for r in by_label["teams"]} == {"search": 4.0, "<none>": 2.0}


def test_status_counts_per_pool_and_names_warm_capacity_and_drains() -> None:
    drained = make_claim("c", instance="i-c", state=ClaimState.DRAINING, history=(
        StateTransition(state=ClaimState.DRAINING, at=NOW - timedelta(minutes=10), reason="spot interruption"),))
    consolidated = make_claim("d", state=ClaimState.TERMINATED, history=(
        StateTransition(state=ClaimState.DRAINING, at=NOW - timedelta(minutes=20), reason="consolidation: empty"),))
    old = make_claim("e", state=ClaimState.TERMINATED, history=(
        StateTransition(state=ClaimState.DRAINING, at=NOW - timedelta(hours=3), reason="spot interruption"),))
    claims = [make_claim("a", instance="i-a", warm="window:peak"), make_claim("b", state=ClaimState.PENDING),
              drained, consolidated, old, make_claim("x", pool="gpu-shared", price=1.0, instance="i-x")]
    snapshot = AccountSnapshot(claims=claims, queue_depths={"launch": 0, "launch-dlq": 2})
    nodes = [make_node("n-a", "i-a"), make_node("n-c", "i-c")]
    pods = [make_pod("p1", node="n-a", gpus=3), make_pod("waiting")]
    report = status_report(snapshot, nodes, pods, NOW)
    burst = report["pools"]["gpu-burst"]
    assert burst["claims"] == {"Registered": 1, "Pending": 1, "Draining": 1}
    assert burst["gpus"] == {"physical": 8, "slots": 8, "allocated": 3}
    assert burst["usdPerHour"] == 16.0 and report["usdPerHour"] == 17.0
    assert burst["warm"] == [{"claim": "a", "why": "window:peak", "state": "Registered"}]
    assert burst["inFlight"] == [{"claim": "b", "state": "Pending", "ageSeconds": 300.0}]
    assert (burst["interruptionsLastHour"], burst["consolidationsLastHour"]) == (1, 1)
    assert report["pendingGpuPods"] == {"count": 1, "oldestSeconds": 90.0}
    assert report["deadLetters"] == {"launch-dlq": 2}
    without_kubernetes = status_report(snapshot, None, None, NOW)
    assert without_kubernetes["pendingGpuPods"] is None and without_kubernetes["pools"]["gpu-burst"]["gpus"] is None

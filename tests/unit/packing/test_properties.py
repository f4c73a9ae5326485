"""Property tests: whatever the pods, pools, claims in flight, unavailable offerings and quotas, every plan
is valid (see `validation.check_plan`): each pod once, every candidate of every claim holds all its pods
with overhead, gangs whole and in one zone, limits kept; and the same inputs give the same plan."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_autoscaler.domain.packing import Solver
from gpu_autoscaler.domain.packing.baseline import first_fit_decreasing
from gpu_autoscaler.models.catalog import Offering
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.pods import PendingPod
from tests.unit.packing.builders import GPU_TAINT, TYPES, ZONES, make_catalog, make_claim, make_config, make_solver
from tests.unit.packing.validation import check_plan

SHARED_TAINT = {"key": "shared", "value": "true", "effect": "NoSchedule"}
REQUIREMENTS = [
    {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["g"]},
    {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["p"]},
    {"key": "karpenter.k8s.aws/instance-family", "operator": "NotIn", "values": ["g6f"]},
    {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Lt", "values": ["5"]},
    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]},
]
SELECTORS = [
    {}, {}, {},
    {"nodeSelector": {"karpenter.k8s.aws/instance-gpu-name": "a10g"}},
    {"nodeSelector": {"topology.kubernetes.io/zone": "us-east-1b"}},
    {"nodeSelector": {"karpenter.sh/capacity-type": "on-demand"}},
    {"nodeSelector": {"team": "ml"}},
    {"requiredNodeAffinity": [{"matchExpressions": [
        {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": ["1"]}]}]},
    {"requiredNodeAffinity": [
        {"matchExpressions": [{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["h100"]}]},
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["us-east-1a"]},
                              {"key": "karpenter.k8s.aws/instance-family", "operator": "Exists"}]}]},
]


@st.composite
def pools(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        capacity = draw(st.lists(st.sampled_from(["reserved", "spot", "on-demand"]), min_size=1, max_size=3,
                                 unique=True))
        pool: dict[str, Any] = {
            "name": f"pool-{i}", "weight": draw(st.integers(0, 100)), "capacityTypes": capacity,
            "requirements": draw(st.lists(st.sampled_from(REQUIREMENTS), max_size=2)),
            "taints": draw(st.sampled_from([[GPU_TAINT], [SHARED_TAINT], []])),
            "efa": draw(st.booleans()),
        }
        if "reserved" in capacity:
            pool["capacityReservations"] = [{"id": "cr-0aa"}]
        if draw(st.booleans()):
            pool["labels"] = {"team": "ml"}
        sharing = draw(st.sampled_from(["none", "none", "time-slicing", "mig"]))
        if sharing == "time-slicing":
            pool["gpuSharing"] = {"mode": "time-slicing", "replicas": draw(st.integers(2, 8))}
        elif sharing == "mig":
            pool["gpuSharing"] = {"mode": "mig", "migProfile": "1g.10gb"}
        limits: dict[str, float] = {}
        if draw(st.booleans()):
            limits["gpus"] = draw(st.integers(0, 24))
        if draw(st.booleans()):
            limits["pricePerHour"] = draw(st.floats(0, 80))
        if limits:
            pool["limits"] = limits
        out.append(pool)
    return out


@st.composite
def pods(draw: st.DrawFn) -> list[PendingPod]:
    out = []
    n = draw(st.integers(1, 30))
    gangs = draw(st.integers(0, 2))
    for i in range(n):
        kind = draw(st.sampled_from(["gpu", "gpu", "mig", "multi", "heavy"]))
        requests = {"cpu": draw(st.sampled_from(["250m", "1", "2", "6", "20"])),
                    "memory": draw(st.sampled_from(["1Gi", "4Gi", "16Gi", "100Gi"]))}
        if kind == "mig":
            requests["nvidia.com/mig-1g.10gb"] = draw(st.sampled_from(["1", "2"]))
        else:
            multi = draw(st.sampled_from(["2", "4", "8"]))
            requests["nvidia.com/gpu"] = {"gpu": "1", "multi": multi, "heavy": "1"}[kind]
        if kind == "heavy":
            requests["memory"] = "300Gi"
        data: dict[str, Any] = {"uid": f"p{i}", "name": f"p{i}", "requests": requests,
                                "tolerations": draw(st.sampled_from([
                                    [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                                    [{"operator": "Exists"}], [], [{"key": "shared", "operator": "Exists"}]])),
                                **draw(st.sampled_from(SELECTORS))}
        if gangs and draw(st.integers(0, 3)) == 0:
            g = draw(st.integers(0, gangs - 1))
            data["podGroup"] = {"name": f"g{g}", "minMember": draw(st.integers(1, 4))}
        out.append(PendingPod.model_validate(data))
    return out


@st.composite
def in_flight(draw: st.DrawFn, config: Any, pod_list: list[PendingPod]) -> tuple[list[Any], dict[str, str]]:
    claims = []
    covered: dict[str, str] = {}
    for i in range(draw(st.integers(0, 3))):
        pool = draw(st.sampled_from(config.node_pools))
        name = draw(st.sampled_from(sorted(TYPES)))
        used = {"cpu": draw(st.integers(0, 8000)), "pods": 1}
        if draw(st.booleans()):
            used["nvidia.com/gpu"] = 1
        claims.append(make_claim(
            id=f"live-{i}", pool=pool.name, capacity_type=draw(st.sampled_from(pool.capacity_types)),
            instance_types=(name,), zones=(draw(st.sampled_from(ZONES)),),
            state=draw(st.sampled_from([ClaimState.PENDING, ClaimState.LAUNCHED, ClaimState.REGISTERED])),
            attributes={"requests": json.dumps(used)}))
    for pod in pod_list:
        if claims and draw(st.integers(0, 5)) == 0:
            covered[pod.uid] = draw(st.sampled_from(claims)).id
    return claims, covered


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_plan_is_valid(data: st.DataObject) -> None:
    config = make_config(*data.draw(pools()), vcpuQuotas=data.draw(st.dictionaries(
        st.sampled_from(["g/spot", "g/on-demand", "p/on-demand", "g5/on-demand"]), st.integers(0, 400), max_size=2)))
    reservations = [Offering(instance_type="g5.12xlarge", zone="us-east-1a", capacity_type="reserved",
                             price_per_hour=5.672e-7, reservation_id="cr-0aa",
                             available_count=data.draw(st.integers(0, 2)))]
    catalog = make_catalog(extra=reservations)
    pod_list = data.draw(pods())
    live, covered = data.draw(in_flight(config, pod_list))
    unavailable = set(data.draw(st.lists(st.tuples(st.sampled_from(sorted(TYPES)), st.sampled_from(ZONES),
                                                   st.sampled_from(["spot", "on-demand"])), max_size=6)))
    for packer in ("ours", "baseline"):
        solver = (Solver(config, catalog, make_solver().clock, packer=first_fit_decreasing) if packer == "baseline"
                  else Solver(config, catalog, make_solver().clock))
        plan = solver.solve(pod_list, claims=live, covered=covered, unavailable=unavailable, source="m")
        check_plan(plan, pod_list, config, catalog, live, unavailable)
        again = solver.solve(pod_list, claims=live, covered=covered, unavailable=unavailable, source="m")
        assert again.to_json() == plan.to_json()

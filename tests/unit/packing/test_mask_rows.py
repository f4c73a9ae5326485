"""The solver's class rows (`Solver.mask_rows`, `SolvePass._class_masks`): a class asked about again in the same pool
with the same offerings available gets the row it got, and a change to anything the row is made of is a new row."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.domain.packing.classes import classify
from gpu_autoscaler.domain.packing.fit import pod_requests
from gpu_autoscaler.domain.packing.solve_pass import SolvePass
from tests.unit.packing.builders import make_catalog, make_config, make_pod, make_pool, make_solver

if TYPE_CHECKING:
    from gpu_autoscaler.domain.packing import Solver
    from gpu_autoscaler.domain.packing.results import Plan
    from gpu_autoscaler.models.pods import PendingPod


def _plan(solver: Solver, pods: list[Any], **kwargs: Any) -> Plan:
    return solver.solve(pods, source="s", **kwargs)


def _masks(solver: Solver, pods: list[Any], **kwargs: Any) -> list[Any]:
    return [m.tolist() for m in SolvePass(solver, pods, (), {}, kwargs.get("unavailable", ()), "s").ok]


def test_a_class_asked_again_gets_the_same_rows_as_a_fresh_solver() -> None:
    solver = make_solver()
    pods = [make_pod(gpus=1), make_pod(gpus=4, cpu="16", memory="64Gi")]
    first = _masks(solver, pods)
    assert solver.mask_rows, "rows are kept"
    kept = dict(solver.mask_rows)
    assert _masks(solver, pods) == first == _masks(make_solver(), pods)
    assert all(solver.mask_rows[k] is v for k, v in kept.items()), "asked again: the same rows, none computed"
    assert _plan(solver, pods) == _plan(make_solver(), pods)


def _cheapest(solver: Solver) -> tuple[str, str, str]:
    plan = _plan(make_solver(), [make_pod(gpus=1)])
    claim = plan.claims[0]
    return (claim.instance_types[0], claim.zones[0], claim.capacity_type)


_CHANGES: dict[str, tuple[list[PendingPod], list[PendingPod], dict[str, Any]]] = {
    "requests": ([make_pod(gpus=1)], [make_pod(gpus=8, cpu="1")], {}),
    "tolerations": ([make_pod(gpus=1)], [make_pod(gpus=1, tolerate=False)], {}),
    "selector": ([make_pod(gpus=1)], [make_pod(gpus=1, nodeSelector={"topology.kubernetes.io/zone": "us-east-1b"})],
                 {}),
    "affinity": ([make_pod(gpus=1)], [make_pod(gpus=1, requiredNodeAffinity=[{"matchExpressions": [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["g5.48xlarge"]}]}])], {}),
    "axes": ([make_pod(gpus=1, requests={"cpu": "1", "nvidia.com/gpu": "1", "vpc.amazonaws.com/efa": "1"})],
             [make_pod(gpus=1, requests={"cpu": "1", "nvidia.com/gpu": "1", "example.com/dongle": "1"})], {}),
}


@pytest.mark.parametrize("name", sorted(_CHANGES))
def test_a_class_that_differs_in_what_its_row_is_made_of_gets_its_own(name: str) -> None:
    before, after, kwargs = _CHANGES[name]
    solver = make_solver()
    _masks(solver, before)
    rows = len(solver.mask_rows)
    assert _masks(solver, after, **kwargs) == _masks(make_solver(), after, **kwargs)
    assert len(solver.mask_rows) > rows, f"{name}: a row was reused"


def test_offerings_made_unavailable_get_new_rows_and_the_fresh_plan() -> None:
    solver = make_solver()
    pods = [make_pod(gpus=1)]
    _plan(solver, pods)
    gone = [_cheapest(solver)]
    rows = len(solver.mask_rows)
    assert _masks(solver, pods, unavailable=gone) == _masks(make_solver(), pods, unavailable=gone)
    assert len(solver.mask_rows) > rows
    assert _plan(solver, pods, unavailable=gone) == _plan(make_solver(), pods, unavailable=gone)
    assert _plan(solver, pods, unavailable=gone).claims[0].instance_types[0] != gone[0][0] or (
        _plan(solver, pods, unavailable=gone).claims[0].zones[0] != gone[0][1])


def test_each_pool_has_its_own_rows() -> None:
    tainted = make_pool("tainted", weight=10, taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])
    solver = make_solver(make_config(tainted, make_pool()), make_catalog())
    pods = [make_pod(gpus=1)]
    masks = _masks(solver, pods)
    assert masks == _masks(make_solver(make_config(tainted, make_pool()), make_catalog()), pods)
    assert not any(masks[0][0]) and any(masks[1][0]), "the tainted pool's row is not the other's"


def test_a_class_key_is_equal_for_equal_constraints_and_differs_for_any_field() -> None:
    """Classes of separate solves (their pods parsed apart: equal models, not the same objects) share their rows;
    a toleration's `tolerationSeconds` or an affinity term's values make another key."""
    term = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a10g"]}]}
    wait = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}

    def key(**fields: Any) -> object:
        return classify([make_pod(gpus=1, **fields)])[0].constraint_key

    same = key(requiredNodeAffinity=[term], tolerations=[wait])
    assert same == key(requiredNodeAffinity=[term], tolerations=[wait])
    assert hash(same) == hash(key(requiredNodeAffinity=[term], tolerations=[wait]))
    assert same != key(requiredNodeAffinity=[term], tolerations=[{**wait, "tolerationSeconds": 60}])
    assert same != key(requiredNodeAffinity=[{"matchExpressions": [{**term["matchExpressions"][0], "values": ["t4"]}]}],
                       tolerations=[wait])
    assert same != key(requiredNodeAffinity=[term], tolerations=[{**wait, "effect": "NoSchedule"}])


def test_a_pod_classified_again_reuses_its_plain_constraints_and_footprint() -> None:
    """The consolidation search classifies the same pod objects every pass: their constraints' plain tuples and
    their requests with the pod slot are made once per object."""
    term = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a10g"]}]}
    pod = make_pod(gpus=1, requiredNodeAffinity=[term])
    first, again = classify([pod])[0].constraint_key, classify([pod])[0].constraint_key
    assert first == again and first[1] is again[1], "the affinity's plain tuple, kept for the pod's tuple of terms"
    assert pod_requests(pod) is pod_requests(pod)
    twin = make_pod(gpus=1, requiredNodeAffinity=[term])
    assert classify([twin])[0].constraint_key == first

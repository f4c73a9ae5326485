"""What consolidation keeps between passes for the same objects (the simulator hands the same node, claim and pod
objects every minute until they change): each node's price, use and allocatable, each claim's drift, each recorded
requests attribute — computed once per object or string, and afresh for a new one."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain import consolidation
from gpu_autoscaler.domain.consolidation import consolidate
from gpu_autoscaler.domain.packing import results
from gpu_autoscaler.domain.packing.results import claim_requests
from tests.unit.consolidation.builders import Cluster, pool_config

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

    from gpu_autoscaler.domain.consolidation_models import ConsolidationNode
    from gpu_autoscaler.domain.packing import Solver


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[object]:
    calls: list[object] = []
    original: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any) -> Any:
        calls.append(args[-1])
        return original(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


def _cluster() -> tuple[Cluster, Solver, list[ConsolidationNode]]:
    cluster = Cluster(pool_config())
    for _ in range(3):
        cluster.pods_on(cluster.node("g5.12xlarge"), 2, gpus=1)
    return cluster, cluster.solver(), cluster.items()


def _pass(cluster: Cluster, solver: Solver, items: list[ConsolidationNode]) -> object:
    return consolidate(cluster.config, solver, items, claims=list(cluster.claims.values()))


def test_a_node_object_seen_before_is_not_priced_again_and_a_new_one_is(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, solver, items = _cluster()
    priced = _counting(monkeypatch, consolidation, "_price")
    first = _pass(cluster, solver, items)
    assert len(priced) == 3
    assert _pass(cluster, solver, items) == first and len(priced) == 3
    changed = replace(items[0], pods=items[0].pods[:1])
    _pass(cluster, solver, [changed, *items[1:]])
    assert priced[3:] == [changed.claim], "the changed node only"
    _pass(cluster, cluster.solver(), items)
    assert len(priced) == 7, "another solver (catalog): every node afresh"


def _asked_once_per_node(monkeypatch: pytest.MonkeyPatch, name: str,
                         ) -> tuple[list[object], Cluster, Solver, list[ConsolidationNode]]:
    """`consolidation.<name>` counted over two passes on the same three nodes: asked once for each."""
    cluster, solver, items = _cluster()
    checked = _counting(monkeypatch, consolidation, name)
    for _ in range(2):
        _pass(cluster, solver, items)
        assert len(checked) == 3
    return checked, cluster, solver, items


def test_a_claim_object_seen_before_is_not_checked_for_drift_again(monkeypatch: pytest.MonkeyPatch) -> None:
    checked, cluster, solver, items = _asked_once_per_node(monkeypatch, "drift_reason")
    assert items[0].claim is not None
    claim = items[0].claim.model_copy(update={"attributes": {**items[0].claim.attributes, "x": "y"}})
    _pass(cluster, solver, [replace(items[0], claim=claim), *items[1:]])
    assert checked[3:] == [claim]


def test_a_requests_attribute_is_parsed_once_per_string(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = _counting(monkeypatch, results.json, "loads")
    cluster, _, _ = _cluster()
    claim = next(iter(cluster.claims.values())).model_copy(update={"attributes": {"requests": '{"cpu":1237}'}})
    assert claim_requests(claim) == {"cpu": 1237} and claim_requests(claim) == {"cpu": 1237}
    assert parsed == ['{"cpu":1237}']
    other = claim.model_copy(update={"attributes": {"requests": '{"cpu":2473}'}})
    assert claim_requests(other) == {"cpu": 2473} and len(parsed) == 2


def test_what_on_a_node_keeps_it_from_disruption_is_read_once_per_node_object(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Readiness, initialization and do-not-disrupt are of the node object alone: asked once per object."""
    checked, cluster, solver, items = _asked_once_per_node(monkeypatch, "not_initialized")
    changed = replace(items[0], pods=items[0].pods[:1])
    _pass(cluster, solver, [changed, *items[1:]])
    assert len(checked) == 4, "the changed node only"


def test_a_pending_pod_object_is_shaped_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass groups the waiting pods by shape each minute; a pod object seen before is not shaped again."""
    cluster, solver, items = _cluster()
    shaped = _counting(monkeypatch, consolidation, "plain_of")
    waiting = [cluster.pod(None, gpus=1), cluster.pod(None, gpus=2)]
    for _ in range(2):
        consolidate(cluster.config, solver, items, claims=list(cluster.claims.values()), pending=waiting)
    assert len(shaped) == 4, "affinity and tolerations of each of the two pods, once"


def test_a_node_shape_is_kept_per_node_object_only_while_its_use_and_price_are_the_ones_it_was_computed_from() -> None:
    """`node_shape` is asked for every busy node on every pass: kept per node object, it is answered again for the
    very use object `_Pass._node` hands back, and computed afresh for another use (one taken in the pass) or price."""
    from gpu_autoscaler.domain.consolidation_group import GroupNode, node_shape
    from gpu_autoscaler.models.resources import Resources

    cluster, _, items = _cluster()
    item = items[0]
    used = Resources({"cpu": 1000, "nvidia.com/gpu": 2})
    node = GroupNode(item, None, 5.0, used, None)
    shape = node_shape(node)
    assert node_shape(GroupNode(item, None, 5.0, used, None)) is shape, "the same node object and use: kept"
    assert node_shape(GroupNode(item, None, 5.0, Resources({"cpu": 1000, "nvidia.com/gpu": 2}), None)) == shape
    assert node_shape(GroupNode(item, None, 5.5, used, None)) != shape, "another price"
    node.take(Resources({"cpu": 1}))
    assert node_shape(node) != shape, "a node that took pods in the pass"
    assert node_shape(GroupNode(items[1], None, 5.0, used, None)) == shape, "another node of the same shape"

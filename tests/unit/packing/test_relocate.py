"""`relocate.empty_into_holes`: nodes emptied into the free room of others, copies counted as nodes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_autoscaler.domain.packing.kinds import Kinds
from gpu_autoscaler.domain.packing.relocate import Node, empty_into_holes

# Resources: GPUs, memory (GiB). Kind 0: 8 GPUs / 700 GiB at 10 USD/h; kind 1: 2 GPUs / 64 GiB at 1 USD/h.
KINDS = Kinds(np.array([[8, 700], [2, 64]], np.int64), np.array([10.0, 1.0]), np.ones((2, 2), bool))
# Class 0: a memory-bound pod (1 GPU, 128 GiB); class 1: a small pod (1 GPU, 8 GiB).
REQ = np.array([[1, 128], [1, 8]], np.int64)


def _expanded(nodes: list[Node]) -> list[tuple[int, tuple[int, ...]]]:
    return sorted((k, tuple(int(x) for x in counts)) for k, counts, n in nodes for _ in range(n))


def test_small_pods_move_into_the_gpus_memory_bound_nodes_leave_idle() -> None:
    # The module's example: big nodes of five 128 GiB pods (memory-bound, three GPUs idle) beside small nodes
    # holding one small pod each; the small pods fit the idle GPUs, so their nodes go.
    opened: list[Node] = [(0, np.array([5, 0]), 2), (1, np.array([0, 1]), 5)]
    out = empty_into_holes(opened, REQ, KINDS)
    assert out is not None
    expanded = _expanded(out)
    assert sum(KINDS.price[k] for k, _ in expanded) == 20.0
    assert sum(c[1] for _, c in expanded) == 5 and sum(c[0] for _, c in expanded) == 10
    for k, counts in expanded:
        assert (np.array(counts) @ REQ <= KINDS.cap[k]).all()


def test_nothing_moves_when_no_node_can_be_emptied() -> None:
    assert empty_into_holes([(0, np.array([5, 3]), 1), (1, np.array([0, 2]), 1)], REQ, KINDS) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5), st.integers(0, 2), st.integers(1, 4)),
                min_size=1, max_size=5))
def test_copies_of_a_pattern_are_the_same_as_the_nodes_given_one_by_one(
        patterns: list[tuple[int, int, int, int]]) -> None:
    # The pass counts room per pattern and repeats it for its copies; given the same nodes one per entry,
    # it must decide the same.
    opened: list[Node] = []
    for kind, big, small, copies in patterns:
        counts = np.array([big, small], np.int64)
        if not counts.any() or (counts @ REQ > KINDS.cap[kind]).any():
            continue
        opened.append((kind, counts, copies))
    if not opened:
        return
    one_by_one: list[Node] = [(k, counts, 1) for k, counts, n in opened for _ in range(n)]
    grouped, single = empty_into_holes(opened, REQ, KINDS), empty_into_holes(one_by_one, REQ, KINDS)
    assert (grouped is None) == (single is None)
    if grouped is not None and single is not None:
        assert _expanded(grouped) == _expanded(single)

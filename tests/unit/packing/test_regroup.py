"""Groups of patterns packed again (`regroup`): a new plan only when it is cheaper, and always a valid one.

The case it was written for (scenario s14's tier) is in `test_binpack`, through `pack`; here the pass is
called on its own, on plans that leave it room: the greedy's first plans of random tiers of many classes.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_autoscaler.domain.packing.binpack import _greedy, class_weights
from gpu_autoscaler.domain.packing.kinds import Kinds, Opened
from gpu_autoscaler.domain.packing.regroup import MIN_PATTERNS, regroup
from tests.unit.packing.validation import assert_valid, cost


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_regroup_keeps_every_pod_on_nodes_that_hold_them_and_never_costs_more(data: st.DataObject) -> None:
    n_kinds = data.draw(st.integers(2, 5))
    n_classes = data.draw(st.integers(3, 7))
    caps = [[data.draw(st.integers(8, 64)), data.draw(st.integers(1, 8)), data.draw(st.integers(16, 256))]
            for _ in range(n_kinds)]
    prices = [data.draw(st.floats(0.1, 20)) for _ in range(n_kinds)]
    req = np.array([[data.draw(st.integers(1, 16)), data.draw(st.integers(0, 4)), data.draw(st.integers(1, 128))]
                    for _ in range(n_classes)], np.int64)
    feasible = np.array([[data.draw(st.booleans()) or k == 0 for k in range(n_kinds)] for _ in range(n_classes)])
    k = Kinds(np.array(caps, np.int64), np.array(prices), feasible)
    fits = ((k.cap[None, :, :] >= req[:, None, :]).all(axis=2) & feasible).any(axis=1)
    demand = np.where(fits, np.array([data.draw(st.integers(0, 15)) for _ in range(n_classes)]), 0)
    w = class_weights(req, k)
    first = _greedy(demand, req, k, w)
    before = [(e.kind, e.counts.copy(), e.copies) for e in first]

    after = regroup(first, req, k, w, lambda pods, weights: _greedy(pods, req, k, weights))

    assert [(e.kind, e.counts.tolist(), e.copies) for e in first] == [(a, c.tolist(), n) for a, c, n in before]
    assert_valid(after, demand, req, k)
    assert cost(after, k) <= cost(first, k) + 1e-9
    if after is not first:
        assert cost(after, k) < cost(first, k)


def test_a_plan_of_few_patterns_is_left_as_it_is() -> None:
    k = Kinds(np.array([[4, 100], [8, 100]], np.int64), np.array([1.0, 1.5]), np.ones((2, 2), bool))
    req = np.array([[1, 10], [2, 10]], np.int64)
    plan = [Opened(0, np.array([4, 0]), 3), Opened(0, np.array([0, 2]), 2)]
    assert len(plan) < MIN_PATTERNS

    def greedy(pods: np.ndarray, weights: np.ndarray) -> list[Opened]:
        raise AssertionError("nothing is packed again")

    assert regroup(plan, req, k, class_weights(req, k), greedy) is plan

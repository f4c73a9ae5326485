"""The solver's dedupe keeps the cheapest offering per (type, classes it may hold), whatever the number of classes."""

from __future__ import annotations

import numpy as np

from gpu_autoscaler.domain.packing.solve_pass import first_of_each


def _by_definition(order: np.ndarray, types: np.ndarray, feasible: np.ndarray) -> list[int]:
    kept: dict[tuple[int, tuple[bool, ...]], int] = {}
    for i in order.tolist():
        kept.setdefault((int(types[i]), tuple(feasible[:, i].tolist())), i)
    return sorted(kept.values())


def test_the_packed_key_keeps_the_columns_the_definition_keeps() -> None:
    rng = np.random.default_rng(7)
    for trial in range(3000):
        columns, type_count, classes = int(rng.integers(0, 40)), int(rng.integers(1, 9)), int(rng.integers(0, 6))
        prices = rng.choice([0.5, 1.0, 1.5], columns)  # ties: the first in `order` must win
        types = rng.integers(0, type_count, columns)
        feasible = rng.random((classes, columns)) < 0.6
        order = np.lexsort((prices, types))
        fast = first_of_each(order, types, feasible)
        assert fast.dtype == np.int64
        assert fast.tolist() == _by_definition(order, types, feasible), trial


def test_many_classes_keep_the_same_columns() -> None:
    rng = np.random.default_rng(3)
    types = rng.integers(0, 3, 30)
    feasible = rng.random((70, 30)) < 0.97
    order = np.lexsort((rng.random(30), types))
    assert first_of_each(order, types, feasible).tolist() == _by_definition(order, types, feasible)

"""The packer's memo: a repeated question gets the packer's own plan, any change in what it reads is a new one."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_autoscaler.domain.packing.binpack import Kinds, Opened, pack
from gpu_autoscaler.domain.packing.memo import PackMemo, pack_key


def _kinds(prices: tuple[float, ...] = (1.0, 1.5), limit: list[int] | None = None) -> Kinds:
    caps = np.array([[4000, 16, 1], [8000, 32, 2]], np.int64)[: len(prices)]
    return Kinds(caps, np.array(prices), np.ones((2, len(prices)), bool),
                 None if limit is None else np.array(limit, np.int64))


DEMAND = np.array([3, 2], np.int64)
REQ = np.array([[1000, 4, 1], [2000, 8, 1]], np.int64)


class _Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, demand: np.ndarray, req: np.ndarray, kinds: Kinds) -> list[Opened]:
        self.calls += 1
        return pack(demand, req, kinds)


def _plan(opened: list[Opened]) -> list[tuple[int, list[int], int]]:
    return [(e.kind, e.counts.tolist(), e.copies) for e in opened]


def test_a_repeated_question_is_packed_once_and_answered_alike() -> None:
    memo, packer = PackMemo(), _Counting()
    first = memo(packer, DEMAND.copy(), REQ.copy(), _kinds())
    again = memo(packer, DEMAND.copy(), REQ.copy(), _kinds())
    assert packer.calls == 1 and memo.hits == 1
    assert _plan(first) == _plan(again) == _plan(pack(DEMAND, REQ, _kinds()))


@pytest.mark.parametrize("change", ["demand", "req", "price", "feasible", "limit", "dtype"])
def test_any_change_in_what_the_packer_reads_is_packed_again(change: str) -> None:
    memo, packer = PackMemo(), _Counting()
    memo(packer, DEMAND, REQ, _kinds())
    demand, req, kinds = DEMAND.copy(), REQ.copy(), _kinds()
    if change == "demand":
        demand[0] += 1
    elif change == "req":
        req[1, 0] += 1
    elif change == "price":
        kinds = _kinds((1.0, 1.5000000001))
    elif change == "feasible":
        kinds.feasible[1, 0] = False
    elif change == "limit":
        kinds = _kinds(limit=[5, 5])
    else:
        demand = demand.astype(np.int32)
    found = memo(packer, demand, req, kinds)
    assert packer.calls == 2 and memo.hits == 0
    assert _plan(found) == _plan(pack(demand, req, kinds))
    assert pack_key(demand, req, kinds) != pack_key(DEMAND, REQ, _kinds())


def test_another_packer_is_not_answered_from_the_first_ones_plans() -> None:
    memo, one, other = PackMemo(), _Counting(), _Counting()
    memo(one, DEMAND, REQ, _kinds())
    memo(other, DEMAND, REQ, _kinds())
    assert (one.calls, other.calls) == (1, 1)


def test_a_caller_changing_its_plan_does_not_change_the_next_one() -> None:
    memo, packer = PackMemo(), _Counting()
    first = memo(packer, DEMAND, REQ, _kinds())
    expected = _plan(first)
    first[0].counts[:] = 99
    first[0].copies = 99
    first.clear()
    assert _plan(memo(packer, DEMAND, REQ, _kinds())) == expected


def test_the_memo_is_bounded() -> None:
    memo, packer = PackMemo(limit=2), _Counting()
    for n in range(1, 6):
        memo(packer, np.array([n, 1], np.int64), REQ, _kinds())
    assert len(memo._plans) <= 2
    memo(packer, np.array([1, 1], np.int64), REQ, _kinds())
    assert packer.calls == 6


def test_the_memo_is_bounded_in_bytes_too() -> None:
    """A warm packer keeps its solver between invocations, and a large tier's question is large (a 10,000-pod
    document: ~200 classes × ~450 offerings of feasibility alone): the memo's keys stay within a byte budget."""
    memo, packer = PackMemo(max_bytes=2048), _Counting()
    classes = 10
    req = np.tile(np.array([[1000, 4, 1]], np.int64), (classes, 1))
    kinds = Kinds(np.array([[64000, 256, 8]], np.int64), np.array([9.0]), np.ones((classes, 1), bool))
    for n in range(1, 8):
        memo(packer, np.full(classes, n, np.int64), req, kinds)
        assert 0 < memo.bytes <= 2048  # ~500 bytes a question here: a few kept, then the memo starts again
    assert packer.calls == 7 and len(memo._plans) < 7
    assert PackMemo(max_bytes=100)(packer, np.full(classes, 1, np.int64), req, kinds) is not None

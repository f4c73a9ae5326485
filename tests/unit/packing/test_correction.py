"""Value correction's reweighing: a class that cannot go on a kind (its share of that kind is infinite) is simply
absent from that kind's nodes, not a NaN (numpy warned `invalid value encountered in multiply` on the property
tests: 0 pods × an infinite share, masked afterwards but computed first)."""

from __future__ import annotations

import warnings

import numpy as np

from gpu_autoscaler.domain.packing.correction import corrected
from gpu_autoscaler.domain.packing.kinds import Kinds, Opened


def test_a_class_that_cannot_use_a_kind_reweighs_without_warnings() -> None:
    # Two resources (GPUs, vCPUs); kind 0 has no GPU, kind 1 has 4. Class 0 asks for a GPU, class 1 for CPU only.
    kinds = Kinds(cap=np.array([[0, 8], [4, 32]]), price=np.array([0.4, 3.0]),
                  feasible=np.array([[False, True], [True, True]]))
    req = np.array([[1, 4], [0, 2]])
    demand = np.array([2, 3])
    first = [Opened(kind=1, counts=np.array([2, 0]), copies=1), Opened(kind=0, counts=np.array([0, 3]), copies=1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        best = corrected(first, demand, req, kinds, np.array([1.5, 0.1]), [lambda _w: list(first)])
    assert sum((o.copies * o.counts for o in best), np.zeros_like(demand)).tolist() == [2, 3]

"""The packing problem of one tier (a pool and a capacity type): the nodes it can open, and the nodes opened."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np  # noqa: TC002 (dataclass fields)

__all__ = ["Kinds", "Opened"]


@dataclass(frozen=True)
class Kinds:
    """The nodes a tier can open."""

    cap: np.ndarray
    """[K, R] allocatable, integer units."""
    price: np.ndarray
    """[K] USD per hour."""
    feasible: np.ndarray
    """[C, K] whether a class may be placed on a kind (selectors, zones, pool, sharing mode)."""
    limit: np.ndarray | None = None
    """[K] how many nodes of each kind exist (capacity reservations); None when unbounded."""

    def __len__(self) -> int:
        return len(self.price)


@dataclass
class Opened:
    kind: int
    counts: np.ndarray
    """[C] pods of each class on one such node."""
    copies: int

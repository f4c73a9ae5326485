"""What one solve pass builds: a pool seen against the catalog, a new node and its ranked candidate types.

Shared by the pass (`solver`) and the placement steps it hands work to (`gangs`, `explain`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np  # noqa: TC002 (dataclass fields)

if TYPE_CHECKING:
    from gpu_autoscaler.config import CapacityType, NodePool

__all__ = ["CANDIDATE_PRICE_CEILING", "MAX_CANDIDATES", "Candidates", "NewNode", "PoolView", "TierArrays"]

MAX_CANDIDATES = 60
"""Candidate types per new node at most (a CreateFleet request takes this many overrides per claim)."""
CANDIDATE_PRICE_CEILING = 1.5
"""A fleet choosing among candidates for capacity never pays more than this times what the plan expects."""

@dataclass
class PoolView:
    """A node pool against the catalog: which offerings it may launch, and what its nodes hold."""

    pool: NodePool
    position: int
    fixed_labels: dict[str, str]
    base: np.ndarray
    """[O] offerings the pool allows (capacity types, its reservations, its requirements)."""
    allocatable: list[dict[str, int]]
    """Per instance type (catalog order): what pods may request on a node of it in this pool."""
    capacity_order: tuple[CapacityType, ...]
    reservations: frozenset[str]
    fractional_ok: bool = False
    """The pool asks for fractional-GPU types, so any pod it places may go to one (see `fractional`)."""
    tiers: dict[CapacityType, np.ndarray] = field(default_factory=dict)
    """Per capacity type, the positions of the `base` offerings of it, ascending (read-only): a solve's tiers
    when every offering is available."""


@dataclass
class Candidates:
    """The ranked candidate types of one new node, with what each would cost."""

    types: list[int]
    prices: list[float]
    """Cheapest price of each candidate over the claim's zones."""
    max_prices: list[float]
    zones: tuple[str, ...]
    reservation: str | None = None
    reservation_position: int = -1


@dataclass
class TierArrays:
    """A tier's offerings (positions in the catalog index) with what ranking candidates needs of them."""

    tier: np.ndarray
    types: np.ndarray
    zones: np.ndarray
    prices: np.ndarray
    ok: np.ndarray
    """[C, N] whether an offering may hold one pod of each class."""
    order: np.ndarray
    """The offerings sorted by instance type (stable)."""
    starts: np.ndarray
    """Where each instance type's run begins in `order`."""
    present: np.ndarray
    """The instance type of each run."""


@dataclass
class NewNode:
    pool: int
    capacity_type: CapacityType
    candidates: Candidates
    counts: np.ndarray
    gang: str | None = None

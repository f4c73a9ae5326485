"""A value computed from an immutable object, kept per object: the same pods, claims and tuples of them come back
pass after pass (the simulator hands the same objects every minute until they change), so each is computed once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["PER_OBJECT_LIMIT", "PerObject"]

M = TypeVar("M")
V = TypeVar("V")

PER_OBJECT_LIMIT = 16384
"""Objects a `PerObject` keeps by default; past it, cleared. Each entry holds its object (a few KB for a pod)."""


class PerObject(Generic[M, V]):
    """`compute(obj)` kept per object (held, so its id is not reused) up to `limit` objects; past it, cleared. Only
    for objects that never change (frozen models, tuples of them): the value is of the object, not of its id."""

    def __init__(self, compute: Callable[[M], V], limit: int = PER_OBJECT_LIMIT) -> None:
        self.compute = compute
        self.limit = limit
        self._kept: dict[int, tuple[M, V]] = {}

    def __call__(self, obj: M) -> V:
        found = self._kept.get(id(obj))
        if found is not None and found[0] is obj:
            return found[1]
        value = self.compute(obj)
        if len(self._kept) >= self.limit:
            self._kept.clear()
        self._kept[id(obj)] = (obj, value)
        return value

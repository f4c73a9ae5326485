"""Frozen models with cached properties: a copy with changed fields forgets what was computed from the old ones.

`functools.cached_property` keeps its value in the instance's `__dict__`, which pydantic's `model_copy` copies
whole before applying `update`: without this, `pod.model_copy(update={"requests": ...})` kept the old pod's
parsed `resources`, and a node copied with another `provider_id` its old `instance_id`.
"""

from __future__ import annotations

from functools import cache, cached_property
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Self

__all__ = ["CachedModel", "unlocked_cached_property"]


class unlocked_cached_property(cached_property):  # noqa: N801 (a decorator, named as the one it stands for)
    """`functools.cached_property` without Python 3.11's lock, as 3.12 made it: computed on first read and kept in
    the instance's `__dict__`, which later reads find before the descriptor.

    3.11 takes one lock per property, shared by every instance, on each first read: a pending pod's `resources`
    and `beyond_any_node` are first read for all ten thousand pods of a burst when the packer sorts them, and the
    lock made that read cost ~2.5 µs more than the value itself. Two threads reading a value first at once may
    each compute it (the lock was there for that); the values so kept are pure functions of a frozen model.
    """

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.attrname] = self.func(instance)  # type: ignore[index]  # set by __set_name__
        return value


class CachedModel(BaseModel):
    """A model whose `cached_property` values are dropped from a copy made with `update` (computed again on use)."""

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        if update:
            computed = copied.__dict__
            for name in _cached_properties(type(self)):
                computed.pop(name, None)
        return copied


@cache
def _cached_properties(cls: type) -> tuple[str, ...]:
    """The names of `cls`'s cached properties, its bases' included: found once per class, since walking the
    namespaces of its MRO (a pod's five classes hold some 180 names, 77 of them pydantic's `BaseModel`) took ~10 µs
    of a copy's ~12, and the consolidation pass copies pods by the tens of thousands over a replay."""
    return tuple(name for klass in cls.__mro__ for name, value in vars(klass).items()
                 if isinstance(value, cached_property))

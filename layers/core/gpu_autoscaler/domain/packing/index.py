"""The catalog as arrays: offerings, their node labels and prices, indexed once for many packing passes.

Matching a pod's node selector against every offering one label dict at a time costs microseconds per
offering and pod; here each label key is a column of integer codes over all offerings, so a requirement
is one `np.isin` over the column, and the answer is cached for every pod class that repeats it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.config import CAPACITY_ORDER
from gpu_autoscaler.domain.catalog import ANY, unavailable_key
from gpu_autoscaler.domain.pool_labels import pool_labels
from gpu_autoscaler.models import labels as L

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from gpu_autoscaler.config import CapacityType, NodePool
    from gpu_autoscaler.domain.catalog import Catalog, OfferingKey
    from gpu_autoscaler.models.catalog import InstanceType, Offering
    from gpu_autoscaler.models.requirements import Requirement

__all__ = ["BY_OFFERING", "CatalogIndex", "requirement_labels", "type_allowed"]

BY_OFFERING = frozenset({L.ZONE, L.CAPACITY_TYPE})
"""Label keys an offering decides, not its instance type: what a question about types alone leaves out."""
_MISSING = -1


def requirement_labels(instance_type: InstanceType, pool: NodePool, zone: str | None = None,
                       capacity_type: str | None = None) -> dict[str, str]:
    """The labels a node of this type in this pool carries, which the pool's requirements are read against: its
    type's, its zone and capacity type (when given), its OS (every image here is Linux), and the labels every node
    of the pool registers with (`pool_labels`: its own, its name, its sharing mode), which win as the kubelet
    registers them. Karpenter's example NodePool asks for `kubernetes.io/os In
    linux` beside the architecture and capacity type; read on the type's labels alone, no node would meet it."""
    labels = dict(instance_type.labels)
    if zone is not None:
        labels[L.ZONE] = zone
    if capacity_type is not None:
        labels[L.CAPACITY_TYPE] = capacity_type
    labels[L.OS] = "linux"
    labels.update(pool_labels(pool))
    return labels


def type_allowed(pool: NodePool, instance_type: InstanceType) -> bool:
    """Whether the pool's requirements allow the type in some zone and capacity type: those on the zone and the
    capacity type (`BY_OFFERING`) are the offerings' to answer."""
    labels = requirement_labels(instance_type, pool)
    return all(r.matches(labels) for r in pool.requirements if r.key not in BY_OFFERING)


class CatalogIndex:
    """Offerings of a catalog (restricted to the configured zones) as parallel numpy arrays."""

    def __init__(self, catalog: Catalog, zones: Collection[str] | None = None) -> None:
        self.catalog = catalog
        allowed = set(zones) if zones is not None else None
        self.types: tuple[InstanceType, ...] = catalog.instance_types()
        self.type_position = {t.name: i for i, t in enumerate(self.types)}
        self.offerings: tuple[Offering, ...] = tuple(
            o for o in catalog.all_offerings() if allowed is None or o.zone in allowed
        )
        self.zones: tuple[str, ...] = tuple(sorted({o.zone for o in self.offerings}))
        zone_position = {z: i for i, z in enumerate(self.zones)}
        capacity_position = {c: i for i, c in enumerate(CAPACITY_ORDER)}
        n = len(self.offerings)
        self.type_of = np.fromiter((self.type_position[o.instance_type] for o in self.offerings), np.int64, n)
        self.zone_of = np.fromiter((zone_position[o.zone] for o in self.offerings), np.int64, n)
        self.capacity_of = np.fromiter((capacity_position[o.capacity_type] for o in self.offerings), np.int64, n)
        self.price = np.fromiter((o.price_per_hour for o in self.offerings), np.float64, n)
        self.available = np.fromiter(
            (o.available_count if o.available_count is not None else -1 for o in self.offerings), np.int64, n
        )
        self.positions: dict[OfferingKey, list[int]] = {}
        self._reservations: dict[OfferingKey, list[int]] = {}  # a reservation's record → its offerings' positions
        for i, o in enumerate(self.offerings):
            self.positions.setdefault(o.key, []).append(i)
            if o.reservation_id:
                key = unavailable_key(o.instance_type, o.zone, o.capacity_type, o.reservation_id)
                self._reservations.setdefault(key, []).append(i)
        self.type_vcpu = np.array([t.vcpu for t in self.types], np.int64)
        self._codes: dict[str, tuple[np.ndarray, dict[str, int]]] = {}
        self._numbers: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.offerings)

    def capacity_code(self, capacity_type: CapacityType) -> int:
        return CAPACITY_ORDER.index(capacity_type)

    def tier(self, mask: np.ndarray, capacity_type: CapacityType) -> np.ndarray:
        """The positions, ascending, of the offerings in `mask` of this capacity type: a tier the solver opens
        nodes from."""
        return np.flatnonzero(mask & (self.capacity_of == self.capacity_code(capacity_type)))

    def excluded(self, keys: Collection[OfferingKey]) -> np.ndarray:
        """A mask of the offerings with these keys (e.g. marked unavailable after insufficient capacity); a key
        of `ANY` instance type (and zone) masks every offering of its zone (or any zone) and capacity type, a
        reservation's (`unavailable_key`) the offerings of that reservation alone."""
        mask = np.zeros(len(self.offerings), bool)
        for key in keys:
            instance_type, zone, capacity_type = key
            if instance_type != ANY:
                for i in (*self.positions.get(key, ()), *self._reservations.get(key, ())):
                    mask[i] = True
            elif capacity_type in CAPACITY_ORDER and (zone == ANY or zone in self.zones):
                wide = self.capacity_of == CAPACITY_ORDER.index(capacity_type)
                mask |= wide if zone == ANY else wide & (self.zone_of == self.zones.index(zone))
        return mask

    def label(self, position: int, key: str) -> str | None:
        offering = self.offerings[position]
        if key == L.ZONE:
            return offering.zone
        if key == L.CAPACITY_TYPE:
            return offering.capacity_type
        if key == L.OS:
            return "linux"
        return self.types[self.type_position[offering.instance_type]].labels.get(key)

    def _column(self, key: str) -> tuple[np.ndarray, dict[str, int]]:
        found = self._codes.get(key)
        if found is None:
            vocabulary: dict[str, int] = {}
            codes = np.full(len(self.offerings), _MISSING, np.int64)
            for i in range(len(self.offerings)):
                value = self.label(i, key)
                if value is not None:
                    codes[i] = vocabulary.setdefault(value, len(vocabulary))
            found = (codes, vocabulary)
            self._codes[key] = found
        return found

    def _number(self, key: str) -> np.ndarray:
        found = self._numbers.get(key)
        if found is None:
            codes, vocabulary = self._column(key)
            values = np.full(len(vocabulary) + 1, np.nan)
            for text, code in vocabulary.items():
                try:
                    values[code] = int(text)
                except ValueError:
                    pass
            found = values[codes]  # code −1 picks the trailing NaN
            self._numbers[key] = found
        return found

    def requirement_mask(self, requirement: Requirement, fixed: Mapping[str, str]) -> np.ndarray:
        """Offerings whose node labels satisfy the requirement.

        `fixed` holds labels every node of the pool carries (its name, its configured labels); they win
        over the offering's own, as node labels from the pool do on a real node.
        """
        n = len(self.offerings)
        if requirement.key in fixed:
            return np.full(n, requirement.matches({requirement.key: fixed[requirement.key]}), bool)
        op = requirement.operator
        if op in ("Gt", "Lt"):
            numbers = self._number(requirement.key)
            bound = int(requirement.values[0])
            with np.errstate(invalid="ignore"):
                return numbers > bound if op == "Gt" else numbers < bound
        codes, vocabulary = self._column(requirement.key)
        present = codes != _MISSING
        if op == "Exists":
            return present
        if op == "DoesNotExist":
            return ~present
        wanted = [vocabulary[v] for v in requirement.values if v in vocabulary]
        hit = np.isin(codes, wanted) if wanted else np.zeros(n, bool)
        return hit if op == "In" else ~hit

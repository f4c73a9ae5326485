"""The catalog of one region: instance types and their offerings, indexed for the packer's questions.

A `Catalog` is plain data built once from a `CatalogSource` (AWS, the emulator, the simulator) and then
queried many times per packing pass, so everything is indexed up front and every query returns offerings
cheapest first. It never calls the cloud; prices are whatever the source put on the offerings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.config import CAPACITY_ORDER
from gpu_autoscaler.errors import GpuAutoscalerError

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable

    from gpu_autoscaler.config import CapacityType
    from gpu_autoscaler.models.catalog import InstanceType, Offering
    from gpu_autoscaler.ports import CatalogSource

__all__ = ["ANY", "Catalog", "OfferingKey", "UnknownInstanceType", "is_excluded", "offering_order", "unavailable_key"]

OfferingKey = tuple[str, str, str]
"""(instance type, zone, capacity type), as in `Offering.key` and the unavailable-offering records; a reservation's
record names the reservation where the capacity type stands (`unavailable_key`)."""
ANY = "*"
"""In an unavailable-offering record, for the instance type (and the zone): every offering of that zone and capacity
type, or of that capacity type. What EC2 refuses for a reason that is no instance type's — a subnet out of
addresses, an account that may not launch Spot — is marked in one record, for the same TTL, as Karpenter marks a
subnet or a capacity type unavailable beside its offerings; no instance type or zone is ever named `*`."""

_CAPACITY_RANK = {capacity_type: rank for rank, capacity_type in enumerate(CAPACITY_ORDER)}


class UnknownInstanceType(GpuAutoscalerError, KeyError):
    """The catalog holds no instance type of that name (not offered in the region or its zones)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown instance type"


def unavailable_key(instance_type: str, zone: str, capacity_type: str,
                    reservation_id: str | None = None) -> OfferingKey:
    """The record that marks an offering unavailable: its key, but a reservation's names the reservation, its id in
    place of `reserved` — so one reservation found full (`ReservationCapacityExceeded`) or ending leaves another of
    the same type and zone on offer, as Karpenter marks only the reservation that failed (karpenter-provider-aws
    pkg/providers/instance/instance.go `updateUnavailableOfferingsCache`: capacity reservation provider
    `MarkUnavailable(ids)`). Still three parts, as the state table has always stored them (`UNAVAILABLE#type#zone#…`):
    a record of older code, (type, zone, `reserved`), reads as before and stands for every reservation there until
    it expires; a reservation id is never a capacity type, so older code reading a new record matches nothing."""
    if capacity_type == "reserved" and reservation_id:
        return (instance_type, zone, reservation_id)
    return (instance_type, zone, capacity_type)


def is_excluded(key: OfferingKey, excluded: Collection[OfferingKey], reservations: Collection[str] = ()) -> bool:
    """Whether `excluded` holds this offering, by its own key or a record for its zone or capacity type (`ANY`); or,
    for reserved capacity in `reservations` (the offering's own, or the ones a claim may launch into), by a record
    for each of them (`unavailable_key`)."""
    instance_type, zone, capacity_type = key
    if key in excluded or (ANY, zone, capacity_type) in excluded or (ANY, ANY, capacity_type) in excluded:
        return True
    return bool(reservations) and all(
        unavailable_key(instance_type, zone, capacity_type, r) in excluded for r in reservations)


def offering_order(offering: Offering) -> tuple[float, int, str, str, str]:
    """Cheapest first; at equal price reserved before spot before on-demand; then by name, for stable plans."""
    return (
        offering.price_per_hour,
        _CAPACITY_RANK.get(offering.capacity_type, len(_CAPACITY_RANK)),
        offering.instance_type,
        offering.zone,
        offering.reservation_id or "",
    )


class Catalog:
    """Instance types and offerings of one region. Immutable once built; queries never copy the index."""

    __slots__ = ("_by_key", "_by_type", "_gpu_types", "_offerings", "_types", "_zones")

    def __init__(self, instance_types: Iterable[InstanceType], offerings: Iterable[Offering]) -> None:
        self._types: dict[str, InstanceType] = {t.name: t for t in sorted(instance_types, key=lambda t: t.name)}
        ordered = sorted(offerings, key=offering_order)
        by_type: dict[str, list[Offering]] = {name: [] for name in self._types}
        by_key: dict[OfferingKey, Offering] = {}
        for offering in ordered:
            if offering.instance_type not in by_type:
                raise UnknownInstanceType(
                    f"offering {offering.key} names instance type '{offering.instance_type}', which the catalog "
                    "does not hold"
                )
            by_type[offering.instance_type].append(offering)
            by_key.setdefault(offering.key, offering)
        self._offerings: tuple[Offering, ...] = tuple(ordered)
        self._by_type: dict[str, tuple[Offering, ...]] = {name: tuple(items) for name, items in by_type.items()}
        self._by_key = by_key
        self._gpu_types = tuple(t for t in self._types.values() if t.is_gpu)
        self._zones = tuple(sorted({o.zone for o in ordered}))

    @classmethod
    def from_source(cls, source: CatalogSource) -> Catalog:
        return cls(source.instance_types(), source.offerings())

    # Instance types

    def instance_types(self) -> tuple[InstanceType, ...]:
        """Every instance type, by name."""
        return tuple(self._types.values())

    def gpu_types(self) -> tuple[InstanceType, ...]:
        """Instance types that advertise at least one GPU device, by name."""
        return self._gpu_types

    def instance_type(self, name: str) -> InstanceType:
        try:
            return self._types[name]
        except KeyError:
            raise UnknownInstanceType(f"no instance type '{name}' in the catalog") from None

    def get(self, name: str) -> InstanceType | None:
        return self._types.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def zones(self) -> tuple[str, ...]:
        """Zones where at least one offering exists, sorted."""
        return self._zones

    # Offerings

    def all_offerings(self) -> tuple[Offering, ...]:
        """Every offering, cheapest first."""
        return self._offerings

    def offerings_for(self, instance_type: str) -> tuple[Offering, ...]:
        """The offerings of one instance type, cheapest first; empty when it has none."""
        if instance_type not in self._types:
            raise UnknownInstanceType(f"no instance type '{instance_type}' in the catalog")
        return self._by_type[instance_type]

    def offering(self, key: OfferingKey) -> Offering | None:
        """The cheapest offering with this key (several reservations may share one type × zone)."""
        return self._by_key.get(key)

    def price(self, key: OfferingKey) -> float | None:
        found = self._by_key.get(key)
        return found.price_per_hour if found else None

    def offerings(
        self,
        zones: Collection[str] | None = None,
        capacity_types: Collection[CapacityType] | None = None,
        exclude: Collection[OfferingKey] | None = None,
        *,
        instance_types: Collection[str] | None = None,
        gpu_only: bool = False,
    ) -> list[Offering]:
        """Offerings passing every given filter, cheapest first.

        `exclude` takes the records of offerings known to be unavailable (insufficient capacity), which the
        packer must not plan on (`is_excluded`; a reservation's names it, `unavailable_key`).
        """
        if instance_types is not None:
            unknown = [name for name in instance_types if name not in self._types]
            if unknown:
                raise UnknownInstanceType(f"no instance type {', '.join(sorted(unknown))} in the catalog")
            pool: Iterable[Offering] = sorted(
                (o for name in instance_types for o in self._by_type[name]), key=offering_order
            )
        else:
            pool = self._offerings
        zone_set = set(zones) if zones is not None else None
        type_set = set(capacity_types) if capacity_types is not None else None
        excluded = set(exclude) if exclude else None
        gpu_names = {t.name for t in self._gpu_types} if gpu_only else None
        return [
            o
            for o in pool
            if (zone_set is None or o.zone in zone_set)
            and (type_set is None or o.capacity_type in type_set)
            and (excluded is None or not is_excluded(o.key, excluded, (o.reservation_id,) if o.reservation_id else ()))
            and (gpu_names is None or o.instance_type in gpu_names)
        ]

    def cheapest(
        self,
        instance_type: str | None = None,
        zones: Collection[str] | None = None,
        capacity_types: Collection[CapacityType] | None = None,
        exclude: Collection[OfferingKey] | None = None,
    ) -> Offering | None:
        """The cheapest offering passing the filters (of one instance type, when named), or None."""
        names = [instance_type] if instance_type is not None else None
        found = self.offerings(zones, capacity_types, exclude, instance_types=names)
        return found[0] if found else None

    def without(self, exclude: Collection[OfferingKey]) -> Catalog:
        """The same catalog less the excluded offerings (e.g. those marked unavailable for a while)."""
        if not exclude:
            return self
        return Catalog(self._types.values(), self.offerings(exclude=exclude))

"""Where a persistent volume can be attached, read from the Kubernetes JSON of a PersistentVolume or StorageClass.

A bound claim's PersistentVolume says where it can be used in `spec.nodeAffinity` (the EBS CSI driver writes
`topology.ebs.csi.aws.com/zone`, newer versions `topology.kubernetes.io/zone`); a StorageClass's
`allowedTopologies` bound where a `WaitForFirstConsumer` claim will be provisioned. kube-scheduler's VolumeBinding
filter requires the node to satisfy them (https://kubernetes.io/docs/concepts/storage/persistent-volumes/#node-
affinity, storage-classes/#allowed-topologies). The agent (a pending pod's volumes) and the cluster adapter (a
bound pod's, which its replacement or its move must keep) read them here, so the two agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = ["ZONE_KEYS", "persistent_volume_zones", "zones_of_terms"]

ZONE_KEYS = frozenset({"topology.kubernetes.io/zone", "topology.ebs.csi.aws.com/zone",
                       "failure-domain.beta.kubernetes.io/zone"})


def zones_of_terms(terms: Iterable[Mapping[str, Any]], expressions: str) -> set[str] | None:
    """Union over ORed terms of the zones each allows (`In` on a zone key, ANDed within a term); None when one of
    them allows any zone."""
    zones: set[str] = set()
    for term in terms:
        allowed: set[str] | None = None
        for e in term.get(expressions) or ():
            if e.get("key") in ZONE_KEYS and e.get("operator", "In") == "In":
                values = set(e.get("values") or ())
                allowed = values if allowed is None else allowed & values
        if allowed is None:
            return None
        zones |= allowed
    return zones


def persistent_volume_zones(volume: Mapping[str, Any]) -> frozenset[str] | None:
    """The zones a PersistentVolume can be attached in (its required node affinity); None: any."""
    terms = (((volume.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {}).get(
        "nodeSelectorTerms") or ()
    zones = zones_of_terms(terms, "matchExpressions") if terms else None
    return frozenset(zones) if zones is not None else None

"""Drift: a node that no longer matches the configuration it would be launched with today.

Karpenter replaces drifted nodes within the pool's budgets; so does consolidation here (reason
`Drifted`). A node has drifted when:

- its pool is gone from the configuration, or its zone from the network's subnets;
- its capacity type is no longer among the pool's, or its capacity reservation no longer the pool's;
- its instance type, zone and capacity type no longer satisfy the pool's requirements (the labels are
  the catalog's, as the packer matches them);
- its image is not the one its pool's nodes are launched from now, for its architecture — the pool's own `ami`
  where it sets one, else the global one (`Config.pool_images`, what the fleet launches from; Karpenter's AMI
  drift compares the NodeClaim's `status.imageID` with its NodeClass's AMIs). The claim's `imageId` attribute is
  the image the fleet's request named for the instance, recorded with the launch; a claim launched before it was
  recorded gets its pool's image at registration;
- its security groups, as a set, are not the configured ones, or its subnet is not its zone's configured one
  (Karpenter's SecurityGroupDrift and SubnetDrift, `areSecurityGroupsDrifted` and `isSubnetDrifted` in
  karpenter-provider-aws pkg/cloudprovider/drift.go, compare the instance's with its NodeClass's). Both are recorded
  with the launch (`network_attributes`); a claim launched before they were has none, and is not compared;
- the pool's node settings — taints, labels, GPU sharing, root volume, EFA, and what shapes the instance at
  launch: `blockDeviceMappings`, `prePullImages`, `soci` and the kubelet reservations every node's user data states
  (`overhead.kubeReserved`, `systemReserved`, `evictionHard`: `user_data.node_setup`) (Karpenter's EC2NodeClass
  hash covers block devices, user data and its kubelet block, `Kubelet.String()` in `EC2NodeClass.Hash`,
  karpenter-provider-aws pkg/apis/v1/ec2nodeclass.go) — changed since the node registered (the claim's `poolHash`
  attribute, stamped at registration, against `pool_hash` now). The pool's `ami` is left to the image comparison
  above, as Karpenter's hash leaves out `amiSelectorTerms`: a new image is a new id.

Upgrades (Karpenter's hash versions, `ec2nodeclass-hash-version`): a setting newly covered by the hash counts
only when set, so a pool that sets none keeps its hash (Karpenter hashes with `IgnoreZeroValue`). A claim stamped
under an older version than `POOL_HASH_VERSION` (its `poolHashVersion` attribute; none for version 1) is compared
with what its version covered — version 1: the settings above before the launch-shaping ones, and the global image,
which is what registration stamped then; version 2: all but the kubelet reservations — so no node is replaced by
the upgrade itself. A claim stamped under version 2 or later that has not drifted under it is stamped again under
the current one (`restamp`, by the reconcile step), so what the new version covers counts from then on.

Pure: configuration, catalog and claim in; a reason in words (or None) out.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from gpu_autoscaler.domain.packing.index import requirement_labels
from gpu_autoscaler.models import labels as L

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config, NodePool, Overhead
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.models.claims import NodeClaim

__all__ = [
    "IMAGE_ATTRIBUTE",
    "POOL_HASH_ATTRIBUTE",
    "POOL_HASH_VERSION",
    "POOL_HASH_VERSION_ATTRIBUTE",
    "SECURITY_GROUPS_ATTRIBUTE",
    "SUBNET_ATTRIBUTE",
    "drift_reason",
    "expected_image",
    "network_attributes",
    "pool_hash",
    "restamp",
]

IMAGE_ATTRIBUTE = "imageId"
"""NodeClaim attribute: the AMI id the instance was launched from (as its fleet request named it)."""
SECURITY_GROUPS_ATTRIBUTE = "securityGroups"
"""NodeClaim attribute: the security group ids its instance was launched with, sorted and comma-separated."""
SUBNET_ATTRIBUTE = "subnetId"
"""NodeClaim attribute: the subnet id its instance was launched into."""
POOL_HASH_ATTRIBUTE = "poolHash"
"""NodeClaim attribute: `pool_hash` of its pool when its node registered."""
POOL_HASH_VERSION_ATTRIBUTE = "poolHashVersion"
"""NodeClaim attribute: the `POOL_HASH_VERSION` its `poolHash` was computed under (absent: version 1)."""
POOL_HASH_VERSION = "3"
"""Bumped when a setting that may already be set joins the hash, or one leaves it: a claim stamped under an older
version is compared with that version's digest, never with today's (no node drifts by an upgrade). 2:
`blockDeviceMappings`, `prePullImages`, `soci`; the image recorded at launch (version 1 claims carry the global
image, stamped at registration). 3: the kubelet reservations (`overhead.kubeReserved`, `systemReserved`,
`evictionHard`)."""


def pool_hash(pool: NodePool, overhead: Overhead) -> str:
    """A digest of the settings that shape a node of the pool once launched (requirements are checked directly):
    the pool's and the configuration's kubelet reservations (`overhead`).

    Kept for the very (immutable) pool and overhead objects it was computed from: consolidation asks it of every
    node on every pass."""
    found = _POOL_HASHES.get(id(pool))
    if found is not None and found[0] is pool and found[1] is overhead:
        return found[2]
    if len(_POOL_HASHES) >= _POOL_HASHES_KEPT:
        _POOL_HASHES.clear()
    digest = _pool_hash(pool, overhead, int(POOL_HASH_VERSION))
    _POOL_HASHES[id(pool)] = (pool, overhead, digest)
    return digest


_POOL_HASHES: dict[int, tuple[NodePool, Overhead, str]] = {}
"""id(pool) → (the pool, the overhead, their hash); both are held, so their ids are not reused while it lives."""
_POOL_HASHES_KEPT = 64


def _pool_hash(pool: NodePool, overhead: Overhead, version: int) -> str:
    """The digest under `version`: 1, the settings it covered; 2, with the launch-shaping ones; 3, with the kubelet
    reservations. Each setting a version adds joins the shape only when set, so a pool (and a configuration) that
    sets none has the same digest under every version."""
    shape: dict[str, object] = {
        "taints": sorted((t.key, t.value, t.effect) for t in pool.taints),
        "labels": sorted(pool.labels.items()),
        "gpuSharing": pool.gpu_sharing.model_dump(mode="json"),
        "ephemeralStorage": pool.ephemeral_storage,
        "efa": pool.efa,
    }
    if version >= 2:
        if pool.block_device_mappings:
            shape["blockDeviceMappings"] = sorted(
                (m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in pool.block_device_mappings),
                key=lambda m: str(m.get("deviceName")))
        if pool.pre_pull_images:
            shape["prePullImages"] = sorted(pool.pre_pull_images)
        if pool.soci:
            shape["soci"] = True
    if version >= 3:
        reservations = {"kubeReserved": overhead.kube_reserved, "systemReserved": overhead.system_reserved,
                        "evictionHard": overhead.eviction_hard}
        shape.update((key, sorted(values.items())) for key, values in reservations.items() if values)
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def expected_image(config: Config, pool: NodePool, architecture: str) -> str | None:
    """The image a node of this pool and architecture (`x86_64` or `arm64`) is launched from now: the pool's own
    where it sets one, else the global one — what the fleet's request names (`LaunchContext.images_for`)."""
    return config.pool_images(pool).get(architecture)


def network_attributes(config: Config, zone: str) -> dict[str, str]:
    """What a claim records of the network its instance is launched into now in `zone`: the configured security
    groups, which every launch template holds (`launch_templates.launch_template_data`: `SecurityGroupIds`, or each
    EFA interface's `Groups`; the stack writes the templates and the configuration together), and the zone's
    configured subnet, which the request's override names (`fleet.build_request`). The configuration's ids: an
    emulator launches into stand-ins for them."""
    attributes = {SECURITY_GROUPS_ATTRIBUTE: ",".join(sorted(config.network.security_groups))}
    subnet = config.network.subnets.get(zone)
    if subnet:
        attributes[SUBNET_ATTRIBUTE] = subnet
    return attributes


def drift_reason(config: Config, catalog: Catalog, claim: NodeClaim) -> str | None:
    """Why this claim's node no longer matches the configuration, or None if it still does."""
    try:
        pool = config.pool(claim.pool)
    except KeyError:
        return f"pool {claim.pool} is no longer configured"
    zone = claim.zone or (claim.zones[0] if len(claim.zones) == 1 else None)
    if zone is not None and zone not in config.network.subnets:
        return f"zone {zone} is no longer among the configured subnets"
    if claim.capacity_type not in pool.capacity_types:
        return f"capacity type {claim.capacity_type} is no longer allowed in pool {pool.name}"
    if claim.reservation_id and claim.reservation_id not in {r.id for r in pool.capacity_reservations}:
        return f"capacity reservation {claim.reservation_id} is no longer pool {pool.name}'s"
    found = _requirement_drift(pool, catalog, claim, zone)
    if found:
        return found
    version = _stamped_version(claim)
    image = claim.attributes.get(IMAGE_ATTRIBUTE)
    instance_type = catalog.get(claim.instance_type) if claim.instance_type else None
    if image and instance_type is not None:
        # A version 1 stamp is the global image registration wrote, whatever the pool launched from.
        ami = config.pool_ami(pool) if version >= 2 else config.ami
        wanted = ami.images().get(instance_type.architecture)
        if wanted and image != wanted:
            return f"image {image}, the configuration now wants {wanted} ({ami.family} {ami.version})"
    found = _network_drift(config, claim, zone)
    if found:
        return found
    recorded = claim.attributes.get(POOL_HASH_ATTRIBUTE)
    current = int(POOL_HASH_VERSION)
    if recorded and recorded != (pool_hash(pool, config.overhead) if version == current
                                 else _pool_hash(pool, config.overhead, version)):
        return (f"pool {pool.name}'s node settings (taints, labels, GPU sharing, storage, volumes, pre-pulled images, "
                "SOCI or EFA) or the kubelet reservations (overhead.kubeReserved, systemReserved, evictionHard) "
                "changed")
    return None


def restamp(claim: NodeClaim, pool: NodePool, overhead: Overhead) -> dict[str, str] | None:
    """The attributes that stamp a claim again under the current `POOL_HASH_VERSION`, when it was stamped under an
    older one and its settings still match what that version covered; None otherwise (current, unstamped, or
    drifted: stamping a drifted claim again would hide its drift).

    Compared under its own version only, a claim never drifts on what a later version covers: a kubelet
    reservation changed after an upgrade went unseen on every node registered before it. Karpenter's hash controller
    likewise re-annotates the NodeClaims that have not drifted when the hash version changes
    (karpenter-provider-aws `pkg/controllers/nodeclass/hash/controller.go`, `updateNodeClaimHash`)."""
    recorded = claim.attributes.get(POOL_HASH_ATTRIBUTE)
    version = _stamped_version(claim)
    if not recorded or not 2 <= version < int(POOL_HASH_VERSION) or recorded != _pool_hash(pool, overhead, version):
        return None  # a version 1 stamp also means the global image was recorded: stamped again, it would drift
    return {POOL_HASH_ATTRIBUTE: pool_hash(pool, overhead), POOL_HASH_VERSION_ATTRIBUTE: POOL_HASH_VERSION}


def _stamped_version(claim: NodeClaim) -> int:
    """The `POOL_HASH_VERSION` the claim's stamp was computed under (1 without one); a newer version's stamp (this
    code rolled back to) is compared under this code's own."""
    stamped = claim.attributes.get(POOL_HASH_VERSION_ATTRIBUTE, "1")
    return min(int(stamped), int(POOL_HASH_VERSION)) if stamped.isdigit() else 1


def _network_drift(config: Config, claim: NodeClaim, zone: str | None) -> str | None:
    """The recorded security groups (as a set) and subnet against the configuration's; nothing recorded, no drift."""
    groups = claim.attributes.get(SECURITY_GROUPS_ATTRIBUTE)
    if groups and set(groups.split(",")) != set(config.network.security_groups):
        return (f"launched with security groups {', '.join(groups.split(','))}; the configuration now gives its "
                f"nodes {', '.join(sorted(config.network.security_groups))}")
    subnet = claim.attributes.get(SUBNET_ATTRIBUTE)
    wanted = config.network.subnets.get(zone) if zone else None
    if subnet and wanted and subnet != wanted:
        return f"launched into subnet {subnet} in {zone}; the configuration now launches there into {wanted}"
    return None


def _requirement_drift(pool: NodePool, catalog: Catalog, claim: NodeClaim, zone: str | None) -> str | None:
    if not claim.instance_type:
        return None
    instance_type = catalog.get(claim.instance_type)
    if instance_type is None:
        return None  # not in the catalog any more (retired): nothing to match against, and nothing better known
    labels = requirement_labels(instance_type, pool, zone, claim.capacity_type)
    for requirement in pool.requirements:
        if requirement.key == L.ZONE and zone is None:
            continue
        if not requirement.matches(labels):
            values = ",".join(requirement.values)
            return (f"{claim.instance_type} ({claim.capacity_type}{', ' + zone if zone else ''}) no longer meets "
                    f"pool {pool.name}'s requirement {requirement.key} {requirement.operator} {values}".rstrip())
    return None


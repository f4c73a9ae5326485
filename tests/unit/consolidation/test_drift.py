"""Drift: what makes a node no longer match the configuration it would be launched with today."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.config import Overhead
from gpu_autoscaler.domain.drift import POOL_HASH_VERSION, drift_reason, pool_hash, restamp
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from tests.unit.packing.builders import NOW, make_catalog, make_config, make_pool

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config, NodePool
    from gpu_autoscaler.domain.catalog import Catalog

CATALOG = make_catalog()
CONFIG = make_config(make_pool(requirements=[
    {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["g"]}]))
IMAGE = CONFIG.ami.x86_64


def claim(**changes: Any) -> NodeClaim:
    values: dict[str, Any] = {
        "cluster": "test", "id": "nc-1", "pool": "gpu", "capacity_type": "spot", "zones": ("us-east-1a",),
        "instance_types": ("g6.xlarge",), "price_per_hour": 0.4, "state": ClaimState.REGISTERED, "created_at": NOW,
        "instance_id": "i-1", "instance_type": "g6.xlarge", "zone": "us-east-1a",
        "attributes": {"imageId": IMAGE, "poolHash": pool_hash(CONFIG.pool("gpu"), CONFIG.overhead)},
    }
    values.update(changes)
    return NodeClaim(**values)


def test_a_node_launched_as_configured_has_not_drifted() -> None:
    assert drift_reason(CONFIG, CATALOG, claim()) is None
    assert drift_reason(CONFIG, CATALOG, claim(attributes={})) is None  # nothing recorded: nothing to compare


def drifted(config: Config, catalog: Catalog, node: NodeClaim) -> str:
    """`drift_reason` of a claim the test knows has drifted (None is for one that has not)."""
    reason = drift_reason(config, catalog, node)
    assert reason is not None, "not drifted"
    return reason


def test_each_kind_of_drift_is_named() -> None:
    assert "no longer configured" in drifted(CONFIG, CATALOG, claim(pool="gone"))
    assert "zone us-east-1z" in drifted(CONFIG, CATALOG, claim(zone="us-east-1z"))
    on_demand_only = make_config(make_pool(capacityTypes=["on-demand"]))
    assert "capacity type spot" in drifted(on_demand_only, CATALOG, claim())
    assert "requirement karpenter.k8s.aws/instance-category In g" in drifted(
        CONFIG, CATALOG, claim(instance_type="p5.4xlarge", capacity_type="on-demand"))
    assert "image ami-0ffffffffffffffff" in drifted(
        CONFIG, CATALOG, claim(attributes={"imageId": "ami-0ffffffffffffffff"}))
    relabelled = make_config(make_pool(labels={"team": "a"}, requirements=CONFIG.pool("gpu").requirements))
    assert "settings" in drifted(relabelled, CATALOG, claim())


def test_karpenters_usual_requirements_hold_on_every_node_of_the_pool() -> None:
    """Karpenter's example NodePool asks for `kubernetes.io/os In linux` beside the architecture and capacity type;
    every node the pool launches carries it, so no node has drifted from it."""
    usual = make_config(make_pool(requirements=[
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]},
        {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu"]},
        {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["g"]}]))
    node = claim(attributes={"imageId": IMAGE, "poolHash": pool_hash(usual.pool("gpu"), usual.overhead)})
    assert drift_reason(usual, CATALOG, node) is None


POOL_AMI = {"family": "AL2023", "version": "v20261120", "x86_64": "ami-0aaaaaaaaaaaaaaa1"}


def stamped(pool: NodePool, **attributes: str) -> NodeClaim:
    """A claim registered by today's reconcile in `pool`, under the default kubelet reservations: its hash, the hash's
    version and `attributes`."""
    return claim(attributes={"poolHash": pool_hash(pool, Overhead()), "poolHashVersion": POOL_HASH_VERSION,
                             **attributes})


def test_a_pool_with_its_own_image_is_compared_with_that_image_not_the_global_one() -> None:
    """The fleet launches a pool's nodes from the pool's own image (`images_for`): drift compares with the same,
    so a global AMI bump leaves such a pool's nodes alone and a bump of the pool's image drifts them."""
    own = make_config(make_pool(ami=POOL_AMI))
    node = stamped(own.pool("gpu"), imageId=POOL_AMI["x86_64"])
    assert drift_reason(own, CATALOG, node) is None
    bumped_global = make_config(make_pool(ami=POOL_AMI),
                                ami={"family": "AL2023", "version": "v2", "x86_64": "ami-0bbbbbbbbbbbbbbb2"})
    assert drift_reason(bumped_global, CATALOG, node) is None
    bumped_pool = make_config(make_pool(ami={**POOL_AMI, "x86_64": "ami-0ccccccccccccccc3"}))
    assert "now wants ami-0ccccccccccccccc3" in drifted(bumped_pool, CATALOG, node)


@pytest.mark.parametrize("change", [
    {"blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "200Gi", "volumeType": "gp3"}}]},
    {"prePullImages": ["public.ecr.aws/nvidia/cuda:12.4.1-base-ubuntu22.04"]},
    {"soci": True},
])
def test_the_pools_volumes_pre_pulled_images_and_snapshotter_are_node_settings(change: dict[str, Any]) -> None:
    """They shape the instance at launch (its volumes, its user data), as Karpenter's EC2NodeClass hash covers
    block devices and user data: a node launched before they changed has drifted."""
    before = make_config(make_pool(soci=False))
    after = make_config(make_pool(**change), ami={"family": "AL2023", "version": "v20261120",
                                                   "x86_64": IMAGE})
    node = stamped(before.pool("gpu"), imageId=IMAGE)
    assert "settings" in drifted(after, CATALOG, node)


def test_a_pool_without_the_newly_hashed_settings_keeps_its_hash() -> None:
    """A field newly covered by the hash counts only when set (Karpenter hashes with IgnoreZeroValue): the nodes
    of a pool that sets none of them keep the hash they registered with, and are not replaced on upgrade."""
    pool = CONFIG.pool("gpu")
    assert pool_hash(pool, CONFIG.overhead) == _legacy_hash(pool)


def test_a_node_registered_before_the_hash_covered_its_pools_volumes_is_not_drifted_by_that() -> None:
    """Karpenter's hash versions: a NodeClaim stamped under an older version is not compared with the new hash
    (the hash controller re-stamps it); here the older stamp is compared with what the older version covered."""
    volumes = [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "200Gi", "volumeType": "gp3"}}]
    config = make_config(make_pool(blockDeviceMappings=volumes))
    pool = config.pool("gpu")
    legacy = claim(attributes={"imageId": IMAGE, "poolHash": _legacy_hash(pool)})
    assert drift_reason(config, CATALOG, legacy) is None
    relabelled = make_config(make_pool(blockDeviceMappings=volumes, labels={"team": "a"}))
    assert "settings" in drifted(relabelled, CATALOG, legacy)  # what the old hash covered still drifts


def test_a_security_group_change_drifts_the_nodes_launched_with_the_old_groups() -> None:
    """Karpenter's SecurityGroupDrift: the instance's groups, as a set, against its NodeClass's
    (`areSecurityGroupsDrifted`, karpenter-provider-aws pkg/cloudprovider/drift.go). Removing an over-broad group or
    adding the self-referencing one EFA needs reaches the running nodes only by replacing them."""
    both = networked(security_groups=["sg-0001", "sg-0002"])
    node = stamped(both.pool("gpu"), imageId=IMAGE, securityGroups="sg-0001,sg-0002")
    assert drift_reason(both, CATALOG, node) is None
    assert drift_reason(networked(security_groups=["sg-0002", "sg-0001"]), CATALOG, node) is None  # a set
    assert drifted(networked(security_groups=["sg-0002"]), CATALOG, node) == (
        "launched with security groups sg-0001, sg-0002; the configuration now gives its nodes sg-0002")


def test_a_subnet_change_in_a_zone_drifts_the_nodes_launched_into_the_old_subnet() -> None:
    """Karpenter's SubnetDrift: the instance's subnet is no longer among its NodeClass's (`isSubnetDrifted`). Here a
    zone has one subnet, so a node drifts when its zone's subnet is another; nodes in the other zones do not."""
    old = CONFIG.network.subnets["us-east-1a"]
    node = stamped(CONFIG.pool("gpu"), imageId=IMAGE, subnetId=old)
    assert drift_reason(CONFIG, CATALOG, node) is None
    moved = networked(subnets={**CONFIG.network.subnets, "us-east-1a": "subnet-0fff"})
    assert drifted(moved, CATALOG, node) == (
        f"launched into subnet {old} in us-east-1a; the configuration now launches there into subnet-0fff")
    elsewhere = stamped(CONFIG.pool("gpu"), imageId=IMAGE, subnetId=CONFIG.network.subnets["us-east-1b"])
    assert drift_reason(moved, CATALOG, elsewhere.model_copy(update={"zone": "us-east-1b"})) is None


def test_a_node_launched_before_its_network_was_recorded_is_not_drifted_by_it() -> None:
    """Nothing recorded, nothing to compare: upgrading gpu-autoscaler replaces no node, whatever its network."""
    changed = networked(subnets={**CONFIG.network.subnets, "us-east-1a": "subnet-0fff"}, security_groups=["sg-0002"])
    assert drift_reason(changed, CATALOG, stamped(CONFIG.pool("gpu"), imageId=IMAGE)) is None


def networked(*, subnets: dict[str, str] | None = None, security_groups: list[str] | None = None) -> Config:
    """CONFIG with its network's subnets or security groups replaced."""
    return make_config(make_pool(requirements=CONFIG.pool("gpu").requirements), network={
        "subnets": subnets or dict(CONFIG.network.subnets),
        "securityGroups": security_groups or list(CONFIG.network.security_groups)})


@pytest.mark.parametrize("overhead", [
    {"kubeReserved": {"memory": "2Gi"}},
    {"systemReserved": {"cpu": "500m"}},
    {"evictionHard": {"memory.available": "500Mi"}},
])
def test_a_kubelet_reservation_change_drifts_the_nodes_launched_with_the_old_ones(overhead: dict[str, Any]) -> None:
    """Every node's user data states the kubelet's reservations (`user_data.node_setup`), so a node launched before
    they changed offers another allocatable than the configuration now describes; Karpenter's EC2NodeClass hash
    covers its kubelet block (`Kubelet.String()` in `EC2NodeClass.Hash`, karpenter-provider-aws
    pkg/apis/v1/ec2nodeclass.go)."""
    node = stamped(CONFIG.pool("gpu"), imageId=IMAGE)
    assert drift_reason(CONFIG, CATALOG, node) is None
    changed = make_config(make_pool(requirements=CONFIG.pool("gpu").requirements), overhead=overhead)
    assert "kubelet reservations" in drifted(changed, CATALOG, node)


def test_a_node_registered_before_the_hash_covered_the_kubelet_reservations_is_not_drifted_by_them() -> None:
    """Reservations already set when gpu-autoscaler is upgraded replace no node: a claim stamped under version 2 is
    compared with what version 2 covered (its pool's volumes among them), and with its pool's own image."""
    volumes = [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "200Gi", "volumeType": "gp3"}}]
    reserved = {"kubeReserved": {"memory": "2Gi"}}
    config = make_config(make_pool(blockDeviceMappings=volumes, ami=POOL_AMI), overhead=reserved)
    pool = config.pool("gpu")
    before = claim(attributes={"imageId": POOL_AMI["x86_64"], "poolHash": _version_2_hash(pool),
                               "poolHashVersion": "2"})
    assert drift_reason(config, CATALOG, before) is None
    resized = make_config(make_pool(blockDeviceMappings=[{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "300Gi"}}],
                                    ami=POOL_AMI), overhead=reserved)
    assert "settings" in drifted(resized, CATALOG, before)  # what version 2 covered still drifts


def _version_2_hash(pool: NodePool) -> str:
    """The hash as reconcile stamped it under version 2: version 1's settings and the launch-shaping ones."""
    shape: dict[str, object] = {
        "taints": sorted((t.key, t.value, t.effect) for t in pool.taints),
        "labels": sorted(pool.labels.items()),
        "gpuSharing": pool.gpu_sharing.model_dump(mode="json"),
        "ephemeralStorage": pool.ephemeral_storage,
        "efa": pool.efa,
        "blockDeviceMappings": sorted(
            (m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in pool.block_device_mappings),
            key=lambda m: str(m.get("deviceName"))),
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def _legacy_hash(pool: NodePool) -> str:
    """The hash as reconcile stamped it before it covered volumes, pre-pulled images and SOCI."""
    shape = {
        "taints": sorted((t.key, t.value, t.effect) for t in pool.taints),
        "labels": sorted(pool.labels.items()),
        "gpuSharing": pool.gpu_sharing.model_dump(mode="json"),
        "ephemeralStorage": pool.ephemeral_storage,
        "efa": pool.efa,
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def test_a_node_stamped_under_an_older_version_is_stamped_again_and_then_drifts_on_what_the_new_one_covers() -> None:
    """After an upgrade, a claim stamped under version 2 whose settings still match what version 2 covered is stamped
    again under the current version (`restamp`), as Karpenter's hash controller re-annotates the NodeClaims that
    have not drifted when the hash version changes (karpenter-provider-aws pkg/controllers/nodeclass/hash/
    controller.go): a later change of the kubelet reservations then drifts it. Before, it never did while it ran."""
    reserved = {"kubeReserved": {"memory": "2Gi"}}
    config = make_config(make_pool(requirements=CONFIG.pool("gpu").requirements), overhead=reserved)
    pool = config.pool("gpu")
    version_2 = pool_hash(pool, Overhead())  # with no reservations set, version 3's digest is version 2's
    before = claim(attributes={"imageId": IMAGE, "poolHash": version_2, "poolHashVersion": "2"})
    changes = restamp(before, pool, config.overhead)
    assert changes == {"poolHash": pool_hash(pool, config.overhead), "poolHashVersion": POOL_HASH_VERSION}
    after = before.model_copy(update={"attributes": {**before.attributes, **changes}})
    assert drift_reason(config, CATALOG, after) is None and restamp(after, pool, config.overhead) is None
    more = make_config(make_pool(requirements=CONFIG.pool("gpu").requirements),
                       overhead={"kubeReserved": {"memory": "3Gi"}})
    assert "kubelet reservations" in drifted(more, CATALOG, after)
    assert drift_reason(more, CATALOG, before) is None  # without the new stamp the change went unseen


def test_a_node_drifted_under_its_own_version_is_not_stamped_again() -> None:
    """Stamping it again would hide its drift: it keeps the old stamp and is replaced."""
    config = make_config(make_pool(requirements=CONFIG.pool("gpu").requirements, labels={"team": "b"}))
    old = make_config(make_pool(requirements=CONFIG.pool("gpu").requirements, labels={"team": "a"}))
    before = claim(attributes={"imageId": IMAGE, "poolHash": pool_hash(old.pool("gpu"), Overhead()),
                               "poolHashVersion": "2"})
    assert restamp(before, config.pool("gpu"), config.overhead) is None

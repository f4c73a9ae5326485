"""Drift: what makes a node no longer match the configuration it would be launched with today."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.drift import drift_reason, pool_hash
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from tests.unit.packing.builders import NOW, make_catalog, make_config, make_pool

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
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
        "attributes": {"imageId": IMAGE, "poolHash": pool_hash(CONFIG.pool("gpu"))},
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
    node = claim(attributes={"imageId": IMAGE, "poolHash": pool_hash(usual.pool("gpu"))})
    assert drift_reason(usual, CATALOG, node) is None

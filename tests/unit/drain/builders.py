"""Small builders with keyword overrides for nodes, pods, claims and drain requests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod
from gpu_autoscaler.models.messages import DrainRequest
from gpu_autoscaler.models.resources import Resources

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def make_node(name: str = "ip-10-0-1-5.ec2.internal", instance_id: str = "i-0aaa", **overrides: Any) -> ClusterNode:
    values: dict[str, Any] = {"name": name, "provider_id": f"aws:///us-east-1a/{instance_id}", "ready": True,
                              "labels": {"karpenter.sh/nodepool": "gpu-burst"},
                              "allocatable": Resources.from_quantities(
                                  {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}),
                              "created_at": NOW - timedelta(hours=1)}
    values.update(overrides)
    return ClusterNode(**values)


def make_pod(name: str = "web-0", node: str | None = "ip-10-0-1-5.ec2.internal", **overrides: Any) -> ClusterPod:
    values: dict[str, Any] = {"uid": f"uid-{name}", "namespace": "team-a", "name": name, "node_name": node,
                              "owner_kind": "ReplicaSet", "phase": "Running" if node else "Pending",
                              "labels": {"app": name.rsplit("-", 1)[0]}}
    values.update(overrides)
    return ClusterPod(**values)


def make_claim(**overrides: Any) -> NodeClaim:
    values: dict[str, Any] = {"cluster": "ml-prod", "id": "c-1", "pool": "gpu-burst", "capacity_type": "spot",
                              "zones": ("us-east-1a",), "instance_types": ("g6.xlarge",), "price_per_hour": 0.3,
                              "created_at": NOW - timedelta(hours=1), "instance_id": "i-0aaa",
                              "instance_type": "g6.xlarge", "zone": "us-east-1a", "state": ClaimState.REGISTERED,
                              "node_name": "ip-10-0-1-5.ec2.internal"}
    values.update(overrides)
    return NodeClaim(**values)


def make_request(**overrides: Any) -> DrainRequest:
    values: dict[str, Any] = {"cluster": "ml-prod", "node_name": "ip-10-0-1-5.ec2.internal", "instance_id": "i-0aaa",
                              "claim_id": "c-1", "reason": "test", "deadline": NOW + timedelta(minutes=10)}
    values.update(overrides)
    return DrainRequest(**values)

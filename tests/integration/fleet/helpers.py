"""Small builders shared by the fleet integration tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.models.claims import NodeClaim

if TYPE_CHECKING:
    from gpu_autoscaler.ports import StateStore

TTL = timedelta(minutes=30)


def new_claim(store: StateStore, claim_id: str, **changes: Any) -> NodeClaim:
    fields: dict[str, Any] = {
        "cluster": "ml-prod", "id": claim_id, "pool": "gpu-burst", "capacity_type": "spot",
        "zones": ("us-east-1b", "us-east-1a"), "instance_types": ("g6.xlarge", "g5.xlarge"), "price_per_hour": 0.4,
        "pods": (f"{claim_id}-pod",), "created_at": datetime.now(UTC) - timedelta(seconds=5),
    }
    fields.update(changes)
    claim = NodeClaim(**fields)
    store.create_claim(claim)
    store.assign_pods(claim.id, list(claim.pods), TTL)
    return claim

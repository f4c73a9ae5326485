"""A scheduled function's tick lease in the state table: the DynamoDB one on moto and the in-memory one answer alike.

One conditional write takes it (absent, or expired: a crashed holder's frees itself), and a conditional delete
gives it back only while its holder still holds it.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.adapters.aws.tick_leases import DynamoTickLeases
from gpu_autoscaler.adapters.memory.tick_leases import MemoryTickLeases
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.leases import Lease
from tests.integration.state.conftest import START

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.ports import TickLeases

HOLD = timedelta(seconds=120)


@pytest.fixture(params=["memory", "dynamodb"])
def leases(request: pytest.FixtureRequest, aws: EmbeddedAws) -> TickLeases:
    """Each test in a cluster partition of its own."""
    if request.param == "memory":
        return MemoryTickLeases()
    return DynamoTickLeases(aws.clients.client("dynamodb"), aws.table_name, f"c-{uuid.uuid4().hex[:8]}")


def lease(holder: str, at: timedelta = timedelta(0), name: str = "consolidate") -> Lease:
    return Lease(name=name, holder=holder, expires_at=START + at + HOLD)


def test_a_free_lease_is_taken_and_a_held_one_is_refused_naming_its_holder_and_expiry(leases: TickLeases) -> None:
    first = lease("request-1")
    assert leases.take(first, START) is None
    held = leases.take(lease("request-2", timedelta(seconds=30)), START + timedelta(seconds=30))
    assert held == first
    # At its expiry it is still held: only a lease that expired before now is taken over.
    assert leases.take(lease("request-3", HOLD), START + HOLD) == first


def test_each_function_has_its_own_lease(leases: TickLeases) -> None:
    assert leases.take(lease("request-1"), START) is None
    assert leases.take(lease("request-2", name="prewarm"), START) is None


def test_an_expired_lease_of_a_crashed_holder_is_taken_over(leases: TickLeases) -> None:
    crashed = lease("request-1")
    assert leases.take(crashed, START) is None  # and never released: the run timed out
    later = HOLD + timedelta(seconds=1)
    successor = lease("request-2", later)
    assert leases.take(successor, START + later) is None
    assert leases.take(lease("request-3", later), START + later) == successor
    # The crashed run's release (had it come back) no longer removes what is now another's.
    assert leases.release(crashed) is False
    assert leases.take(lease("request-3", later), START + later) == successor


def test_a_release_removes_only_its_own_lease(leases: TickLeases) -> None:
    mine = lease("request-1")
    assert leases.take(mine, START) is None
    assert leases.release(lease("request-2")) is False
    assert leases.take(lease("request-3"), START) == mine
    assert leases.release(mine) is True
    assert leases.release(mine) is False  # gone already
    assert leases.take(lease("request-3"), START) is None


def test_the_lease_is_no_claim_of_the_cluster(aws: EmbeddedAws) -> None:
    """Its key, `LEASE#<function>` under the cluster's partition, is outside the claims' (`CLAIM#`, `ENDED#`)."""
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    store = DynamoStateStore(aws.clients.client("dynamodb"), aws.table_name, cluster)
    leases = DynamoTickLeases(aws.clients.client("dynamodb"), aws.table_name, cluster)
    store.create_claim(NodeClaim(cluster=cluster, id="nc-1", pool="gpu", capacity_type="spot", zones=("us-east-1a",),
                                 instance_types=("g6.xlarge",), price_per_hour=1.0, created_at=START))
    assert leases.take(lease("request-1"), START) is None
    assert [(c.id, c.state) for c in store.list_claims()] == [("nc-1", ClaimState.PENDING)]

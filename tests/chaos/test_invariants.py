"""The checker itself: a planted leak, a planted duplicate launch are reported (else a green suite proves nothing)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER
from tests.chaos.invariants import check_invariants

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig


def test_an_owned_instance_without_a_claim_launched_twice_is_reported(rig: ChaosRig) -> None:
    rig.begin()
    image = rig.aws.config.ami.x86_64
    tags = [{"Key": TAG_CLUSTER, "Value": rig.aws.config.cluster_name}, {"Key": TAG_CLAIM, "Value": "nc-planted"}]
    planted = [i["InstanceId"] for i in rig.ec2.run_instances(
        ImageId=image, InstanceType="g5.xlarge", MinCount=2, MaxCount=2,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])["Instances"]]
    try:
        report = check_invariants(rig)
    finally:
        rig.ec2.terminate_instances(InstanceIds=planted)
        rig.begin()

    assert not report.ok
    text = "\n".join(report.violations)
    assert f"instance {planted[0]}" in text and "has no live claim" in text
    assert "claim nc-planted was launched 2 times" in text


def test_a_pod_on_two_claims_counts_twice_only_where_capacity_stands_for_it(rig: ChaosRig) -> None:
    """Two claims in flight listing one pod: two nodes bought for it, reported. A Registered claim listing a pod
    that no longer runs anywhere (deleted by a drain, its successor has a new uid) stands for nothing more: its
    list is what it was bought for (kube-scheduler put the pods where it liked), so a replacement planned for that
    uid is not a second node for it (the flake of `test_a_crash_at_each_point_...[0]` at load ~6)."""
    rig.begin()
    store = DynamoStateStore(rig.aws.clients.client("dynamodb"), rig.aws.table_name, rig.aws.config.cluster_name)
    now = datetime.now(UTC)

    def claim(name: str, pods: tuple[str, ...]) -> NodeClaim:
        return NodeClaim(cluster=rig.aws.config.cluster_name, id=f"nc-planted-{name}", pool="gpu-burst",
                         capacity_type="spot", zones=("us-east-1a",), instance_types=("g5.xlarge",),
                         price_per_hour=1.0, pods=pods, created_at=now, reason="planted")

    planted = [claim("a", ("uid-twice", "uid-gone")), claim("b", ("uid-twice",)), claim("c", ("uid-gone",))]
    store.create_claims(planted)
    try:
        registered = store.transition(store.get_claim("nc-planted-c") or planted[2], ClaimState.LAUNCHED)
        store.transition(registered, ClaimState.REGISTERED)
        report = check_invariants(rig)
    finally:
        for stored in (store.get_claim(c.id) for c in planted):
            if stored is not None:
                store.transition(stored, ClaimState.TERMINATED, "planted")

    twice = [v for v in report.violations if "provisioned twice" in v]
    assert twice == ["pod uid-twice is provisioned twice: claims nc-planted-a, nc-planted-b"]

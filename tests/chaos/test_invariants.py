"""The checker itself: a planted leak, a planted duplicate launch are reported (else a green suite proves nothing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

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

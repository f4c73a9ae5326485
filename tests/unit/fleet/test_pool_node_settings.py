"""What a pool sets is what its instances get: volumes (ephemeralStorage or blockDeviceMappings), image, template."""

from __future__ import annotations

import pytest

from gpu_autoscaler.adapters.aws.fleet import render_create_fleet
from gpu_autoscaler.config import ConfigError
from gpu_autoscaler.domain.fleet import LaunchContext, build_request, first_attempt
from tests.unit.fleet.builders import TEMPLATE, TYPES, make_claim, make_config, make_context

POOL_AMI = {"family": "AL2023", "version": "v20261120", "x86_64": "ami-0aaaaaaaaaaaaaaa1",
            "arm64": "ami-0aaaaaaaaaaaaaaa2"}
ROOT_ONLY = {"deviceName": "/dev/xvda", "ebs": {"volumeSize": 50}}
DATA_VOLUME = {"deviceName": "/dev/xvdb", "ebs": {"volumeSize": "500Gi", "volumeType": "gp3", "iops": 6000,
                                                   "throughput": 500, "snapshotId": "snap-0123456789abcdef0"}}
ROOT = {"deviceName": "/dev/xvda", "ebs": {"volumeSize": 120}}


def rendered(config, claim=None, context=None) -> dict:
    claim = claim or make_claim()
    pool = config.pool(claim.pool)
    context = context or make_context(config)
    attempt = first_attempt([claim], pool, set(), context)
    assert attempt is not None
    return render_create_fleet(build_request([claim], pool, attempt, context))


def overrides(params: dict) -> list[dict]:
    return [o for c in params["LaunchTemplateConfigs"] for o in c["Overrides"]]


def test_the_pools_ephemeral_storage_sizes_the_root_volume() -> None:
    """Issue 14 defect 11: the root volume was 200 GiB whatever `ephemeralStorage` said."""
    params = rendered(make_config(pool_gpu_burst={"ephemeralStorage": "500Gi"}))
    for override in overrides(params):
        assert override["BlockDeviceMappings"] == [{"DeviceName": "/dev/xvda", "Ebs": {
            "VolumeSize": 500, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}]


def test_bottlerocket_puts_ephemeral_storage_on_its_data_volume() -> None:
    config = make_config(ami={"family": "Bottlerocket", "version": "1.30.0", "x86_64": "ami-0123456789abcdef0"},
                         pool_gpu_burst={"ephemeralStorage": "300Gi"})
    [mapping] = {str(o["BlockDeviceMappings"]) for o in overrides(rendered(config))}
    assert "'/dev/xvda'" in mapping and "'VolumeSize': 4" in mapping and "'/dev/xvdb'" in mapping
    assert "'VolumeSize': 300" in mapping


def test_a_data_volume_snapshot_reaches_every_override() -> None:
    """Issue 17: a pool with a pre-seeded data-volume snapshot launches with exactly that mapping."""
    config = make_config(pool_gpu_burst={"blockDeviceMappings": [ROOT, DATA_VOLUME]})
    for override in overrides(rendered(config)):
        assert override["BlockDeviceMappings"] == [
            {"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 120, "VolumeType": "gp3", "Encrypted": True,
                                                 "DeleteOnTermination": True}},
            {"DeviceName": "/dev/xvdb", "Ebs": {"VolumeSize": 500, "VolumeType": "gp3", "Encrypted": True,
                                                 "DeleteOnTermination": True, "Iops": 6000, "Throughput": 500,
                                                 "SnapshotId": "snap-0123456789abcdef0"}},
        ]


def test_a_pool_image_is_named_on_each_override() -> None:
    config = make_config(pool_gpu_burst={"ami": POOL_AMI})
    claim = make_claim(instance_types=("g6.xlarge", "g5g.xlarge"))
    images = {o["InstanceType"]: o.get("ImageId") for o in overrides(rendered(config, claim))}
    assert images == {"g6.xlarge": "ami-0aaaaaaaaaaaaaaa1", "g5g.xlarge": "ami-0aaaaaaaaaaaaaaa2"}
    # Pools without their own image keep the templates' (x86_64) and name only the arm64 one.
    plain = {o["InstanceType"]: o.get("ImageId") for o in overrides(rendered(make_config(), claim))}
    assert plain == {"g6.xlarge": None, "g5g.xlarge": make_config().ami.arm64}


def test_each_capacity_type_launches_from_its_template() -> None:
    config = make_config()
    templates = {"spot": "lt-spot", "on-demand": "lt-od", "reserved": "lt-res"}
    context = LaunchContext.from_config(config, TEMPLATE, instance_types=TYPES.values(), launch_templates=templates)
    for capacity_type, template in (("spot", "lt-spot"), ("on-demand", "lt-od")):
        params = rendered(config, make_claim(capacity_type=capacity_type), context)
        assert {c["LaunchTemplateSpecification"]["LaunchTemplateId"] for c in params["LaunchTemplateConfigs"]} == {
            template}


@pytest.mark.parametrize(("volume", "field", "words"), [
    ({"deviceName": "/dev/xvdb", "ebs": {"volumeSize": 20000}}, "blockDeviceMappings[0].ebs", "1-16384 GiB"),
    ({"deviceName": "/dev/xvdb", "ebs": {"volumeSize": 100, "volumeType": "gp2", "iops": 3000}},
     "blockDeviceMappings[0].ebs", "iops applies to gp3, io1 and io2"),
    ({"deviceName": "/dev/xvdb", "ebs": {"volumeSize": 100, "volumeType": "io2"}}, "blockDeviceMappings[0].ebs",
     "io2 volumes need iops"),
    ({"deviceName": "/dev/xvdb", "ebs": {"volumeType": "gp3"}}, "blockDeviceMappings[0].ebs", "volumeSize, snapshotId"),
    ({"deviceName": "xvdb", "ebs": {"volumeSize": 10}}, "blockDeviceMappings[0].deviceName", "pattern"),
    ({"deviceName": "/dev/xvdb", "ebs": {"volumeSize": 10, "snapshotId": "vol-1"}},
     "blockDeviceMappings[0].ebs.snapshotId", "pattern"),
])
def test_volumes_are_validated_with_one_line_naming_the_field(volume: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(pool_gpu_burst={"blockDeviceMappings": [volume]})
    message = str(caught.value)
    assert f"nodePools[1].{field}:" in message and words in message and "\n" not in message


def test_a_latest_image_is_an_explicit_choice() -> None:
    parameter = "/aws/service/eks/optimized-ami/1.31/amazon-linux-2023/x86_64/nvidia/recommended/image_id"
    follows = {"family": "AL2023", "version": "v20261120", "x86_64": f"resolve:ssm:{parameter}"}
    with pytest.raises(ConfigError, match="follows the latest AMI"):
        make_config(pool_gpu_burst={"ami": follows})
    config = make_config(pool_gpu_burst={"ami": {**follows, "version": "latest"}})
    assert config.pool("gpu-burst").ami is not None
    with pytest.raises(ConfigError, match="needs resolve:ssm"):
        make_config(pool_gpu_burst={"ami": {**POOL_AMI, "version": "latest"}})


def test_the_ephemeral_volume_must_hold_ephemeral_storage() -> None:
    with pytest.raises(ConfigError, match=r"nodePools\[1\]\.ephemeralStorage: 100Gi exceeds the 50 GiB"):
        make_config(pool_gpu_burst={"blockDeviceMappings": [ROOT_ONLY]})
    with pytest.raises(ConfigError, match=r"nodePools\[1\]\.blockDeviceMappings: no /dev/xvda"):
        make_config(pool_gpu_burst={"blockDeviceMappings": [DATA_VOLUME]})
    assert make_config(pool_gpu_burst={"blockDeviceMappings": [ROOT_ONLY], "ephemeralStorage": "50Gi"})

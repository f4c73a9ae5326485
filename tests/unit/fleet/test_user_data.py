"""Node bootstrap user data: AL2023 nodeadm NodeConfig and Bottlerocket TOML, with labels and taints."""

from __future__ import annotations

import email
import tomllib
from email.message import Message

import pytest
import yaml
from pydantic import ValidationError

from gpu_autoscaler.config import ConfigError, GpuSharing
from gpu_autoscaler.domain.user_data import (
    GPU_SHARING_LABEL,
    MIG_CONFIG_LABEL,
    ClusterBootstrap,
    cluster_dns_ip,
    device_plugin_config,
    kubelet_may_set,
    node_setup,
    render_user_data,
)
from gpu_autoscaler.emulator.device_plugin import shipped_config_map
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.labels import GANG_LABEL, label_value
from gpu_autoscaler.models.taints import gang_taint
from tests.unit.fleet.builders import CA, TYPES, make_config

CONFIG = make_config()
AL2023 = ClusterBootstrap.from_config(CONFIG)
BOTTLEROCKET = ClusterBootstrap(cluster_name="ml-prod", endpoint="https://EXAMPLE.gr7.us-east-1.eks.amazonaws.com",
                                family="Bottlerocket", certificate_authority=CA, service_cidr="172.20.0.0/16")


def node_config(user_data: str) -> dict:
    """The NodeConfig inside the MIME document, as nodeadm reads it."""
    message = email.message_from_string(user_data)
    assert message.is_multipart()
    parts = message.get_payload()
    assert isinstance(parts, list)
    [part] = parts
    assert isinstance(part, Message)
    assert part.get_content_type() == "application/node.eks.aws"
    return yaml.safe_load(part.get_payload())


def kubelet_flags(config: dict) -> dict[str, str]:
    return dict(flag.removeprefix("--").split("=", 1) for flag in config["spec"]["kubelet"]["flags"])


def test_al2023_node_config_joins_the_cluster_with_labels_and_taints() -> None:
    setup = node_setup(CONFIG.pool("gpu-reserved"), "reserved", instance_type=TYPES["p5.48xlarge"],
                       claim_id="gpu-reserved-7k2qx")
    document = node_config(render_user_data(AL2023, setup))
    assert document["apiVersion"] == "node.eks.aws/v1alpha1" and document["kind"] == "NodeConfig"
    assert document["spec"]["cluster"] == {
        "name": "ml-prod", "apiServerEndpoint": "https://EXAMPLE.gr7.us-east-1.eks.amazonaws.com",
        "certificateAuthority": CA, "cidr": "10.100.0.0/16"}
    assert document["spec"]["kubelet"]["config"] == {
        "maxPods": 100,
        "kubeReserved": {"cpu": "550m", "ephemeral-storage": "1Gi", "memory": "1355Mi"},  # 11Mi × 100 + 255Mi
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%", "nodefs.inodesFree": "5%"}}
    flags = kubelet_flags(document)
    labels = dict(pair.split("=", 1) for pair in flags["node-labels"].split(","))
    assert labels == {
        "workload": "training",
        L.NODE_POOL: "gpu-reserved", L.NODE_POOL_LABEL: "gpu-reserved",
        L.CAPACITY_TYPE: "reserved",
        L.CLAIM_LABEL: "gpu-reserved-7k2qx",
        L.INSTANCE_CATEGORY: "p", L.INSTANCE_FAMILY: "p5", L.INSTANCE_GENERATION: "5", L.INSTANCE_SIZE: "48xlarge",
        L.INSTANCE_CPU: "192", L.INSTANCE_MEMORY: "2097152",
        L.INSTANCE_GPU_NAME: "h100", L.INSTANCE_GPU_COUNT: "8", L.INSTANCE_GPU_MEMORY: "81920",
        L.INSTANCE_GPU_MANUFACTURER: "nvidia",
    }
    assert flags["register-with-taints"] == "nvidia.com/gpu=true:NoSchedule"


def test_names_alone_still_give_the_family_labels() -> None:
    setup = node_setup(CONFIG.pool("gpu-burst"), "spot", instance_type="g6e.2xlarge", gang="training/train-42")
    assert setup.labels[L.INSTANCE_FAMILY] == "g6e" and setup.labels[L.INSTANCE_SIZE] == "2xlarge"
    assert setup.labels[GANG_LABEL] == "training.train-42"
    assert L.INSTANCE_CPU not in setup.labels and L.INSTANCE_MEMORY not in setup.labels  # not known from a name
    assert L.CLAIM_LABEL not in setup.labels and setup.max_pods is None
    assert "maxPods" not in render_user_data(AL2023, setup)


def test_a_gang_node_is_born_tainted_for_its_gang_alone() -> None:
    setup = node_setup(CONFIG.pool("gpu-burst"), "spot", instance_type=TYPES["p5.48xlarge"], gang="training/train-42")
    flags = kubelet_flags(node_config(render_user_data(AL2023, setup)))
    assert flags["register-with-taints"].split(",") == [
        "nvidia.com/gpu=true:NoSchedule", "gpu-autoscaler/gang=training.train-42:NoSchedule"]
    assert gang_taint("training/train-42") == setup.taints[-1]
    toml = tomllib.loads(render_user_data(BOTTLEROCKET, setup))
    assert toml["settings"]["kubernetes"]["node-taints"]["gpu-autoscaler/gang"] == ["training.train-42:NoSchedule"]
    plain = node_setup(CONFIG.pool("gpu-burst"), "spot", instance_type=TYPES["p5.48xlarge"])
    assert all(t.key != GANG_LABEL for t in plain.taints)


def test_labels_the_kubelet_may_not_set_are_refused_by_the_configuration() -> None:
    with pytest.raises(ConfigError, match="node-role.kubernetes.io/gpu"):
        make_config(pool_gpu_burst={"labels": {"node-role.kubernetes.io/gpu": "", "team": "ml"}})
    config = make_config(pool_gpu_burst={"labels": {"team": "ml", "node.kubernetes.io/lifecycle": "spot"}})
    setup = node_setup(config.pool("gpu-burst"), "spot", instance_type="g6.xlarge")
    assert setup.skipped_labels == ()
    assert setup.labels["team"] == "ml" and setup.labels["node.kubernetes.io/lifecycle"] == "spot"
    assert L.INSTANCE_TYPE not in setup.labels and L.ARCH not in setup.labels  # the kubelet sets those itself
    assert kubelet_may_set("topology.kubernetes.io/zone") and not kubelet_may_set("kubernetes.io/role")
    assert kubelet_may_set("karpenter.k8s.aws/instance-family") and not kubelet_may_set("foo.k8s.io/x")


def test_time_slicing_and_mig_pools() -> None:
    shared = node_setup(CONFIG.pool("gpu-shared"), "spot", instance_type=TYPES["g6.xlarge"])
    assert shared.labels[GPU_SHARING_LABEL] == "time-slicing" and shared.time_slicing_replicas == 4
    assert kubelet_flags(node_config(render_user_data(AL2023, shared)))["register-with-taints"] == (
        "gpu-autoscaler/shared=true:NoSchedule")
    config = make_config(pool_gpu_burst={"gpuSharing": {"mode": "mig", "migProfile": "1g.10gb"}})
    mig = node_setup(config.pool("gpu-burst"), "on-demand", instance_type=TYPES["p5.48xlarge"])
    assert mig.labels[MIG_CONFIG_LABEL] == "all-1g.10gb"
    assert mig.labels["nvidia.com/device-plugin.config"] == "mig-mixed"
    assert shared.labels["nvidia.com/device-plugin.config"] == "time-slicing-4"
    media = make_config(pool_gpu_burst={"gpuSharing": {"mode": "mig", "migProfile": "1g.10gb+me",
                                                       "migStrategy": "single"}})
    labels = node_setup(media.pool("gpu-burst"), "on-demand", instance_type=TYPES["p5.48xlarge"]).labels
    assert labels[MIG_CONFIG_LABEL] == "all-1g.10gb.me" and labels["nvidia.com/device-plugin.config"] == "mig-single"
    assert mig.mig_profiles == {"h100.80gb": "1g.10gb"}


def test_every_replicas_count_the_configuration_accepts_has_its_entry_in_the_shipped_plugin_configmap() -> None:
    """An AL2023 node selects `time-slicing-<replicas>` by its label, and the device plugin's config-manager fails
    when the ConfigMap has no such entry (k8s-device-plugin cmd/config-manager, updateConfigName): the node would
    advertise no GPUs. So the configuration's range of replicas and the shipped entries are the same."""
    def accepted(replicas: int) -> bool:
        try:
            GpuSharing(mode="time-slicing", replicas=replicas)
        except ValidationError:
            return False
        return True

    shipped = shipped_config_map()
    entries = {key: yaml.safe_load(text) for key, text in shipped["data"].items() if key.startswith("time-slicing-")}
    wanted = {device_plugin_config(GpuSharing(mode="time-slicing", replicas=n)): n for n in range(1, 257)
              if accepted(n)}
    assert set(entries) == set(wanted)
    for key, replicas in wanted.items():
        [resource] = entries[key]["sharing"]["timeSlicing"]["resources"]
        assert (resource["name"], resource["replicas"]) == ("nvidia.com/gpu", replicas)
        assert entries[key]["flags"] == {"migStrategy": "none"}


def test_bottlerocket_settings() -> None:
    setup = node_setup(CONFIG.pool("gpu-shared"), "spot", instance_type=TYPES["g6.xlarge"], claim_id="c-1")
    settings = tomllib.loads(render_user_data(BOTTLEROCKET, setup))["settings"]
    kubernetes = settings["kubernetes"]
    assert kubernetes["cluster-name"] == "ml-prod"
    assert kubernetes["api-server"] == "https://EXAMPLE.gr7.us-east-1.eks.amazonaws.com"
    assert kubernetes["cluster-certificate"] == CA
    assert kubernetes["cluster-dns-ip"] == "172.20.0.10"
    assert kubernetes["max-pods"] == 58
    assert kubernetes["node-labels"][L.CLAIM_LABEL] == "c-1"
    assert kubernetes["node-labels"][L.NODE_POOL] == "gpu-shared"
    assert kubernetes["node-taints"] == {"gpu-autoscaler/shared": ["true:NoSchedule"]}
    assert kubernetes["kube-reserved"] == {"cpu": "80m", "ephemeral-storage": "1Gi", "memory": "893Mi"}
    assert kubernetes["eviction-hard"]["memory.available"] == "100Mi" and "system-reserved" not in kubernetes
    nvidia = settings["kubelet-device-plugins"]["nvidia"]
    assert nvidia["device-sharing-strategy"] == "time-slicing" and nvidia["time-slicing"]["replicas"] == 4


def test_bottlerocket_mig() -> None:
    config = make_config(pool_gpu_burst={"gpuSharing": {"mode": "mig", "migProfile": "1g.10gb"}})
    setup = node_setup(config.pool("gpu-burst"), "on-demand", instance_type=TYPES["p5.48xlarge"])
    nvidia = tomllib.loads(render_user_data(BOTTLEROCKET, setup))["settings"]["kubelet-device-plugins"]["nvidia"]
    assert nvidia["device-partitioning-strategy"] == "mig"
    assert nvidia["mig"]["profile"] == {"h100.80gb": "1g.10gb"}


def test_what_a_node_cannot_join_without_is_named() -> None:
    bare = ClusterBootstrap.from_config(make_config(kubernetes={"endpoint": "https://k.example"}))
    assert bare.missing() == ["kubernetes.certificateAuthority", "kubernetes.serviceCidr"]
    document = node_config(render_user_data(bare, node_setup(CONFIG.pool("gpu-burst"), "spot",
                                                             instance_type="g6.xlarge")))
    assert document["spec"]["cluster"] == {"name": "ml-prod", "apiServerEndpoint": "https://k.example"}
    assert AL2023.missing() == []
    assert BOTTLEROCKET.missing() == []


def test_label_values_and_dns() -> None:
    assert label_value("training/train-42") == "training.train-42"
    edgy = label_value("-x" * 40)
    assert len(edgy) <= 63 and edgy[0] == "x" and edgy[-1] == "x"
    assert len(label_value("a" * 100)) == 63
    assert cluster_dns_ip("10.100.0.0/16") == "10.100.0.10"
    assert cluster_dns_ip("fd00:10:96::/112") == "fd00:10:96::a"


def test_the_service_cidr_is_validated() -> None:
    with pytest.raises(ConfigError, match="kubernetes.serviceCidr"):
        make_config(kubernetes={"endpoint": "https://k.example", "serviceCidr": "10.100.0.0/33"})

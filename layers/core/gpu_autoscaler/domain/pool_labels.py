"""The labels every node of a pool registers with, whatever its instance type and capacity type.

`user_data.node_labels` gives them to the kubelet, and the packer matches pods' node selectors against them
(`packing.index.requirement_labels`, the solver's fixed labels): one function, so a pod selecting any label our
nodes carry (our pool label, the sharing mode, the device plugin's configuration) is planned, and none that they
do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.models import labels as L

if TYPE_CHECKING:
    from gpu_autoscaler.config import GpuSharing, NodePool

__all__ = ["DEVICE_PLUGIN_CONFIG_LABEL", "GPU_SHARING_LABEL", "MIG_CONFIG_LABEL", "device_plugin_config",
           "pool_labels"]

GPU_SHARING_LABEL = "gpu-autoscaler/gpu-sharing"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
"""The NVIDIA GPU Operator's MIG manager partitions a node's GPUs as the entry of mig-parted's config named here
(`all-1g.10gb`; a media-engine profile `1g.10gb+me` is `all-1g.10gb.me`)."""
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
"""The NVIDIA device plugin reads its config from the entry of its ConfigMap named here (k8s-device-plugin README,
per-node configuration); the entries are shipped in `agent/deploy/gpu-operator/nvidia-device-plugin-config.yaml`."""


def pool_labels(pool: NodePool) -> dict[str, str]:
    """The pool's own labels, its name (Karpenter's key and ours) and what its GPU sharing mode tells the device
    plugin and the MIG manager."""
    labels = dict(pool.labels)
    labels[L.NODE_POOL] = pool.name
    labels[L.NODE_POOL_LABEL] = pool.name
    sharing = pool.gpu_sharing
    if sharing.mode != "none":
        labels[GPU_SHARING_LABEL] = sharing.mode
    plugin_config = device_plugin_config(sharing)
    if plugin_config:
        labels[DEVICE_PLUGIN_CONFIG_LABEL] = plugin_config
    if sharing.mode == "mig" and sharing.mig_profile:
        labels[MIG_CONFIG_LABEL] = "all-" + sharing.mig_profile.replace("+", ".")
    return labels


def device_plugin_config(sharing: GpuSharing) -> str | None:
    """The device plugin config entry a node of this sharing mode needs; None: the plugin's default. A time-slicing
    pool has at least two replicas (the configuration says so), as Bottlerocket's settings state them too."""
    if sharing.mode == "time-slicing":
        return f"time-slicing-{sharing.replicas}"
    if sharing.mode == "mig":
        return f"mig-{sharing.mig_strategy}"
    return None

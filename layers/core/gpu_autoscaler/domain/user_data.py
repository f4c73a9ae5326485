"""Node bootstrap: the user data that joins a launched instance to the cluster, labelled and tainted.

Two AMI families, as the configuration's `ami.family` says:

- AL2023: a nodeadm `NodeConfig` (`node.eks.aws/v1alpha1`) in a MIME multipart document, the shape EKS
  managed node groups and Karpenter use. Labels and taints go to the kubelet as `--node-labels` and
  `--register-with-taints`, so the Node is born with them: no pod lands before the taints exist.
- Bottlerocket: TOML settings (`settings.kubernetes.*`, and the NVIDIA device plugin's sharing settings).

Image pulls, per pool (see `image_pull` below for the sources): `soci` turns on the SOCI snapshotter's parallel
pull/unpack on both families; `prePullImages` (AL2023 only; the configuration refuses it on Bottlerocket) adds a
shell-script part to the MIME document that pulls the images before the kubelet starts, so the node registers
with them on disk.

Both state the kubelet's reservations (kube-reserved, system-reserved, hard eviction thresholds) the packer
planned with (`domain/packing/reserved.py`), so the node's allocatable is what was planned, not what the
AMI would pick by itself.

The node carries the pool's labels, Karpenter's well-known labels of its instance type (so pod selectors on
`karpenter.k8s.aws/instance-gpu-name` and the like match it), its pool and capacity type, and the identity
of the claim it was launched for. The kubelet refuses to start with labels in the `kubernetes.io` and
`k8s.io` namespaces other than the few it allows, so those are left out (and reported) rather than
passed on.

Pure functions of plain inputs: the fleet service, the emulator and tests call them alike.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from gpu_autoscaler.config import Overhead
from gpu_autoscaler.domain.packing.mig import mig_gpu
from gpu_autoscaler.domain.packing.reserved import KubeletReservations, kubelet_reservations
from gpu_autoscaler.domain.pool_labels import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_SHARING_LABEL,
    MIG_CONFIG_LABEL,
    device_plugin_config,
    pool_labels,
)
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.catalog import InstanceType, name_labels
from gpu_autoscaler.models.images import ecr_region, parse_image_reference
from gpu_autoscaler.models.labels import GANG_LABEL, kubelet_may_set, label_value
from gpu_autoscaler.models.taints import Taint, gang_taint

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpu_autoscaler.config import CapacityType, Config, GpuSharing, NodePool

__all__ = [
    "DEVICE_PLUGIN_CONFIG_LABEL",
    "GPU_SHARING_LABEL",
    "MIG_CONFIG_LABEL",
    "MIME_BOUNDARY",
    "ClusterBootstrap",
    "NodeSetup",
    "al2023_user_data",
    "bottlerocket_user_data",
    "cluster_dns_ip",
    "device_plugin_config",
    "kubelet_may_set",
    "node_labels",
    "node_setup",
    "pre_pull_script",
    "render_user_data",
    "reservation_settings",
]

MIME_BOUNDARY = "==GPUAUTOSCALER=="

_SET_BY_KUBELET = frozenset({L.INSTANCE_TYPE, L.ARCH, L.ZONE})
"""The kubelet and the cloud provider set these themselves, from the instance."""


@dataclass(frozen=True)
class ClusterBootstrap:
    """What every node needs to find and trust the API server."""

    cluster_name: str
    endpoint: str
    family: Literal["AL2023", "Bottlerocket"]
    certificate_authority: str | None = None
    """Base64 CA bundle."""
    service_cidr: str | None = None

    @classmethod
    def from_config(cls, config: Config, certificate_authority: str | None = None,
                    service_cidr: str | None = None) -> ClusterBootstrap:
        return cls(
            cluster_name=config.cluster_name,
            endpoint=config.kubernetes.endpoint,
            family=config.ami.family,
            certificate_authority=certificate_authority or config.kubernetes.certificate_authority,
            service_cidr=service_cidr or config.kubernetes.service_cidr,
        )

    def missing(self) -> list[str]:
        """Configuration fields a node of this family cannot join without."""
        out = []
        if not self.certificate_authority:
            out.append("kubernetes.certificateAuthority")
        if self.family == "AL2023" and not self.service_cidr:
            out.append("kubernetes.serviceCidr")
        return out


@dataclass(frozen=True)
class NodeSetup:
    """One node's identity and shape: everything in its user data but the cluster coordinates."""

    labels: dict[str, str]
    taints: tuple[Taint, ...] = ()
    max_pods: int | None = None
    time_slicing_replicas: int | None = None
    mig_profiles: dict[str, str] = field(default_factory=dict)
    """Bottlerocket's `mig.profile`: GPU (`a100.40gb`) → partition profile (`1g.5gb`)."""
    skipped_labels: tuple[str, ...] = ()
    """Label keys left out because the kubelet may not set them."""
    pre_pull_images: tuple[str, ...] = ()
    """Pulled before the kubelet starts (AL2023)."""
    soci: bool = False
    """The SOCI snapshotter, parallel pull/unpack mode."""
    reservations: KubeletReservations | None = None
    """What the kubelet holds back (None for a type known by name only: the AMI's defaults apply)."""


def node_labels(
    pool: NodePool,
    capacity_type: CapacityType,
    *,
    instance_type: InstanceType | str,
    claim_id: str | None = None,
    gang: str | None = None,
) -> tuple[dict[str, str], tuple[str, ...]]:
    """(labels the kubelet registers the node with, keys dropped as not settable by the kubelet). A type known by
    name alone gives the labels its name says (family, size…), not its vCPUs and memory."""
    type_labels = instance_type.labels if isinstance(instance_type, InstanceType) else name_labels(instance_type)
    wanted: dict[str, str] = {k: v for k, v in type_labels.items() if k not in _SET_BY_KUBELET}
    wanted.update(pool_labels(pool))
    wanted[L.CAPACITY_TYPE] = capacity_type
    if claim_id:
        wanted[L.CLAIM_LABEL] = label_value(claim_id)
    if gang:
        wanted[GANG_LABEL] = label_value(gang)
    kept = {k: v for k, v in sorted(wanted.items()) if kubelet_may_set(k)}
    return kept, tuple(sorted(set(wanted) - set(kept)))


def node_setup(
    pool: NodePool,
    capacity_type: CapacityType,
    *,
    instance_type: InstanceType | str,
    claim_id: str | None = None,
    gang: str | None = None,
    overhead: Overhead | None = None,
) -> NodeSetup:
    """`overhead`: the configuration's, which the packer planned with (its default when not given)."""
    labels, skipped = node_labels(pool, capacity_type, instance_type=instance_type, claim_id=claim_id, gang=gang)
    known = instance_type if isinstance(instance_type, InstanceType) else None
    return NodeSetup(
        labels=labels,
        taints=(*pool.taints, gang_taint(gang)) if gang else tuple(pool.taints),
        max_pods=known.max_pods if known else None,
        time_slicing_replicas=pool.gpu_sharing.replicas if pool.gpu_sharing.mode == "time-slicing" else None,
        mig_profiles=_mig_profiles(pool.gpu_sharing, known),
        skipped_labels=skipped,
        pre_pull_images=tuple(pool.pre_pull_images),
        soci=pool.soci,
        reservations=kubelet_reservations(known, overhead or Overhead()) if known else None,
    )


def _mig_profiles(sharing: GpuSharing, instance_type: InstanceType | None) -> dict[str, str]:
    """Bottlerocket's MIG manager names a GPU by model and nominal memory (`a100.40gb`, `b200.180gb` — not the
    183,359 MiB EC2 reports); known only when the type's GPUs support MIG."""
    if sharing.mode != "mig" or not sharing.mig_profile or instance_type is None:
        return {}
    if not instance_type.gpu_model or instance_type.gpus < 1:
        return {}
    gpu = mig_gpu(instance_type.gpu_model, instance_type.gpu_memory_mib / instance_type.gpus)
    if gpu is None:
        return {}
    return {f"{gpu.model.lower()}.{gpu.memory_gib}gb": sharing.mig_profile}


def cluster_dns_ip(service_cidr: str) -> str:
    """The cluster DNS service address EKS assigns: the tenth address of the service CIDR."""
    return str(ipaddress.ip_network(service_cidr, strict=False)[10])


def render_user_data(bootstrap: ClusterBootstrap, setup: NodeSetup) -> str:
    if bootstrap.family == "Bottlerocket":
        return bottlerocket_user_data(bootstrap, setup)
    return al2023_user_data(bootstrap, setup)


def _taint_flag(taints: Iterable[Taint]) -> str:
    return ",".join(f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in taints)


def al2023_user_data(bootstrap: ClusterBootstrap, setup: NodeSetup) -> str:
    """A MIME multipart document holding one nodeadm NodeConfig (JSON-quoted scalars are valid YAML)."""
    q = json.dumps
    cluster = [f"    name: {q(bootstrap.cluster_name)}", f"    apiServerEndpoint: {q(bootstrap.endpoint)}"]
    if bootstrap.certificate_authority:
        cluster.append(f"    certificateAuthority: {q(bootstrap.certificate_authority)}")
    if bootstrap.service_cidr:
        cluster.append(f"    cidr: {q(bootstrap.service_cidr)}")
    kubelet = ["  kubelet:"]
    config = [f"maxPods: {int(setup.max_pods)}"] if setup.max_pods else []
    if setup.reservations:
        for key, values in reservation_settings(setup.reservations, "AL2023").items():
            config += [f"{key}:", *(f"  {q(name)}: {q(value)}" for name, value in values.items())]
    if config:
        kubelet += ["    config:", *(f"      {line}" for line in config)]
    flags = []
    if setup.labels:
        flags.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in setup.labels.items()))
    if setup.taints:
        flags.append("--register-with-taints=" + _taint_flag(setup.taints))
    if flags:
        kubelet += ["    flags:", *(f"      - {q(flag)}" for flag in flags)]
    node_config = "\n".join([
        "---",
        "apiVersion: node.eks.aws/v1alpha1",
        "kind: NodeConfig",
        "spec:",
        "  cluster:",
        *cluster,
        *(kubelet if len(kubelet) > 1 else []),
        *(["  featureGates:", "    FastImagePull: true"] if setup.soci else []),
    ])
    parts = [("application/node.eks.aws", node_config)]
    if setup.pre_pull_images:
        parts.append(('text/x-shellscript; charset="us-ascii"', pre_pull_script(setup.pre_pull_images)))
    lines = ["MIME-Version: 1.0", f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"', ""]
    for content_type, body in parts:
        lines += [f"--{MIME_BOUNDARY}", f"Content-Type: {content_type}", "", body, ""]
    return "\n".join([*lines, f"--{MIME_BOUNDARY}--", ""])


def pre_pull_script(images: Iterable[str]) -> str:
    """The user-data shell script that pulls `images` into containerd before the kubelet starts.

    Why this is safe on the EKS AL2023 AMI (awslabs/amazon-eks-ami, templates/al2023/runtime/rootfs/etc/
    systemd/system/): `nodeadm-config.service` runs `Before=cloud-init.service` and writes containerd's
    configuration (the SOCI snapshotter included, when `FastImagePull` is on); cloud-init runs this part
    in `cloud-final.service`; `nodeadm-run.service`, which starts the kubelet, runs
    `After=nodeadm-config.service cloud-final.service`. So the pulls finish before the Node registers and no
    pod can land first. The script starts containerd itself (nodeadm-run would, later), pulls into the
    `k8s.io` namespace the kubelet's CRI reads, with the snapshotter containerd is configured with (an
    image unpacked by another snapshotter would be pulled again), labelled as CRI-managed. ECR registries
    get a token from the node role (`aws ecr get-login-password`; the AMI ships the AWS CLI). A pull that
    fails three times is logged and skipped: the kubelet pulls it when a pod needs it, and boot goes on.
    Pull time adds to registration time: `timeouts.registrationTtl` must cover it.
    """
    lines = [
        "#!/bin/bash",
        "# gpu-autoscaler: pre-pull the node pool's images before nodeadm-run.service starts the kubelet.",
        "set -u",
        "systemctl start containerd",
        'CONTAINERD_CONFIG="${CONTAINERD_CONFIG:-/etc/containerd/config.toml}"',
        "SNAPSHOTTER=$(sed -n 's/^[[:space:]]*snapshotter[[:space:]]*=[[:space:]]*\"\\([^\"]*\\)\".*/\\1/p' "
        '"$CONTAINERD_CONFIG" | head -n 1)',
        'SNAPSHOTTER="${SNAPSHOTTER:-overlayfs}"',
        "pull() {",
        '  local image="$1" region="$2" attempt',
        "  for attempt in 1 2 3; do",
        '    if [ -n "$region" ]; then',
        '      ctr --namespace k8s.io images pull --snapshotter "$SNAPSHOTTER" '
        '--label io.cri-containerd.image=managed --user "AWS:$(aws ecr get-login-password --region "$region")" '
        '"$image" && return 0',
        "    else",
        '      ctr --namespace k8s.io images pull --snapshotter "$SNAPSHOTTER" '
        '--label io.cri-containerd.image=managed "$image" && return 0',
        "    fi",
        '    sleep "$((attempt * 10))"',
        "  done",
        '  echo "gpu-autoscaler: could not pre-pull $image; the kubelet will pull it when a pod needs it" >&2',
        "}",
    ]
    for image in images:
        region = ecr_region(parse_image_reference(image)) or ""
        lines.append(f"pull {shlex.quote(image)} {shlex.quote(region)}")
    return "\n".join([*lines, "exit 0"])


def reservation_settings(reservations: KubeletReservations,
                         family: Literal["AL2023", "Bottlerocket"]) -> dict[str, dict[str, str]]:
    """The kubelet's reservations as the family's settings name them (nodeadm's `spec.kubelet.config` is
    a KubeletConfiguration; Bottlerocket's `settings.kubernetes` keys), empty ones left out."""
    names = (("kubeReserved", "systemReserved", "evictionHard") if family == "AL2023"
             else ("kube-reserved", "system-reserved", "eviction-hard"))
    values = (reservations.kube_reserved, reservations.system_reserved, reservations.eviction_hard)
    return {name: dict(sorted(v.items())) for name, v in zip(names, values, strict=True) if v}


def _toml_table(name: str, values: Mapping[str, object]) -> list[str]:
    lines = [f"[{name}]"]
    for key, value in values.items():
        bare = re.fullmatch(r"[A-Za-z0-9_-]+", key) is not None
        lines.append(f"{key if bare else json.dumps(key)} = {json.dumps(value)}")
    return [*lines, ""]


def bottlerocket_user_data(bootstrap: ClusterBootstrap, setup: NodeSetup) -> str:
    """Bottlerocket settings as TOML (JSON strings, integers and arrays are valid TOML values)."""
    kubernetes: dict[str, object] = {"cluster-name": bootstrap.cluster_name, "api-server": bootstrap.endpoint}
    if bootstrap.certificate_authority:
        kubernetes["cluster-certificate"] = bootstrap.certificate_authority
    if bootstrap.service_cidr:
        kubernetes["cluster-dns-ip"] = cluster_dns_ip(bootstrap.service_cidr)
    if setup.max_pods:
        kubernetes["max-pods"] = int(setup.max_pods)
    lines = _toml_table("settings.kubernetes", kubernetes)
    if setup.soci:
        # The snapshotter setting alone: its pull mode defaults to parallel-pull-unpack, the only mode
        # Bottlerocket models (settings.container-runtime-plugins.soci-snapshotter.pull-mode).
        lines += _toml_table("settings.container-runtime", {"snapshotter": "soci"})
    if setup.reservations:
        for key, values in reservation_settings(setup.reservations, "Bottlerocket").items():
            lines += _toml_table(f"settings.kubernetes.{key}", values)
    if setup.labels:
        lines += _toml_table("settings.kubernetes.node-labels", setup.labels)
    if setup.taints:
        taints: dict[str, list[str]] = {}
        for t in setup.taints:
            taints.setdefault(t.key, []).append(f"{t.value}:{t.effect}")
        lines += _toml_table("settings.kubernetes.node-taints", taints)
    nvidia = "settings.kubelet-device-plugins.nvidia"
    if setup.time_slicing_replicas:
        # Bottlerocket renames shared GPUs `nvidia.com/gpu.shared` and refuses requests for more than one unless
        # told otherwise; the packer plans `nvidia.com/gpu` replicas, as on AL2023.
        lines += _toml_table(nvidia, {"device-sharing-strategy": "time-slicing"})
        lines += _toml_table(f"{nvidia}.time-slicing", {"replicas": int(setup.time_slicing_replicas),
                                                         "rename-by-default": False,
                                                         "fail-requests-greater-than-one": False})
    elif setup.mig_profiles:
        lines += _toml_table(nvidia, {"device-partitioning-strategy": "mig"})
        lines += _toml_table(f"{nvidia}.mig.profile", setup.mig_profiles)
    return "\n".join(lines)

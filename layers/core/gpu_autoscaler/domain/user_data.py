"""Node bootstrap: the user data that joins a launched instance to the cluster, labelled and tainted.

Two AMI families, as the configuration's `ami.family` says:

- AL2023: a nodeadm `NodeConfig` (`node.eks.aws/v1alpha1`) in a MIME multipart document, the shape EKS
  managed node groups and Karpenter use. Labels and taints go to the kubelet as `--node-labels` and
  `--register-with-taints`, so the Node is born with them: no pod lands before the taints exist.
- Bottlerocket: TOML settings (`settings.kubernetes.*`, and the NVIDIA device plugin's sharing settings).

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.catalog import InstanceType
from gpu_autoscaler.models.taints import Taint

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpu_autoscaler.config import CapacityType, Config, GpuSharing, NodePool

__all__ = [
    "GANG_LABEL",
    "GPU_SHARING_LABEL",
    "MIG_CONFIG_LABEL",
    "MIME_BOUNDARY",
    "ClusterBootstrap",
    "NodeSetup",
    "al2023_user_data",
    "bottlerocket_user_data",
    "cluster_dns_ip",
    "gang_taint",
    "kubelet_may_set",
    "label_value",
    "node_labels",
    "node_setup",
    "render_user_data",
]

GANG_LABEL = "gpu-autoscaler/gang"
GPU_SHARING_LABEL = "gpu-autoscaler/gpu-sharing"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
"""The NVIDIA GPU Operator's MIG manager partitions a node's GPUs by the profile named here (`all-1g.10gb`)."""
MIME_BOUNDARY = "==GPUAUTOSCALER=="

_KUBELET_ALLOWED = frozenset({
    "kubernetes.io/hostname", "kubernetes.io/arch", "kubernetes.io/os",
    "beta.kubernetes.io/instance-type", "beta.kubernetes.io/arch", "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region", "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region", "topology.kubernetes.io/zone", "node.kubernetes.io/instance-type",
})
_KUBELET_ALLOWED_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
_SET_BY_KUBELET = frozenset({L.INSTANCE_TYPE, L.ARCH, L.ZONE})
"""The kubelet and the cloud provider set these themselves, from the instance."""
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


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


def label_value(text: str) -> str:
    """A valid label value (≤ 63 characters of `[A-Za-z0-9_.-]`, alphanumeric at both ends) for any id."""
    value = _LABEL_VALUE.sub(".", text)[:63]
    return value.strip("_.-")


def kubelet_may_set(key: str) -> bool:
    """The NodeRestriction rule: no `kubernetes.io` / `k8s.io` labels but the allowed ones."""
    prefix, _, _ = key.rpartition("/")
    restricted = any(prefix == ns or prefix.endswith("." + ns) for ns in ("kubernetes.io", "k8s.io"))
    if not restricted:
        return True
    return key in _KUBELET_ALLOWED or any(
        prefix == ns or prefix.endswith("." + ns) for ns in _KUBELET_ALLOWED_NAMESPACES
    )


def node_labels(
    pool: NodePool,
    capacity_type: CapacityType,
    *,
    instance_type: InstanceType | str,
    claim_id: str | None = None,
    gang: str | None = None,
) -> tuple[dict[str, str], tuple[str, ...]]:
    """(labels the kubelet registers the node with, keys dropped as not settable by the kubelet)."""
    known = instance_type if isinstance(instance_type, InstanceType) else InstanceType(
        name=instance_type, vcpu=1, memory_mib=1
    )
    wanted: dict[str, str] = {k: v for k, v in known.labels.items() if k not in _SET_BY_KUBELET}
    wanted.update(pool.labels)
    wanted[L.NODE_POOL] = pool.name
    wanted[L.CAPACITY_TYPE] = capacity_type
    sharing = pool.gpu_sharing
    if sharing.mode != "none":
        wanted[GPU_SHARING_LABEL] = sharing.mode
    if sharing.mode == "mig" and sharing.mig_profile:
        wanted[MIG_CONFIG_LABEL] = f"all-{sharing.mig_profile}"
    if claim_id:
        wanted[L.CLAIM_LABEL] = label_value(claim_id)
    if gang:
        wanted[GANG_LABEL] = label_value(gang)
    kept = {k: v for k, v in sorted(wanted.items()) if kubelet_may_set(k)}
    return kept, tuple(sorted(set(wanted) - set(kept)))


def gang_taint(gang: str) -> Taint:
    """Keeps a gang's nodes for the gang until it is bound: registered by the kubelet with the node, tolerated
    by the gang's pods (the agent adds the toleration to them), removed by the agent once no member is pending,
    so no other pod takes the room first and leaves the gang waiting for another node."""
    return Taint(key=GANG_LABEL, value=label_value(gang), effect="NoSchedule")


def node_setup(
    pool: NodePool,
    capacity_type: CapacityType,
    *,
    instance_type: InstanceType | str,
    claim_id: str | None = None,
    gang: str | None = None,
) -> NodeSetup:
    labels, skipped = node_labels(pool, capacity_type, instance_type=instance_type, claim_id=claim_id, gang=gang)
    known = instance_type if isinstance(instance_type, InstanceType) else None
    return NodeSetup(
        labels=labels,
        taints=(*pool.taints, gang_taint(gang)) if gang else tuple(pool.taints),
        max_pods=known.max_pods if known else None,
        time_slicing_replicas=pool.gpu_sharing.replicas if pool.gpu_sharing.mode == "time-slicing" else None,
        mig_profiles=_mig_profiles(pool.gpu_sharing, known),
        skipped_labels=skipped,
    )


def _mig_profiles(sharing: GpuSharing, instance_type: InstanceType | None) -> dict[str, str]:
    """Bottlerocket names a GPU by model and memory (`a100.40gb`); known only when the type's GPUs are."""
    if sharing.mode != "mig" or not sharing.mig_profile or instance_type is None:
        return {}
    if not instance_type.gpu_model or instance_type.gpus < 1:
        return {}
    per_gpu_gb = round(instance_type.gpu_memory_mib / instance_type.gpus / 1024)
    return {f"{instance_type.gpu_model.lower()}.{per_gpu_gb}gb": sharing.mig_profile}


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
    if setup.max_pods:
        kubelet += ["    config:", f"      maxPods: {int(setup.max_pods)}"]
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
    ])
    return "\n".join([
        "MIME-Version: 1.0",
        f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"',
        "",
        f"--{MIME_BOUNDARY}",
        "Content-Type: application/node.eks.aws",
        "",
        node_config,
        "",
        f"--{MIME_BOUNDARY}--",
        "",
    ])


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
    if setup.labels:
        lines += _toml_table("settings.kubernetes.node-labels", setup.labels)
    if setup.taints:
        taints: dict[str, list[str]] = {}
        for t in setup.taints:
            taints.setdefault(t.key, []).append(f"{t.value}:{t.effect}")
        lines += _toml_table("settings.kubernetes.node-taints", taints)
    nvidia = "settings.kubelet-device-plugins.nvidia"
    if setup.time_slicing_replicas:
        lines += _toml_table(nvidia, {"device-sharing-strategy": "time-slicing"})
        lines += _toml_table(f"{nvidia}.time-slicing", {"replicas": int(setup.time_slicing_replicas)})
    elif setup.mig_profiles:
        lines += _toml_table(nvidia, {"device-partitioning-strategy": "mig"})
        lines += _toml_table(f"{nvidia}.mig.profile", setup.mig_profiles)
    return "\n".join(lines)

"""Label keys shared with Karpenter, so NodePools and pod selectors port over unchanged."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "ARCH",
    "CAPACITY_TYPE",
    "HOSTNAME",
    "INSTANCE_CATEGORY",
    "INSTANCE_CPU",
    "INSTANCE_FAMILY",
    "INSTANCE_GENERATION",
    "INSTANCE_GPU_COUNT",
    "INSTANCE_GPU_FRACTION",
    "INSTANCE_GPU_MANUFACTURER",
    "INSTANCE_GPU_MEMORY",
    "INSTANCE_GPU_NAME",
    "INSTANCE_MEMORY",
    "INSTANCE_SIZE",
    "INSTANCE_TYPE",
    "NODE_LABEL_KEYS",
    "NODE_POOL",
    "NORMALIZED",
    "OS",
    "REGION",
    "TYPE_LABEL_KEYS",
    "WELL_KNOWN",
    "ZONE",
    "kubelet_may_set",
    "label_key_problem",
    "label_value",
    "label_value_problem",
    "normalized_selector",
    "CLAIM_LABEL",
    "NODE_POOL_LABEL",
    "GANG_LABEL",
    "DO_NOT_DISRUPT",
    "TAG_CLAIM",
    "TAG_CLUSTER",
    "TAG_EKS_CLUSTER_NAME",
    "POST_LAUNCH_TAG_KEYS",
    "claim_tags",
    "cluster_tags",
    "TAG_NODE_POOL",
]

INSTANCE_CATEGORY = "karpenter.k8s.aws/instance-category"
INSTANCE_FAMILY = "karpenter.k8s.aws/instance-family"
INSTANCE_GENERATION = "karpenter.k8s.aws/instance-generation"
INSTANCE_SIZE = "karpenter.k8s.aws/instance-size"
INSTANCE_CPU = "karpenter.k8s.aws/instance-cpu"
"""The type's vCPUs (EC2's `VCpuInfo.DefaultVCpus`), as Karpenter labels every node."""
INSTANCE_MEMORY = "karpenter.k8s.aws/instance-memory"
"""The type's memory in MiB (EC2's `MemoryInfo.SizeInMiB`), as Karpenter labels every node."""
INSTANCE_GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
INSTANCE_GPU_COUNT = "karpenter.k8s.aws/instance-gpu-count"
INSTANCE_GPU_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"
INSTANCE_GPU_MANUFACTURER = "karpenter.k8s.aws/instance-gpu-manufacturer"
INSTANCE_GPU_FRACTION = "gpu-autoscaler/gpu-fraction"
"""On partitioned types only (g6f, gr6f): the share of one GPU the instance has (`0.125`), EC2's
`GpuPartitionSize`. Selecting on it (or on GPU memory) is how a pod says a fraction of a GPU will do."""
CAPACITY_TYPE = "karpenter.sh/capacity-type"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
REGION = "topology.kubernetes.io/region"
"""Every node carries its region (the cloud node controller sets it; k8s.io/cloud-provider controllers/node)."""
ARCH = "kubernetes.io/arch"
OS = "kubernetes.io/os"
NODE_POOL = "karpenter.sh/nodepool"
NORMALIZED = {
    "failure-domain.beta.kubernetes.io/zone": ZONE,
    "beta.kubernetes.io/arch": ARCH,
    "beta.kubernetes.io/os": OS,
    "beta.kubernetes.io/instance-type": INSTANCE_TYPE,
    "failure-domain.beta.kubernetes.io/region": REGION,
}
"""Deprecated keys every node still carries beside the stable ones, with the same value: the kubelet registers
`beta.kubernetes.io/arch|os` (kubernetes pkg/kubelet/kubelet_node_status.go), the cloud node controller the beta
zone, region and instance type. A pod's selector on them is read as on the stable key, as Karpenter reads it
(`NormalizedLabels`, kubernetes-sigs/karpenter pkg/apis/v1/labels.go: "Pod requirements are translated for
compatibility")."""

WELL_KNOWN = frozenset({
    INSTANCE_CATEGORY, INSTANCE_FAMILY, INSTANCE_GENERATION, INSTANCE_SIZE, INSTANCE_CPU, INSTANCE_MEMORY,
    INSTANCE_GPU_NAME,
    INSTANCE_GPU_COUNT, INSTANCE_GPU_MEMORY, INSTANCE_GPU_MANUFACTURER, CAPACITY_TYPE,
    INSTANCE_TYPE, ZONE, ARCH, NODE_POOL,
})

TYPE_LABEL_KEYS = frozenset({
    INSTANCE_TYPE, ARCH, INSTANCE_CATEGORY, INSTANCE_FAMILY, INSTANCE_GENERATION, INSTANCE_SIZE, INSTANCE_CPU,
    INSTANCE_MEMORY, INSTANCE_GPU_NAME, INSTANCE_GPU_COUNT, INSTANCE_GPU_MEMORY, INSTANCE_GPU_MANUFACTURER,
    INSTANCE_GPU_FRACTION,
})
"""The labels a node has from its instance type (`InstanceType.labels`)."""
NODE_LABEL_KEYS = TYPE_LABEL_KEYS | {ZONE, CAPACITY_TYPE, OS, NODE_POOL}
"""The labels every node of a pool may carry besides the pool's own: what its requirements can select on. Karpenter
sets more of its own (`instance-hypervisor`, `instance-local-nvme`…); this project does not."""

CLAIM_LABEL = "gpu-autoscaler/claim"
NODE_POOL_LABEL = "gpu-autoscaler/node-pool"
"""On every node gpu-autoscaler launches: its pool. `karpenter.sh/nodepool` (`NODE_POOL`) says the same, for pods
that select on it as on Karpenter's nodes, but Karpenter's own nodes carry that one too; this one is ours alone (the
agent's pod stays off the nodes that carry it)."""
GANG_LABEL = "gpu-autoscaler/gang"
"""On the nodes launched for a gang (and the key of their taint, `taints.gang_taint`): the gang, as `label_value`."""
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"

TAG_CLUSTER = "gpu-autoscaler/cluster"
TAG_EKS_CLUSTER_NAME = "eks:eks-cluster-name"
TAG_NODE_POOL = "gpu-autoscaler/node-pool"
TAG_CLAIM = "gpu-autoscaler/claim"
TAG_SNAPSHOT_BUILDER = "gpu-autoscaler/snapshot-builder"
"""On the instance `gpu-autoscaler snapshot` builds a data volume on: ours, but no node (the collector skips it)."""



def cluster_tags(cluster: str) -> dict[str, str]:
    """The tags of every instance we launch, and of its volumes and network interfaces: `gpu-autoscaler/cluster`,
    the ownership tag IAM and the code act on, and the two by which the rest of AWS tells a cluster's instances
    apart. EKS User Guide, "Self-managed nodes" (nodes/worker.adoc): nodes launched by hand carry
    `kubernetes.io/cluster/<cluster>` = `owned`; cloud-provider-aws keeps only instances carrying it when it looks
    for the backends of a `type: LoadBalancer` Service (pkg/providers/v1/aws.go `describeInstances`,
    `hasClusterTag`). Karpenter puts both on everything it launches (karpenter-provider-aws pkg/utils/utils.go
    `GetTags`), and never acts on an instance without its own `karpenter.sh/nodepool` too."""
    return {TAG_CLUSTER: cluster, f"kubernetes.io/cluster/{cluster}": "owned", TAG_EKS_CLUSTER_NAME: cluster}


POST_LAUNCH_TAG_KEYS = (TAG_CLAIM, "Name")
"""The only keys put on an instance after its launch (`claim_tags`), and the only ones IAM lets the fleet write then
(`aws:TagKeys`, infra/permissions.py `tag_claims`)."""


def claim_tags(cluster: str, claim_id: str) -> dict[str, str]:
    """What names an instance's claim: at launch for a single claim, after it for a request for several."""
    return {TAG_CLAIM: claim_id, "Name": f"{cluster}/{claim_id}"}


_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")

_KUBELET_ALLOWED = frozenset({
    "kubernetes.io/hostname", "kubernetes.io/arch", "kubernetes.io/os",
    "beta.kubernetes.io/instance-type", "beta.kubernetes.io/arch", "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region", "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region", "topology.kubernetes.io/zone", "node.kubernetes.io/instance-type",
})
_KUBELET_ALLOWED_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def kubelet_may_set(key: str) -> bool:
    """The NodeRestriction rule: a kubelet may set no `kubernetes.io` / `k8s.io` label but the allowed ones
    (and refuses to start when `--node-labels` holds one)."""
    prefix, _, _ = key.rpartition("/")
    restricted = any(prefix == ns or prefix.endswith("." + ns) for ns in ("kubernetes.io", "k8s.io"))
    if not restricted:
        return True
    return key in _KUBELET_ALLOWED or any(
        prefix == ns or prefix.endswith("." + ns) for ns in _KUBELET_ALLOWED_NAMESPACES
    )


_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def label_key_problem(key: str) -> str | None:
    """What makes `key` no label or taint key (apimachinery `validation.IsQualifiedName`, which the kubelet applies
    to `--node-labels` and `--register-with-taints` before it starts), or None."""
    parts = key.split("/")
    if len(parts) > 2 or not all(parts):
        return "the key must be a name with an optional DNS subdomain prefix and '/' (e.g. 'example.com/team')"
    if len(parts) == 2 and (len(parts[0]) > 253 or not _DNS_SUBDOMAIN.fullmatch(parts[0])):
        return "the key's prefix must be a lowercase DNS subdomain of at most 253 characters (e.g. 'example.com')"
    if len(parts[-1]) > 63 or not _NAME.fullmatch(parts[-1]):
        return "the key's name must be at most 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends"
    return None


def label_value_problem(value: str) -> str | None:
    """What makes `value` no label or taint value (apimachinery `validation.IsValidLabelValue`), or None."""
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        return "the value must be empty or at most 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends"
    return None


def normalized_selector(selector: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A node selector's pairs, sorted, with deprecated keys read as their stable ones (`NORMALIZED`). A deprecated
    key whose stable key the selector also names with another value is kept as written: no node carries both
    values, and no offering has the deprecated key, so the pod is refused as kube-scheduler would leave it."""
    out = dict(selector)
    for old, new in NORMALIZED.items():
        if old in out and out.get(new, out[old]) == out[old]:
            out[new] = out.pop(old)
    return tuple(sorted(out.items()))


def label_value(text: str) -> str:
    """A valid label value (≤ 63 characters of `[A-Za-z0-9_.-]`, alphanumeric at both ends) for any id."""
    value = _LABEL_VALUE.sub(".", text)[:63]
    return value.strip("_.-")

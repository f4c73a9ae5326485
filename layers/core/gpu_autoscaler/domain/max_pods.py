"""How many pods a node can hold, from its network limits, as the Amazon VPC CNI allots addresses.

Without prefix delegation every pod takes one secondary IPv4 address of an ENI:

    max_pods = ENIs × (IPv4 addresses per ENI − 1) + 2

(the first address of each ENI is the ENI's own, and 2 pods — aws-node and kube-proxy — use the host
network). This is the formula behind EKS's `eni-max-pods.txt`. Only the default network card's ENIs
count: the CNI uses one network card, so a p5.48xlarge (32 cards, 2 ENIs on card 0) holds 100 pods.

With prefix delegation each ENI slot holds a /28 prefix, i.e. 16 addresses, and EKS's
max-pods calculator caps the result at what kubelet handles well:

    max_pods = min(ENIs × (IPv4 addresses per ENI − 1) × 16 + 2, 110 if vCPUs < 30 else 250)
"""

from __future__ import annotations

__all__ = [
    "ADDRESSES_PER_PREFIX",
    "HOST_NETWORK_PODS",
    "LARGE_NODE_CAP",
    "LARGE_NODE_VCPUS",
    "SMALL_NODE_CAP",
    "max_pods",
]

HOST_NETWORK_PODS = 2
ADDRESSES_PER_PREFIX = 16
"""A /28 IPv4 prefix."""
SMALL_NODE_CAP = 110
LARGE_NODE_CAP = 250
LARGE_NODE_VCPUS = 30


def max_pods(enis: int, ipv4_per_eni: int, vcpus: int, prefix_delegation: bool = False) -> int:
    """The pod capacity of a node; see the module docstring for both formulas."""
    if enis < 1 or ipv4_per_eni < 1:
        raise ValueError(f"an instance needs at least one ENI with one address (got {enis} × {ipv4_per_eni})")
    slots = enis * (ipv4_per_eni - 1)
    if not prefix_delegation:
        return slots + HOST_NETWORK_PODS
    cap = SMALL_NODE_CAP if vcpus < LARGE_NODE_VCPUS else LARGE_NODE_CAP
    return min(slots * ADDRESSES_PER_PREFIX + HOST_NETWORK_PODS, cap)

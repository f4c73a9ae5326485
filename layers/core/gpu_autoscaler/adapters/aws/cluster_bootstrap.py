"""The coordinates a launched node joins the cluster with: the configuration's, completed by EKS DescribeCluster.

A node's user data must carry the cluster's certificate authority (to trust the API server) and, on AL2023,
its service CIDR (nodeadm derives the cluster DNS address from it). Users of EKS rarely know them by heart, so
the configuration may leave them out and the fleet function reads them from `DescribeCluster` once per
execution environment. A self-managed cluster has no EKS record: its configuration must set them.

When they stay missing, a launch must fail rather than start instances that boot, cost money and never
register: `ClusterBootstrapUnavailable` says what is missing and why, the launch message is retried and, if
it keeps failing, kept in the dead-letter queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.domain.user_data import ClusterBootstrap
from gpu_autoscaler.errors import ClusterBootstrapUnavailable

if TYPE_CHECKING:
    from mypy_boto3_eks import EKSClient

    from gpu_autoscaler.config import Config

__all__ = ["ClusterBootstrapUnavailable", "cluster_bootstrap", "is_local_endpoint"]


def is_local_endpoint(endpoint: str) -> bool:
    """A plain-HTTP API server is a local one (the emulator, tests): no EKS cluster stands behind it, and its
    simulated kubelets never read user data."""
    return endpoint.startswith("http://")


def cluster_bootstrap(config: Config, eks: EKSClient) -> ClusterBootstrap:
    """The configured coordinates, with what the configuration leaves out filled in from DescribeCluster.

    Called only when the configuration lacks something; raises `ClusterBootstrapUnavailable` if EKS cannot
    say (no such cluster, access denied, throttled, unreachable) or does not say all that is missing.
    """
    configured = ClusterBootstrap.from_config(config)
    missing = configured.missing()
    if not missing or is_local_endpoint(config.kubernetes.endpoint):
        return configured
    try:
        cluster = eks.describe_cluster(name=config.cluster_name)["cluster"]
    except (ClientError, BotoCoreError) as error:
        raise ClusterBootstrapUnavailable(
            f"launched nodes could not join cluster '{config.cluster_name}': the configuration lacks "
            f"{' and '.join(missing)}, and EKS DescribeCluster failed ({error}). Set them in the configuration "
            "(a self-managed cluster has no EKS record), or let the fleet function's role call "
            "eks:DescribeCluster on this cluster."
        ) from error
    network = cluster.get("kubernetesNetworkConfig") or {}
    authority = cluster.get("certificateAuthority") or {}
    filled = ClusterBootstrap.from_config(  # what the configuration sets wins
        config,
        certificate_authority=configured.certificate_authority or authority.get("data"),
        service_cidr=configured.service_cidr or network.get("serviceIpv4Cidr") or network.get("serviceIpv6Cidr"),
    )
    still = filled.missing()
    if still:
        raise ClusterBootstrapUnavailable(
            f"launched nodes could not join cluster '{config.cluster_name}': EKS DescribeCluster does not give "
            f"{' and '.join(still)} (is the cluster still being created?); set them in the configuration."
        )
    return filled

"""Typed domain errors: they drive control flow, and adapters raise them `from` the cloud's own errors."""

from __future__ import annotations

__all__ = [
    "ClaimExists",
    "ClusterBootstrapUnavailable",
    "GpuAutoscalerError",
    "InsufficientCapacity",
    "KubernetesApiError",
    "NodeNotFound",
    "NotOwned",
    "QuotaExceeded",
    "RequestThrottled",
    "StaleClaim",
    "StateStoreError",
]


class GpuAutoscalerError(Exception):
    """Base of every error this project raises on purpose."""


class ClaimExists(GpuAutoscalerError):
    """A NodeClaim with this id is already stored (a retried or duplicated message)."""


class ClusterBootstrapUnavailable(GpuAutoscalerError):
    """The cluster's certificate authority or service CIDR is neither configured nor readable from EKS: a node
    launched now could never join, so the launch fails instead."""


class StaleClaim(GpuAutoscalerError):
    """A conditional lifecycle write lost: the claim moved on since it was read."""


class StateStoreError(GpuAutoscalerError):
    """The state table refused a write for a reason no retry here can fix (the message is retried by SQS)."""


class InsufficientCapacity(GpuAutoscalerError):
    """EC2 has no capacity for these offerings now; they are marked unavailable for a while."""

    def __init__(self, message: str, offerings: list[tuple[str, str, str]] | None = None) -> None:
        super().__init__(message)
        self.offerings = offerings or []


class QuotaExceeded(GpuAutoscalerError):
    """A vCPU service quota would be exceeded."""


class RequestThrottled(GpuAutoscalerError):
    """The EC2 API asked us to slow down (RequestLimitExceeded); retry with backoff and jitter."""


class NotOwned(GpuAutoscalerError):
    """The instance does not carry this cluster's ownership tag; we never act on it."""


class NodeNotFound(GpuAutoscalerError):
    """The Kubernetes Node is gone (HTTP 404): a drain has nothing left to cordon or evict."""


class KubernetesApiError(GpuAutoscalerError):
    """The Kubernetes API refused or failed a call in a way the caller cannot act on (not a 404, 409 or 429):
    the message is retried as a whole. `status` is the HTTP status, None when the server was unreachable."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

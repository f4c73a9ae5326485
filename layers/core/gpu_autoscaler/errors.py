"""Typed domain errors: they drive control flow, and adapters raise them `from` the cloud's own errors."""

from __future__ import annotations

__all__ = [
    "ClaimExists",
    "ClusterBootstrapUnavailable",
    "GpuAutoscalerError",
    "InsufficientCapacity",
    "KubernetesAccessRefused",
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
    """The EC2 API asked us to slow down (RequestLimitExceeded) or failed on its side (a 5xx: InternalError,
    Unavailable); retry with backoff and jitter, then the message goes back to its queue (same ClientToken)."""


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

    @property
    def is_access_refused(self) -> bool:
        """The API server refused this identity (401: the token was not authenticated, e.g. its role has no EKS
        access entry) or this request (403: RBAC grants its groups nothing for it). Unlike a timeout, a 429 or a
        5xx this does not pass with time: every request is refused alike until someone grants the access
        (https://kubernetes.io/docs/reference/access-authn-authz/authentication/: "rejected with HTTP status code
        401"; .../authorization/: a denied request "returns an HTTP status code 403")."""
        return self.status in _ACCESS_REFUSED


_ACCESS_REFUSED = (401, 403)


class KubernetesAccessRefused(KubernetesApiError):
    """A `KubernetesApiError` that `is_access_refused`, its message saying what grants the access: the functions'
    Kubernetes permissions are the ClusterRole of agent/deploy/functions-rbac.yaml, bound to the group
    gpu-autoscaler-functions that each function's role is mapped to (README, "The functions that talk to
    Kubernetes")."""

    def __init__(self, error: KubernetesApiError) -> None:
        super().__init__(
            f"{error}: the Kubernetes API refuses this function's access: map its role (the stack's output "
            f"<Function>RoleArn) to the Kubernetes group gpu-autoscaler-functions (an EKS access entry; 401: it has "
            f"none, or its token is not for this cluster) and apply agent/deploy/functions-rbac.yaml, which binds "
            f"that group to what the functions do (403: the group is not bound, or lacks this request)",
            error.status)

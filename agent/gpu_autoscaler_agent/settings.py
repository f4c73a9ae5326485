"""The agent's configuration: environment variables (as a Deployment sets them), overridable by flags.

Validated once at start; the rest of the agent takes this object and never reads the environment.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["DEFAULT_GPU_TAINT_KEYS", "SQS_MAX_MESSAGE_BYTES", "AgentSettings", "load_settings", "queue_region"]

SQS_MAX_MESSAGE_BYTES = 256 * 1024
"""SQS's classic message size limit. The queue takes up to its own MaximumMessageSize (SQS's default has been
1 MiB since 2025, and the stack sets none), but ten documents of 256 KiB already make a 2.5 MiB batch for the
packer's invocation, whose payload Lambda caps at 6 MB."""

DEFAULT_GPU_TAINT_KEYS = ("nvidia.com/gpu",)

_QUEUE_HOST = re.compile(
    r"(?:sqs(?:-fips)?\.(?P<region>[a-z0-9-]+)\.(?:amazonaws\.com(?:\.cn)?|api\.aws)"
    r"|(?P<legacy>[a-z0-9-]+)\.queue\.amazonaws\.com(?:\.cn)?)"
)
_LEGACY_US_EAST_1 = "queue.amazonaws.com"


def queue_region(queue_url: str) -> str | None:
    """The region an SQS queue URL's host names; None for a host that names none (an endpoint of one's own).

    SQS's endpoints (AWS General Reference, "Amazon Simple Queue Service endpoints and quotas"):
    `sqs.<region>.amazonaws.com` (what CreateQueue and GetQueueUrl answer; `.amazonaws.com.cn` in China),
    `sqs-fips.<region>.amazonaws.com`, and the dual-stack `sqs[-fips].<region>.api.aws`; the legacy
    `<region>.queue.amazonaws.com`, and `queue.amazonaws.com` for US East (N. Virginia) (SQS Developer Guide,
    2009-02-01, "Endpoints")."""
    host = (urlsplit(queue_url).hostname or "").lower()
    if host == _LEGACY_US_EAST_1:
        return "us-east-1"
    match = _QUEUE_HOST.fullmatch(host)
    if match is None:
        return None
    return match.group("region") or match.group("legacy")


# Settings field -> environment variable; flags of __main__ use the same names in kebab case.
ENVIRONMENT = {
    "cluster": "CLUSTER_NAME",
    "queue_url": "QUEUE_URL",
    "region": "AWS_REGION",
    "endpoint_url": "AWS_ENDPOINT_URL",
    "resync_seconds": "RESYNC_SECONDS",
    "gpu_taint_keys": "GPU_TAINT_KEYS",
    "max_message_bytes": "MAX_MESSAGE_BYTES",
    "max_delay_seconds": "MAX_DELAY_SECONDS",
    "watch_timeout_seconds": "WATCH_TIMEOUT_SECONDS",
    "field_selector": "FIELD_SELECTOR",
    "health_port": "HEALTH_PORT",
    "kube_url": "KUBE_URL",
    "log_level": "LOG_LEVEL",
}


class AgentSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    cluster: str = Field(min_length=1)
    """The cluster name: the document's `cluster` and the FIFO MessageGroupId."""
    queue_url: str = Field(min_length=1)
    region: str = Field(min_length=1)
    """The queue's region, read from `queue_url` (`queue_region`). botocore sends SendMessage to its client's
    region whatever the QueueUrl, and SQS answers a queue of another region AWS.SimpleQueueService.NonExistentQueue,
    which the sender would retry for ever; so a region given (AWS_REGION, which EKS's pod identity webhook sets to
    the cluster's under Pod Identity and IRSA) must agree with the URL's, and is needed only for a URL that names
    none (an endpoint of one's own)."""
    endpoint_url: str | None = None
    """An SQS endpoint other than AWS's (moto in tests and in the emulator)."""
    resync_seconds: float = Field(default=60.0, gt=0)
    """Every pod still pending is reported again this often."""
    gpu_taint_keys: tuple[str, ...] = DEFAULT_GPU_TAINT_KEYS
    """Taint keys of the GPU node pools: a pod tolerating one is reported even without a GPU request."""
    max_message_bytes: int = Field(default=SQS_MAX_MESSAGE_BYTES, ge=1024, le=SQS_MAX_MESSAGE_BYTES)
    max_delay_seconds: float = Field(default=1.0, ge=0, le=10)
    """Longest a pod waits in a batch before its message is sent."""
    watch_timeout_seconds: int = Field(default=300, ge=1)
    """Server-side watch timeout: the watch is re-opened from the last resourceVersion after it."""
    field_selector: str = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
    """Narrows list and watch to unbound, non-terminal pods on the API server; the agent filters again itself."""
    health_port: int | None = Field(default=8080, ge=0, le=65535)
    """Port of /healthz, /readyz and /metrics; 0 picks a free port; None serves none (in-process use)."""
    kube_url: str | None = None
    """An API server URL without credentials (the local Kubernetes API); otherwise in-cluster, then kubeconfig."""
    log_level: str = "INFO"

    @model_validator(mode="before")
    @classmethod
    def _queue_region(cls, values: Any) -> Any:
        if not isinstance(values, dict) or not isinstance(values.get("queue_url"), str):
            return values
        named = queue_region(values["queue_url"])
        given = values.get("region")
        if named is None:
            if not given:
                raise ValueError(f"the queue URL {values['queue_url']} (QUEUE_URL) names no region: set AWS_REGION "
                                 f"to the queue's")
            return values
        if given and given != named:
            raise ValueError(f"the region {given} (AWS_REGION) contradicts the queue URL's, {named} (QUEUE_URL): "
                             f"SQS would answer that the queue does not exist; leave AWS_REGION unset (or set it to "
                             f"{named}), or give the URL of the queue in {given}")
        return {**values, "region": named}

    @field_validator("gpu_taint_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(k.strip() for k in value.split(",") if k.strip())
        return value


def load_settings(environ: Mapping[str, str] | None = None, **overrides: object) -> AgentSettings:
    """Environment first, then explicit overrides (flags) that are not None."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {field: env[var] for field, var in ENVIRONMENT.items() if env.get(var)}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return AgentSettings.model_validate(values)

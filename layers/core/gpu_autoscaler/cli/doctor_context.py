"""What every check of `gpu-autoscaler doctor` shares: the line it returns and what it reads the account with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.domain.packing.index import type_allowed

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.config import Config, NodePool
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.models.catalog import InstanceType

__all__ = ["Check", "DoctorContext", "Status", "error_code", "optional_client"]

Status = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def as_json(self) -> dict[str, str]:
        return {"check": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class DoctorContext:
    """What the checks read: the configuration, clients at the account, and how its ids map there."""

    config: Config
    clients: AwsClients
    catalog: Catalog | None
    subnet_ids: dict[str, str] = field(default_factory=dict)
    """Configuration subnet id → the account's (identity on AWS; the emulator's stand-ins otherwise)."""
    security_group_ids: dict[str, str] = field(default_factory=dict)
    instance_profile: str | None = None
    """The stack's instance profile name, when the stack is deployed (checked if present)."""

    def subnet(self, configured: str) -> str:
        return self.subnet_ids.get(configured, configured)

    def security_group(self, configured: str) -> str:
        return self.security_group_ids.get(configured, configured)

    def candidates(self, pool: NodePool) -> list[InstanceType]:
        """GPU instance types the pool's requirements allow, read as the packer reads them: on a node's labels (its
        type's, its OS, the pool's own labels and name), with requirements on the zone and the capacity type left to
        the offerings (`offering_allowed`)."""
        if self.catalog is None:
            return []
        return [t for t in self.catalog.instance_types() if t.gpus > 0 and type_allowed(pool, t)]


def error_code(error: Exception) -> str:
    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code", "ClientError"))
    return type(error).__name__


def optional_client(ctx: DoctorContext, service: str) -> Any:
    try:
        return ctx.clients.client(service)
    except (BotoCoreError, ClientError):
        return None

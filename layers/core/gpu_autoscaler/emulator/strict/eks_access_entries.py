"""The emulated account's EKS access entries, which moto's EKS does not have.

On EKS, an IAM principal reaches the cluster's Kubernetes API only through an access entry (or the `aws-auth`
ConfigMap, which the emulator does not model): the entry names the principal and gives it a Kubernetes username
and groups, which RBAC then authorizes (EKS User Guide, "Grant IAM users access to Kubernetes with EKS access
entries"; EKS API Reference, CreateAccessEntry). The emulator creates the entries the stack would
(`emulator.aws`), and the local Kubernetes API server's authenticator (`emulator.kube_authn`) maps a caller
through them, as EKS's does.

Only what authentication reads is kept: the principal, type, username and groups. Access policies
(AssociateAccessPolicy) are not modelled: an entry here is authorized by RBAC alone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from gpu_autoscaler.emulator.strict.core import on_reset

__all__ = ["AccessEntry", "access_entry", "create_access_entry"]

_RESERVED_PREFIXES = ("system:", "eks:", "aws:", "amazon:", "iam:")
"""A username given to an entry may not start with these (EKS User Guide, access entries, "username")."""
_TYPES = ("STANDARD", "EC2_LINUX", "EC2_WINDOWS", "FARGATE_LINUX", "HYBRID_LINUX")


@dataclass(frozen=True)
class AccessEntry:
    cluster: str
    principal_arn: str
    kubernetes_groups: tuple[str, ...]
    username: str
    """May hold `{{SessionName}}` (or `{{EC2PrivateDNSName}}`), filled from the caller's session when it signs in."""
    type: str = "STANDARD"


_lock = threading.Lock()
_entries: dict[tuple[str, str], AccessEntry] = {}


@on_reset
def _forget() -> None:
    with _lock:
        _entries.clear()


def create_access_entry(cluster: str, principal_arn: str, *, kubernetes_groups: tuple[str, ...] = (),
                        username: str | None = None, type: str = "STANDARD") -> AccessEntry:  # noqa: A002 - the API's name
    """CreateAccessEntry: one entry per principal (ResourceInUseException otherwise, here ValueError). The default
    username is EKS's (User Guide table "Username value that Amazon EKS automatically sets"): a user's ARN; for a
    role, the STS ARN of the assumed role with `{{SessionName}}`, its path removed; for a node role,
    `system:node:{{EC2PrivateDNSName}}`."""
    if type not in _TYPES:
        raise ValueError(f"access entry type must be one of {', '.join(_TYPES)}, not {type!r}")
    if username is not None and (type != "STANDARD" or username.startswith(_RESERVED_PREFIXES)):
        raise ValueError(f"an access entry's username may be set on a STANDARD entry only and may not start with "
                         f"{', '.join(_RESERVED_PREFIXES)}: {username!r}")
    if type != "STANDARD" and kubernetes_groups:
        raise ValueError("only a STANDARD access entry takes Kubernetes groups")
    entry = AccessEntry(cluster, principal_arn, tuple(kubernetes_groups),
                        username if username is not None else _default_username(principal_arn, type), type)
    with _lock:
        if (cluster, principal_arn) in _entries:
            raise ValueError(f"the access entry for {principal_arn} already exists in cluster {cluster}")
        _entries[cluster, principal_arn] = entry
    return entry


def access_entry(cluster: str, principal_arn: str) -> AccessEntry | None:
    """The entry of an IAM principal's ARN (a role's IAM ARN, path included, as the entry was created with)."""
    with _lock:
        return _entries.get((cluster, principal_arn))


def _default_username(principal_arn: str, type: str) -> str:  # noqa: A002 - the API's name
    partition, account, resource = principal_arn.split(":")[1], principal_arn.split(":")[4], \
        principal_arn.split(":", 5)[5]
    if not resource.startswith("role/"):
        return principal_arn
    if type in ("EC2_LINUX", "EC2_WINDOWS"):
        return "system:node:{{EC2PrivateDNSName}}"
    if type != "STANDARD":
        return "system:node:{{SessionName}}"
    role = resource.rsplit("/", 1)[1]
    return f"arn:{partition}:sts::{account}:assumed-role/{role}/{{{{SessionName}}}}"

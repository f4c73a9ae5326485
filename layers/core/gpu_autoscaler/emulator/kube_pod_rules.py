"""What the API server defaults in a Pod, and what it refuses in one, beyond its shape.

- Defaults: a container's limit with no request is its request too. "If you specify a limit for a resource, but
  do not specify any request, and no admission-time mechanism has applied a default request for that resource,
  then Kubernetes copies the limit you specified and uses it as the requested value for the resource."
  (kubernetes.io, Resource Management for Pods and Containers; `SetDefaults_Pod`.)
- Resources: an extended resource (a name with a domain other than `kubernetes.io`, such as `nvidia.com/gpu`) and
  hugepages cannot be overcommitted. "You can specify GPU limits without specifying requests ... You can specify
  GPU in both limits and requests but these two values must be equal. You cannot specify GPU requests without
  specifying limits." (kubernetes.io, Schedule GPUs.) An extended resource is a whole number. The messages are the
  API server's (`ValidateResourceRequirements` in pkg/apis/core/validation/validation.go).
- Updates: "pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`,
  `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations),
  `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"; scheduling gates
  may only be removed, and while a pod is gated its node selector may gain labels (`ValidatePodUpdate`; kubernetes.io,
  Pod Scheduling Readiness › Mutable Pod scheduling directives). A gated pod's node affinity is taken as changed
  within those rules (not checked further here).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.kube_objects import PODS, ApiError
from gpu_autoscaler.models.resources import parse_quantity

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["check_pod", "check_pod_update", "default_pod"]

UPDATABLE_FIELDS = (
    "`spec.containers[*].image`",
    "`spec.initContainers[*].image`",
    "`spec.activeDeadlineSeconds`",
    "`spec.tolerations` (only additions to existing tolerations)",
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
)
_CONTAINER_LISTS = ("containers", "initContainers")


def default_pod(pod: dict[str, Any]) -> None:
    """Requests defaulted from limits, in every container and init container."""
    spec = pod.get("spec") or {}
    for kind in _CONTAINER_LISTS:
        for container in spec.get(kind) or ():
            resources = container.get("resources") or {}
            limits = resources.get("limits") or {}
            if limits:
                container["resources"] = {**resources, "requests": {**limits, **(resources.get("requests") or {})}}


def check_pod(pod: Mapping[str, Any]) -> None:
    """Raises ApiError (422 Invalid) with every rule the pod's resources break."""
    errors: list[str] = []
    spec = pod.get("spec") or {}
    for kind in _CONTAINER_LISTS:
        for i, container in enumerate(spec.get(kind) or ()):
            errors += _resource_errors(container.get("resources") or {}, f"spec.{kind}[{i}].resources")
    _raise(pod, errors)


def check_pod_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Raises ApiError (422 Invalid) when the update changes what a pod's update may not."""
    check_pod(new)
    before, after = old.get("spec") or {}, new.get("spec") or {}
    for kind in _CONTAINER_LISTS:
        if len(before.get(kind) or ()) != len(after.get(kind) or ()):
            _raise(new, [f"spec.{kind}: Forbidden: pod updates may not add or remove containers"])
    errors = _deadline_errors(before.get("activeDeadlineSeconds"), after.get("activeDeadlineSeconds"))
    errors += _toleration_errors(before.get("tolerations") or (), after.get("tolerations") or ())
    old_gates = [g.get("name") for g in before.get("schedulingGates") or ()]
    errors += [f"spec.schedulingGates[{i}].name: Forbidden: only deletion is allowed, but found new scheduling gate "
               f"'{gate.get('name')}'" for i, gate in enumerate(after.get("schedulingGates") or ())
               if gate.get("name") not in old_gates]
    munged = copy.deepcopy(dict(after))
    for kind in _CONTAINER_LISTS:
        for container, previous in zip(munged.get(kind) or (), before.get(kind) or (), strict=True):
            container["image"] = previous.get("image")
    for name in ("activeDeadlineSeconds", "schedulingGates", "tolerations"):
        _copy_field(munged, before, name)
    grace = before.get("terminationGracePeriodSeconds")
    if grace is not None and grace < 0 and munged.get("terminationGracePeriodSeconds") == 1:
        munged["terminationGracePeriodSeconds"] = grace
    if old_gates:
        selector = after.get("nodeSelector") or {}
        if any(selector.get(k) != v for k, v in (before.get("nodeSelector") or {}).items()):
            errors.append("spec.nodeSelector: Invalid value: only additions to spec.nodeSelector are allowed (no "
                          "mutations or deletions)")
        _copy_field(munged, before, "nodeSelector")
        if "nodeAffinity" in (before.get("affinity") or {}) | (munged.get("affinity") or {}):
            munged["affinity"] = {**(munged.get("affinity") or {}),
                                  "nodeAffinity": (before.get("affinity") or {}).get("nodeAffinity")}
    if _plain(munged) != _plain(before):
        changed = sorted(k for k in set(munged) | set(before) if _plain(munged.get(k)) != _plain(before.get(k)))
        errors.append("spec: Forbidden: pod updates may not change fields other than "
                      f"{','.join(UPDATABLE_FIELDS)}\n  changed: {', '.join(changed)}")
    _raise(new, errors)


def _resource_errors(resources: Mapping[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    for name, quantity in limits.items():
        errors += _integer_errors(name, quantity, f"{path}.limits[{name}]")
    for name, quantity in requests.items():
        errors += _integer_errors(name, quantity, f"{path}.requests[{name}]")
        if _overcommitable(name):
            continue
        if name not in limits:
            errors.append(f"{path}.limits: Required value: Limit must be set for non overcommitable resources")
        elif parse_quantity(quantity) != parse_quantity(limits[name]):
            errors.append(f'{path}.requests: Invalid value: "{quantity}": must be equal to {name} limit of '
                          f"{limits[name]}")
    return errors


def _integer_errors(name: str, quantity: Any, path: str) -> list[str]:
    if not _extended(name):
        return []
    value = parse_quantity(quantity)
    return [] if value == value.to_integral_value() else [f'{path}: Invalid value: "{quantity}": must be an integer']


def _extended(name: str) -> bool:
    """A resource named with a domain other than kubernetes.io (`IsExtendedResourceName`; `requests.` quota
    names aside)."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _overcommitable(name: str) -> bool:
    """Native resources but hugepages (`IsOvercommitAllowed`)."""
    return not _extended(name) and not name.startswith("hugepages-")


def _deadline_errors(before: int | None, after: int | None) -> list[str]:
    if after is None:
        return [] if before is None else [
            "spec.activeDeadlineSeconds: Invalid value: \"null\": must not update from a positive integer to nil "
            "value"]
    if after < 0:
        return [f"spec.activeDeadlineSeconds: Invalid value: {after}: must be between 0 and 2147483647, inclusive"]
    if before is not None and before < after:
        return [f"spec.activeDeadlineSeconds: Invalid value: {after}: must be less than or equal to previous value"]
    return []


def _toleration_errors(before: Any, after: Any) -> list[str]:
    """Every existing toleration is still there, its `tolerationSeconds` aside."""
    def key(toleration: Mapping[str, Any]) -> Any:
        return _plain({k: v for k, v in toleration.items() if k != "tolerationSeconds"})

    kept = [key(t) for t in after]
    if all(key(t) in kept for t in before):
        return []
    return ["spec.tolerations: Forbidden: existing toleration can not be modified except its tolerationSeconds"]


def _copy_field(spec: dict[str, Any], source: Mapping[str, Any], name: str) -> None:
    if name in source:
        spec[name] = copy.deepcopy(source[name])
    else:
        spec.pop(name, None)


def _plain(value: Any) -> Any:
    """JSON with empty values left out: what Go's typed comparison sees of an absent, null or empty field."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items()) if v not in (None, [], {}, "")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _raise(pod: Mapping[str, Any], errors: list[str]) -> None:
    if not errors:
        return
    name = (pod.get("metadata") or {}).get("name", "")
    raise ApiError.invalid(PODS, name, errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")

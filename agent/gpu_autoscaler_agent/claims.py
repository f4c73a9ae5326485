"""What a pod's Dynamic Resource Allocation claims ask for (resource.k8s.io/v1, GA in Kubernetes 1.34).

A pod names claims in `spec.resourceClaims[]`, each a ResourceClaim (`resourceClaimName`) or a template the
claim is made from (`resourceClaimTemplateName`). A claim's `spec.devices.requests[]` asks, `exactly`, for
`count` devices (`allocationMode: ExactCount`, the default) of a DeviceClass, or for the first of a list of
alternatives it can get (`firstAvailable`). (https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/)

The autoscaler plans a request it can be sure a new node satisfies: whole NVIDIA GPUs of class `gpu.nvidia.com`,
which the NVIDIA DRA driver publishes one device per GPU, on a cluster where that DeviceClass exists (the
driver's chart creates it). Everything else is reported with the reason the pod cannot be planned — never a
node that might not satisfy it: `All` devices (the count depends on the node), CEL selectors (we cannot
evaluate them against a node that does not exist yet), a claim already allocated (it is bound to devices of
another node), a missing claim or template or DeviceClass. Other device classes are passed on as they are
and the packer says no node it can launch offers them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler.models.resources import NVIDIA_GPU_CLASS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from datetime import datetime

    from gpu_autoscaler.clock import Clock

__all__ = ["DRA_GROUP", "ClaimsUnplannable", "KubernetesClaims", "has_claims", "is_gpu_class"]

DRA_GROUP = ("resource.k8s.io", "v1")
_ABSENT = 404
"""No such object or resource; a read not allowed (403) is an error, never taken for a missing claim."""


class ClaimsUnplannable(Exception):
    """The pod's claims are such that no node we could launch is known to satisfy them; the message says why."""


def is_gpu_class(device_class: str) -> bool:
    """NVIDIA's DRA classes (`gpu.nvidia.com`, `mig.nvidia.com`…) and any class that names a GPU."""
    return device_class.endswith(".nvidia.com") or "gpu" in device_class


def has_claims(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


class KubernetesClaims:
    def __init__(self, api_client: client.ApiClient, clock: Clock, ttl: timedelta = timedelta(seconds=30), *,
                 custom_api: client.CustomObjectsApi | None = None) -> None:
        self._custom = custom_api or client.CustomObjectsApi(api_client)
        self._clock = clock
        self._ttl = ttl
        self._cache: dict[tuple[str, ...], tuple[datetime, Any]] = {}

    def device_requests(self, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        """`deviceRequests` entries of the pending-pods document; raises ClaimsUnplannable."""
        metadata = pod.get("metadata") or {}
        namespace = metadata.get("namespace") or "default"
        out: list[dict[str, Any]] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            if name := entry.get("resourceClaimTemplateName"):
                template = self._get(namespace, "resourceclaimtemplates", name)
                if template is None:
                    raise ClaimsUnplannable(f"its ResourceClaimTemplate {name} does not exist")
                spec = (template.get("spec") or {}).get("spec") or {}
            elif name := entry.get("resourceClaimName"):
                claim = self._get(namespace, "resourceclaims", name, cache=False)
                if claim is None:
                    raise ClaimsUnplannable(f"its ResourceClaim {name} does not exist")
                if (claim.get("status") or {}).get("allocation"):
                    raise ClaimsUnplannable(f"its ResourceClaim {name} is already allocated to devices of a "
                                            "node: a new node cannot serve it")
                spec = claim.get("spec") or {}
            else:
                continue
            out += [self._request(name, r) for r in (spec.get("devices") or {}).get("requests") or ()]
        return out

    def _request(self, claim: str, request: Mapping[str, Any]) -> dict[str, Any]:
        exactly = request.get("exactly") or next(iter(request.get("firstAvailable") or ()), None) or {}
        device_class = exactly.get("deviceClassName")
        where = f"claim {claim} request {request.get('name', '')}".rstrip()
        if not device_class:
            raise ClaimsUnplannable(f"{where} names no device class")
        if exactly.get("allocationMode", "ExactCount") != "ExactCount":
            raise ClaimsUnplannable(f"{where} asks for all devices of class {device_class}: how many depends on "
                                    "the node, so no node size can be planned for it")
        if exactly.get("selectors"):
            raise ClaimsUnplannable(f"{where} selects {device_class} devices with CEL expressions, which cannot be "
                                    "checked against a node before it exists; select the GPU model with a node "
                                    "selector (karpenter.k8s.aws/instance-gpu-name) instead")
        if device_class == NVIDIA_GPU_CLASS and self._get("", "deviceclasses", device_class) is None:
            raise ClaimsUnplannable(f"{where}: device class {device_class} does not exist in the cluster (the NVIDIA "
                                    "DRA driver is not installed), so no node would publish such devices")
        return {"deviceClassName": device_class, "count": int(exactly.get("count", 1)), "claim": claim}

    def _get(self, namespace: str, plural: str, name: str, *, cache: bool = True) -> dict[str, Any] | None:
        key = (namespace, plural, name)
        now = self._clock.now()
        hit = self._cache.get(key)
        if cache and hit is not None and now - hit[0] < self._ttl:
            found: dict[str, Any] | None = hit[1]
            return found
        group, version = DRA_GROUP
        call: Callable[..., Any] = (self._custom.get_namespaced_custom_object if namespace
                                    else self._custom.get_cluster_custom_object)
        args = (group, version, namespace, plural, name) if namespace else (group, version, plural, name)
        try:
            found = call(*args)
        except ApiException as error:
            if error.status != _ABSENT:
                raise
            found = None
        if cache:
            self._cache[key] = (now, found)
        return found

"""The API server's verbs over the store, with the semantics clients rely on; HTTP lives in `kube_http`.

What is modelled: defaults on create (uid, timestamps, `generateName`, pod status Pending), the status
subresource (the main resource keeps status, `/status` keeps everything else), optimistic concurrency
(`metadata.resourceVersion` on update and patch, preconditions on delete), background garbage collection
through ownerReferences (and of the pods bound to a deleted node, as the pod GC does), the pods' `binding`
and `eviction` subresources (PodDisruptionBudgets), and the PDB status the disruption controller keeps.

Deletion is graceful, as kubernetes.io "Termination of Pods" and "Finalizers" describe: an object with
finalizers only gets `metadata.deletionTimestamp` and stays until the last finalizer is removed; a pod bound to
a node (and not finished) gets `deletionTimestamp` = now + its grace period (`DeleteOptions.gracePeriodSeconds`,
else `spec.terminationGracePeriodSeconds`) and `deletionGracePeriodSeconds`, and stays until its kubelet has
stopped it and deletes it for good (`gracePeriodSeconds=0`, as `kubectl delete --force` does); a second delete
may only shorten the grace period. An unscheduled or finished pod goes at once. Evictions delete the same way.

Pods are defaulted and checked as the API server does (`kube_pod_rules`): requests from limits, extended
resources whole and never overcommitted, and an update changing only what a pod's update may.

Admission: the NamespaceLifecycle plugin's refusal of creates in a namespace being deleted (`_admit_create`).
What is not: admission beyond that, validation beyond what a client would trip over.
"""

from __future__ import annotations

import copy
import secrets
import string
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator import disruption
from gpu_autoscaler.emulator.kube_objects import NAMESPACES, NODES, PDBS, PODS, ApiError, format_time, status_body
from gpu_autoscaler.emulator.kube_patch import apply_patch
from gpu_autoscaler.emulator.kube_pod_rules import check_pod, check_pod_update, default_pod

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.emulator.kube_objects import ResourceType
    from gpu_autoscaler.emulator.kube_selectors import Selector
    from gpu_autoscaler.emulator.kube_store import Store

__all__ = ["ApiServer"]

_SUFFIX = string.ascii_lowercase + string.digits


class ApiServer:
    def __init__(self, store: Store) -> None:
        self.store = store

    # Reading

    def get(self, resource: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        return self.store.get(resource, namespace, name)

    def select(self, resource: ResourceType, namespace: str | None, selector: Selector | None = None,
             ) -> list[dict[str, Any]]:
        return self.store.select(resource, namespace, selector)[0]

    # Writing

    def create(self, resource: ResourceType, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(dict(body))
        metadata = obj.setdefault("metadata", {})
        if resource.namespaced:
            if metadata.get("namespace") and metadata["namespace"] != namespace:
                raise ApiError.bad_request("the namespace of the provided object does not match the namespace "
                                           "sent on the request")
            metadata["namespace"] = namespace
            self._admit_create(resource, namespace, metadata.get("name") or metadata.get("generateName") or "")
        else:
            metadata.pop("namespace", None)
        if not metadata.get("name"):
            if not metadata.get("generateName"):
                raise ApiError.invalid(resource, "", "metadata.name: Required value: name or generateName is "
                                       "required")
            metadata["name"] = metadata["generateName"] + "".join(secrets.choice(_SUFFIX) for _ in range(5))
        for field in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"):
            metadata.pop(field, None)
        obj["apiVersion"] = resource.api_version
        obj["kind"] = resource.kind
        metadata["generation"] = 1
        self._default(resource, obj)
        return self.store.create(resource, obj)

    def update(self, resource: ResourceType, namespace: str, name: str, body: Mapping[str, Any],
               subresource: str | None = None) -> dict[str, Any]:
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise ApiError.bad_request("the name of the object does not match the name on the URL")
        wanted = copy.deepcopy(dict(body))
        version = (wanted.get("metadata") or {}).get("resourceVersion")
        with self.store.lock:
            updated = self.store.update(resource, namespace, name,
                                        lambda current: self._merge(resource, current, wanted, subresource),
                                        expect_version=version or None)
            self._finish_deletion(resource, updated)
        return updated

    def patch(self, resource: ResourceType, namespace: str, name: str, patch: Any, content_type: str,
              subresource: str | None = None) -> dict[str, Any]:
        def change(current: dict[str, Any]) -> dict[str, Any]:
            patched = apply_patch(current, patch, content_type)
            version = (patched.get("metadata") or {}).get("resourceVersion")
            if version and version != current["metadata"].get("resourceVersion"):
                raise ApiError.conflict(resource, name, "the object has been modified; please apply your changes "
                                        "to the latest version and try again")
            return self._merge(resource, current, patched, subresource)

        with self.store.lock:
            updated = self.store.update(resource, namespace, name, change)
            self._finish_deletion(resource, updated)
        return updated

    def delete(self, resource: ResourceType, namespace: str, name: str,
               options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        options = options or {}
        preconditions = options.get("preconditions") or {}
        with self.store.lock:
            current = self.store.get(resource, namespace, name)
            metadata = current["metadata"]
            if preconditions.get("uid") and preconditions["uid"] != metadata.get("uid"):
                raise ApiError.conflict(resource, name, f"Precondition failed: UID in precondition: "
                                        f"{preconditions['uid']}, UID in object meta: {metadata.get('uid')}")
            if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != metadata.get(
                    "resourceVersion"):
                raise ApiError.conflict(resource, name, "Precondition failed: resourceVersion in precondition: "
                                        f"{preconditions['resourceVersion']}, resourceVersion in object meta: "
                                        f"{metadata.get('resourceVersion')}")
            grace = self._grace_period(resource, current, options)
            if grace > 0 or metadata.get("finalizers"):
                return self._mark_deleted(resource, namespace, name, grace)
            return self._remove(resource, namespace, name)

    def _grace_period(self, resource: ResourceType, obj: Mapping[str, Any], options: Mapping[str, Any]) -> int:
        """Seconds the object may take to go: only pods bound to a node and still running have any."""
        if resource is not PODS:
            return 0
        spec = obj.get("spec") or {}
        if not spec.get("nodeName") or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return 0
        wanted = options.get("gracePeriodSeconds")
        try:
            grace = int(wanted) if wanted is not None else int(spec.get("terminationGracePeriodSeconds", 30))
        except (TypeError, ValueError):
            raise ApiError.bad_request(f"gracePeriodSeconds: invalid value {wanted!r}") from None
        current = obj["metadata"].get("deletionGracePeriodSeconds")
        return min(max(grace, 0), current) if current is not None else max(grace, 0)

    def _mark_deleted(self, resource: ResourceType, namespace: str, name: str, grace: int) -> dict[str, Any]:
        """Start a graceful deletion, or shorten one: the object stays, terminating (a namespace's phase says so,
        as the namespace registry's `Delete` sets it)."""
        now = self.store.clock.now()

        def change(obj: dict[str, Any]) -> dict[str, Any]:
            metadata = obj["metadata"]
            if metadata.get("deletionTimestamp") and metadata.get("deletionGracePeriodSeconds", 0) <= grace:
                return obj
            metadata["deletionTimestamp"] = format_time(now + timedelta(seconds=grace))
            metadata["deletionGracePeriodSeconds"] = grace
            if resource is NAMESPACES:
                obj.setdefault("status", {})["phase"] = "Terminating"
            return obj

        updated = self.store.update(resource, namespace, name, change)
        if grace == 0 and not updated["metadata"].get("finalizers"):
            return self._remove(resource, namespace, name)
        return updated

    def _admit_create(self, resource: ResourceType, namespace: str, name: str) -> None:
        """The NamespaceLifecycle admission plugin: no create in a namespace being deleted, 403 Forbidden with
        the cause `NamespaceTerminating` (k8s.io/apiserver pkg/admission/plugin/namespace/lifecycle/admission.go,
        `Admit`: "unable to create new content in namespace %s because it is being terminated"; the Status as
        `admission.NewForbidden` renders it)."""
        try:
            space = self.store.get(NAMESPACES, "", namespace)
        except ApiError:
            return  # no such namespace: not modelled here (the real plugin refuses with 404)
        if (space.get("status") or {}).get("phase") != "Terminating":
            return
        raise ApiError(403, "Forbidden",
                       f'{resource.plural} "{name}" is forbidden: unable to create new content in namespace '
                       f"{namespace} because it is being terminated",
                       # StatusCause.Type is `reason` on the wire (apimachinery meta/v1 types.go: json:"reason").
                       {"name": name, "kind": resource.plural, "causes": [
                           {"reason": "NamespaceTerminating", "message": f"namespace {namespace} is being terminated",
                            "field": "metadata.namespace"}]})

    def _remove(self, resource: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        gone = self.store.delete(resource, namespace, name)
        self._collect(gone["metadata"]["uid"])
        if resource is NODES:
            self._collect_pods_of(name)
        return gone

    def _finish_deletion(self, resource: ResourceType, obj: dict[str, Any]) -> None:
        """A terminating object whose last finalizer went, and whose grace period is over, is removed."""
        metadata = obj["metadata"]
        if not metadata.get("deletionTimestamp") or metadata.get("finalizers"):
            return
        if resource is PODS and metadata.get("deletionGracePeriodSeconds", 0) > 0 and (
                (obj.get("spec") or {}).get("nodeName")):
            return  # the kubelet ends it
        self._remove(resource, metadata.get("namespace", ""), metadata["name"])

    def delete_collection(self, resource: ResourceType, namespace: str | None, selector: Selector | None,
                          ) -> list[dict[str, Any]]:
        with self.store.lock:
            return [
                self.delete(resource, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
                for obj in self.select(resource, namespace, selector)
            ]

    def _collect(self, owner_uid: str) -> None:
        """Background propagation: dependents of a deleted owner go too (and theirs)."""
        for resource, dependent in self.store.dependents(owner_uid):
            metadata = dependent["metadata"]
            remaining = [r for r in metadata.get("ownerReferences") or () if r.get("uid") != owner_uid]
            if remaining:
                self.store.update(resource, metadata.get("namespace", ""), metadata["name"],
                                  partial(_with_owners, refs=remaining))
                continue
            try:
                self.delete(resource, metadata.get("namespace", ""), metadata["name"])
            except ApiError as error:
                if error.code != 404:
                    raise

    def _collect_pods_of(self, node_name: str) -> None:
        """The pod garbage collector's part: pods bound to a deleted node are force-deleted (their finalizers
        still hold them)."""
        for pod in list(self.store.objects(PODS)):
            if (pod.get("spec") or {}).get("nodeName") == node_name:
                metadata = pod["metadata"]
                self._mark_deleted(PODS, metadata["namespace"], metadata["name"], 0)

    # Pods' subresources

    def bind(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """`pods/binding`, as kube-scheduler binds: set spec.nodeName once."""
        target = (body.get("target") or {}).get("name")
        if not target:
            raise ApiError.invalid(PODS, name, "target.name: Required value")

        def change(pod: dict[str, Any]) -> dict[str, Any]:
            bound = (pod.get("spec") or {}).get("nodeName")
            if bound:
                raise ApiError.conflict(PODS, name, f"pod {name} is already assigned to node \"{bound}\"")
            pod.setdefault("spec", {})["nodeName"] = target
            return pod

        self.store.update(PODS, namespace, name, change)
        return status_body(201, success=True)

    def evict(self, namespace: str, name: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`pods/eviction` (policy/v1 Eviction): the pod is deleted if its budget allows, else 429."""
        options = (body or {}).get("deleteOptions") or {}
        with self.store.lock:
            pod = self.store.get(PODS, namespace, name)
            self._admit_create(PODS, namespace, name)  # an Eviction is a create (of the subresource)
            preconditions = options.get("preconditions") or {}
            if preconditions.get("uid") and preconditions["uid"] != pod["metadata"].get("uid"):
                raise ApiError.conflict(PODS, name, "Precondition failed: UID in precondition: "
                                        f"{preconditions['uid']}, UID in object meta: {pod['metadata'].get('uid')}")
            self.refresh_budgets()  # records the pods expected, this one included, before it goes
            disruption.check_eviction(pod, self.store.objects(PDBS), self.store.objects(PODS))
            self.delete(PODS, namespace, name, options)
            self.refresh_budgets()
        return status_body(201, success=True)

    # Controllers' bookkeeping

    def refresh_budgets(self) -> None:
        """Keep each PodDisruptionBudget's status current, as the disruption controller does."""
        with self.store.lock:
            pods = self.store.objects(PODS)
            for budget in self.store.objects(PDBS):
                metadata = budget["metadata"]
                status = disruption.budget_status(budget, pods).as_status(metadata.get("generation", 1))
                if {k: (budget.get("status") or {}).get(k) for k in status} != status:
                    self.store.update(PDBS, metadata["namespace"], metadata["name"],
                                      partial(_with_status, status=status))

    # Helpers

    def _merge(self, resource: ResourceType, current: dict[str, Any], wanted: dict[str, Any],
               subresource: str | None) -> dict[str, Any]:
        """What an update may change: with `/status`, only status; otherwise all but status (if it has one)."""
        if subresource == "status":
            out = copy.deepcopy(current)
            out["status"] = wanted.get("status", {})
            return out
        out = dict(wanted)
        out["apiVersion"] = resource.api_version
        out["kind"] = resource.kind
        if "status" in resource.subresources:
            out["status"] = copy.deepcopy(current.get("status", {}))
        old_spec = current.get("spec")
        if resource is PODS:  # the object an update makes is defaulted as a new one is, then checked
            default_pod(out)
            check_pod_update(current, out)
        if old_spec != out.get("spec"):
            out.setdefault("metadata", {})["generation"] = current["metadata"].get("generation", 1) + 1
        elif "generation" in current["metadata"]:
            out.setdefault("metadata", {})["generation"] = current["metadata"]["generation"]
        return out

    def _default(self, resource: ResourceType, obj: dict[str, Any]) -> None:
        if resource is PODS:
            spec = obj.setdefault("spec", {})
            containers = spec.get("containers")
            if not containers or not all(isinstance(c, dict) and c.get("name") for c in containers):
                raise ApiError.invalid(PODS, obj["metadata"]["name"], "spec.containers: Required value")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("priority", 0)
            spec.setdefault("enableServiceLinks", True)
            default_pod(obj)
            check_pod(obj)
            obj["status"] = {"phase": "Pending"}
        elif resource is NAMESPACES:
            obj["status"] = {"phase": "Active"}
        elif resource is PDBS:
            obj["status"] = {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 0,
                             "desiredHealthy": 0, "expectedPods": 0}
        elif resource.kind == "DaemonSet":
            obj["status"] = {"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0,
                             "numberReady": 0}
        elif "status" in resource.subresources:
            obj.setdefault("status", {})


def _with_owners(obj: dict[str, Any], refs: list[dict[str, Any]]) -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = refs
    return obj


def _with_status(obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    obj["status"] = {**(obj.get("status") or {}), **status}
    return obj


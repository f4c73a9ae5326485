"""A minimal DaemonSet controller: one pod per eligible node, owned by its DaemonSet.

Enough for what drains care about — DaemonSet pods exist on every node, carry a controller
`ownerReference` of kind DaemonSet, and come back if deleted — without rolling updates or surge. A node is
eligible when the template's nodeSelector and required node affinity match it and its taints are tolerated,
counting the tolerations the real controller adds to every daemon pod (not-ready, unreachable,
unschedulable, pressure). Pods are created already bound to their node (`spec.nodeName`, plus the
`matchFields` affinity the real controller writes), so the scheduler never has to place them.
"""

from __future__ import annotations

import copy
import secrets
import string
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpu_autoscaler.emulator.disruption import is_ready, is_terminal
from gpu_autoscaler.emulator.kube_objects import DAEMONSETS, NODES, PODS, ApiError
from gpu_autoscaler.models.pod_spec import required_node_affinity
from gpu_autoscaler.models.requirements import NodeSelectorTerm, terms_match
from gpu_autoscaler.models.taints import Taint, Toleration, tolerates_all

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpu_autoscaler.emulator.kube_apiserver import ApiServer

__all__ = ["DAEMON_TOLERATIONS", "DaemonSets", "eligible"]

DAEMON_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
_SUFFIX = string.ascii_lowercase + string.digits


class DaemonSets:
    def __init__(self, api: ApiServer) -> None:
        self._api = api

    def reconcile(self) -> int:
        """Create the missing daemon pods and drop the misplaced ones; returns how many pods it changed."""
        store = self._api.store
        changed = 0
        with store.lock:
            nodes = list(store.objects(NODES))
            for daemonset in list(store.objects(DAEMONSETS)):
                changed += self._reconcile_one(copy.deepcopy(daemonset), nodes)
        return changed

    def _reconcile_one(self, daemonset: dict[str, Any], nodes: list[dict[str, Any]]) -> int:
        store = self._api.store
        metadata = daemonset["metadata"]
        namespace, uid = metadata["namespace"], metadata["uid"]
        template = (daemonset.get("spec") or {}).get("template") or {}
        owned: dict[str, list[dict[str, Any]]] = {}
        for pod in store.objects(PODS):
            refs = pod["metadata"].get("ownerReferences") or ()
            if pod["metadata"].get("namespace") == namespace and any(r.get("uid") == uid for r in refs):
                owned.setdefault((pod.get("spec") or {}).get("nodeName") or "", []).append(pod)
        placed = {n["metadata"]["name"]: n for n in nodes if eligible(template, n)}
        changed = 0
        for node_name in sorted(placed):
            if not any(not is_terminal(p) for p in owned.get(node_name, ())):
                self._api.create(PODS, namespace, _daemon_pod(daemonset, template, node_name))
                changed += 1
        for node_name, pods in owned.items():
            if node_name not in placed:
                for pod in pods:
                    try:
                        self._api.delete(PODS, namespace, pod["metadata"]["name"])
                        changed += 1
                    except ApiError as error:
                        if error.code != 404:
                            raise
        running = [p for name, pods in owned.items() if name in placed for p in pods if not is_terminal(p)]
        status = {
            "currentNumberScheduled": len(placed), "desiredNumberScheduled": len(placed),
            "numberMisscheduled": 0, "numberReady": sum(1 for p in running if is_ready(p)),
            "numberAvailable": sum(1 for p in running if is_ready(p)), "updatedNumberScheduled": len(placed),
            "observedGeneration": metadata.get("generation", 1),
        }
        if {k: (daemonset.get("status") or {}).get(k) for k in status} != status:
            store.update(DAEMONSETS, namespace, metadata["name"], lambda ds: {**ds, "status": {
                **(ds.get("status") or {}), **status}})
        return changed


def eligible(template: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the DaemonSet controller runs a pod of `template` on `node` (also the NVIDIA device plugin's, which
    is not stored as a DaemonSet: `device_plugin`)."""
    spec = template.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    try:
        terms = [NodeSelectorTerm.model_validate(t) for t in required_node_affinity(spec)]
        tolerations = [Toleration.model_validate(t) for t in [*(spec.get("tolerations") or ()), *DAEMON_TOLERATIONS]]
        taints = [Taint(key=t.get("key", ""), value=t.get("value") or "", effect=t.get("effect", "NoSchedule"))
                  for t in (node.get("spec") or {}).get("taints") or ()]
    except ValidationError:
        return False
    if not terms_match(terms, labels, node["metadata"].get("name")):
        return False
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append(Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule"))
    return tolerates_all(tolerations, taints)


def _daemon_pod(daemonset: Mapping[str, Any], template: Mapping[str, Any], node_name: str) -> dict[str, Any]:
    metadata = daemonset["metadata"]
    spec = copy.deepcopy(template.get("spec") or {})
    tolerations = list(spec.get("tolerations") or ())
    tolerations += [t for t in DAEMON_TOLERATIONS if t not in tolerations]
    spec["tolerations"] = tolerations
    spec["nodeName"] = node_name
    spec["affinity"] = {**(spec.get("affinity") or {}), "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}}}
    suffix = "".join(secrets.choice(_SUFFIX) for _ in range(5))
    return {
        "metadata": {
            "name": f"{metadata['name']}-{suffix}",
            "namespace": metadata["namespace"],
            "labels": dict((template.get("metadata") or {}).get("labels") or {}),
            "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": metadata["name"],
                                 "uid": metadata["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }

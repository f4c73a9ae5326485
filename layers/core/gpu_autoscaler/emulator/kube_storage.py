"""A minimal attach/detach controller: VolumeAttachments appear for the CSI volumes of pods on a node, and go
once no pod on that node uses them any more.

What kube-controller-manager's attach/detach controller and the external-attacher sidecar do, as documented
(kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/volume-attachment-v1/ and the CSI
"Volume lifecycle" of kubernetes-csi.github.io/docs/): for each node, the volumes desired attached are the
PersistentVolumes (with a `csi` source) bound to the PersistentVolumeClaims of the pods scheduled there that
have not finished; a VolumeAttachment (storage.k8s.io/v1, cluster-scoped, `spec.attacher` = the CSI driver,
`spec.nodeName`, `spec.source.persistentVolumeName`) is created for each and marked `status.attached: true`.
Once no such pod uses a volume on the node — a deleted pod still uses it while it is terminating — the
VolumeAttachment is deleted: it gets its `deletionTimestamp` at once, and goes once the driver has detached
the volume — the external-attacher's finalizer holds it until ControllerUnpublishVolume returns, which for EBS
takes seconds (`DETACH_TIME` here). Karpenter waits for exactly these before terminating an instance.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.disruption import is_terminal
from gpu_autoscaler.emulator.kube_objects import (
    PODS,
    PVCS,
    PVS,
    VOLUMEATTACHMENTS,
    format_time,
)

if TYPE_CHECKING:
    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_apiserver import ApiServer

__all__ = ["DETACH_TIME", "AttachDetach", "attachment_name"]

DETACH_TIME = timedelta(seconds=10)
"""From the attach/detach controller's delete to the volume detached and the VolumeAttachment gone."""


def attachment_name(volume: str, attacher: str, node: str) -> str:
    """The name the attach/detach controller gives: `csi-` and the SHA-256 of volume, attacher and node."""
    return "csi-" + hashlib.sha256(f"{volume}{attacher}{node}".encode()).hexdigest()


class AttachDetach:
    def __init__(self, api: ApiServer, clock: Clock, detach_time: timedelta = DETACH_TIME) -> None:
        self._api = api
        self._clock = clock
        self._detach_time = detach_time

    def reconcile(self) -> int:
        """Attach what pods need, detach what none needs; returns how many attachments it changed."""
        store = self._api.store
        with store.lock:
            wanted = self._desired()
            have = {a["metadata"]["name"]: a for a in store.objects(VOLUMEATTACHMENTS)}
            changed = 0
            for name, (volume, attacher, node) in wanted.items():
                if name not in have:
                    self._api.create(VOLUMEATTACHMENTS, "", {
                        "metadata": {"name": name},
                        "spec": {"attacher": attacher, "nodeName": node, "source": {"persistentVolumeName": volume}},
                        "status": {"attached": True},
                    })
                    changed += 1
            now = self._clock.now()
            for name in sorted(have.keys() - wanted.keys()):
                deleting = have[name]["metadata"].get("deletionTimestamp")
                if deleting is None:
                    store.update(VOLUMEATTACHMENTS, "", name, lambda a: {
                        **a, "metadata": {**a["metadata"], "deletionTimestamp": format_time(now)}})
                    changed += 1
                elif now >= datetime.fromisoformat(deleting.replace("Z", "+00:00")) + self._detach_time:
                    self._api.delete(VOLUMEATTACHMENTS, "", name)
                    changed += 1
            return changed

    def _desired(self) -> dict[str, tuple[str, str, str]]:
        """Attachment name → (volume, attacher, node), for every CSI volume a pod on a node still uses."""
        store = self._api.store
        claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in store.objects(PVCS)}
        volumes = {v["metadata"]["name"]: v for v in store.objects(PVS)}
        out: dict[str, tuple[str, str, str]] = {}
        for pod in store.objects(PODS):
            spec = pod.get("spec") or {}
            node = spec.get("nodeName")
            if not node or is_terminal(pod):
                continue
            for entry in spec.get("volumes") or ():
                claim_name = (entry.get("persistentVolumeClaim") or {}).get("claimName")
                claim = claims.get((pod["metadata"]["namespace"], claim_name)) if claim_name else None
                volume = volumes.get((claim.get("spec") or {}).get("volumeName") or "") if claim else None
                attacher = _attacher(volume) if volume else None
                if volume is not None and attacher is not None:
                    name = volume["metadata"]["name"]
                    out[attachment_name(name, attacher, node)] = (name, attacher, node)
        return out


def _attacher(volume: dict[str, Any]) -> str | None:
    return ((volume.get("spec") or {}).get("csi") or {}).get("driver") or None

"""A simulated cloud controller manager (AWS): it initializes the Nodes that kubelets registered uninitialized.

EKS nodes run the kubelet with `--cloud-provider=external` (`kubelet`'s module says where that is written), so
a new Node carries `node.cloudprovider.kubernetes.io/uninitialized=true:NoSchedule` and none of the labels the
cloud knows. The cloud controller manager's node controller (k8s.io/cloud-provider `controllers/node`, run for
EKS by the control plane's AWS cloud controller manager, kubernetes/cloud-provider-aws) initializes each such
node: it looks the instance up by its providerID (`aws:///<zone>/<instance-id>`; DescribeInstances), labels the
Node with what EC2 says of it — `node.kubernetes.io/instance-type`, `topology.kubernetes.io/zone`,
`topology.kubernetes.io/region` (kubernetes.io, "Well-Known Labels, Annotations and Taints"), and the deprecated
`beta.kubernetes.io/instance-type` and `failure-domain.beta.kubernetes.io/zone|region` beside them — and then
removes the uninitialized taint (`TaintExternalCloudProvider`: "until a controller from the cloud-controller-manager
intitializes this node, and then removes the taint"). Until then kube-scheduler places no pod there that does not
tolerate the taint, and DaemonSet pods (the GPU Operator's device plugin among them) neither: the DaemonSet
controller adds no toleration for it (kubernetes.io, "DaemonSet", "Taints and tolerations").

Here that happens `delay` after the Node registered. `describe(instance_id)` is EC2's answer, (instance type,
availability zone), or None when EC2 does not know the instance (the node stays uninitialized and is looked at
again); by default it is what the instance was launched as (tests that build instances without EC2). The
emulator's node side gives it EC2 (moto) itself (`kubernetes_api.KubeletNodeSide`). Nothing here reads the
project's code or configuration.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.kube_objects import NODES, ApiError, remove_taints
from gpu_autoscaler.emulator.kubelet import UNINITIALIZED_TAINT, cloud_labels

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_apiserver import ApiServer
    from gpu_autoscaler.emulator.kubelet import Kubelets

__all__ = ["CLOUD_CONTROLLER_DELAY_SECONDS", "CloudControllerManager", "instance_id_of"]

log = logging.getLogger(__name__)

CLOUD_CONTROLLER_DELAY_SECONDS = 2.0
"""From the Node's registration to its initialization: a watch event and one DescribeInstances call."""


def instance_id_of(provider_id: str) -> str | None:
    """The instance id of an AWS providerID (`aws:///<zone>/<instance-id>`), or None."""
    if not provider_id.startswith("aws://"):
        return None
    last = provider_id.rstrip("/").rsplit("/", 1)[-1]
    return last if last.startswith("i-") else None


class CloudControllerManager:
    """The node controller of the AWS cloud controller manager; `reconcile` initializes the nodes that are due."""

    def __init__(self, api: ApiServer, clock: Clock, kubelets: Kubelets, *, delay: timedelta = timedelta(0),
                 describe: Callable[[str], tuple[str, str] | None] | None = None) -> None:
        self._api = api
        self._clock = clock
        self._kubelets = kubelets
        self.delay = delay
        self.describe = describe
        self._lock = threading.Lock()
        self._initialized: set[str] = set()
        """Instance ids whose Node it initialized (a Node is initialized once)."""

    def next_due(self) -> datetime | None:
        with self._lock:
            done = set(self._initialized)
        return min((at + self.delay for inst, at in self._kubelets.running() if inst.instance_id not in done),
                   default=None)

    def reconcile(self) -> list[str]:
        """Initialize every registered Node that is due; returns the node names initialized."""
        now = self._clock.now()
        initialized = []
        for instance, registered in self._kubelets.running():
            with self._lock:
                if instance.instance_id in self._initialized:
                    continue
            if now < registered + self.delay:
                continue
            node = self._api.store.find(NODES, "", instance.name)
            if node is None:
                continue
            instance_id = instance_id_of((node.get("spec") or {}).get("providerID") or "")
            if instance_id is None:
                log.warning("cloud controller manager: node %s has no AWS providerID; left uninitialized",
                            instance.name)
                continue
            described = (self.describe(instance_id) if self.describe is not None
                         else (instance.instance_type, instance.zone))
            if described is None:
                log.info("cloud controller manager: EC2 does not know %s (node %s) yet", instance_id, instance.name)
                continue
            labels = cloud_labels(*described)
            try:
                self._api.store.update(NODES, "", instance.name, partial(_initialize, labels=labels))
            except ApiError as error:
                if error.code != 404:
                    raise
                continue
            with self._lock:
                self._initialized.add(instance.instance_id)
            initialized.append(instance.name)
        return initialized


def _initialize(node: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    metadata = node["metadata"]
    metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
    remove_taints(node, lambda taint: taint.get("key") == UNINITIALIZED_TAINT)
    return node

"""Simulated kubelets: an instance becomes a Ready Node after its boot delay, and runs the pods bound to it.

`SimulatedInstance` is what an EC2 instance looks like to Kubernetes: its Node's name, providerID
(`aws:///<zone>/<instance-id>`), labels, taints and resources. `SimulatedInstance.from_catalog` derives all
of it from our own models — the instance type's well-known labels, the pool's labels and taints, and the
packer's `node_capacity`/`allocatable` — so a node joins with exactly the room the packer planned for.

`Kubelets` keeps the instances: `add` one (it registers after its boot delay), `remove` one (its Node and the
pods bound to it go, as the pod garbage collector removes pods of a deleted node), and `reconcile` to
register the nodes that are due and start bound pods: phase Running, Ready, as a kubelet reports them.
Pods on any node with a Ready condition are started, so a test may also create Nodes through the API.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.config import NodePool, Overhead
from gpu_autoscaler.domain.packing.fit import allocatable, node_capacity
from gpu_autoscaler.emulator.kube_objects import NODES, PODS, ApiError, format_quantity, format_time
from gpu_autoscaler.models import labels as L

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_apiserver import ApiServer
    from gpu_autoscaler.models.catalog import InstanceType
    from gpu_autoscaler.models.resources import Resources
    from gpu_autoscaler.models.taints import Taint

__all__ = ["HOSTNAME", "NOT_READY_TAINT", "Kubelets", "SimulatedInstance", "node_name_for", "provider_id"]

HOSTNAME = "kubernetes.io/hostname"
REGION = "topology.kubernetes.io/region"
OS = "kubernetes.io/os"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
KUBELET_VERSION = "v1.31.0-eks-local"


def provider_id(zone: str, instance_id: str) -> str:
    return f"aws:///{zone}/{instance_id}"


def _private_ip(instance_id: str) -> str:
    digest = hashlib.sha256(instance_id.encode()).digest()
    return f"10.{digest[0] % 64}.{digest[1]}.{digest[2] % 254 + 1}"


def node_name_for(instance_id: str, zone: str) -> str:
    """The private DNS name EKS nodes are called by (`ip-10-0-1-23.ec2.internal` in us-east-1)."""
    region = zone[:-1] if zone[-1:].isalpha() else zone
    domain = "ec2.internal" if region == "us-east-1" else f"{region}.compute.internal"
    return f"ip-{_private_ip(instance_id).replace('.', '-')}.{domain}"


@dataclass(frozen=True)
class SimulatedInstance:
    instance_id: str
    instance_type: str
    zone: str
    capacity: Resources
    allocatable: Resources | None = None
    """What pods may request; the capacity when not given."""
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    capacity_type: str = "on-demand"
    architecture: str = "amd64"
    node_name: str | None = None
    """The Node's name; the instance's private DNS name when not given."""

    @property
    def name(self) -> str:
        return self.node_name or node_name_for(self.instance_id, self.zone)

    @property
    def provider_id(self) -> str:
        return provider_id(self.zone, self.instance_id)

    @property
    def private_ip(self) -> str:
        return _private_ip(self.instance_id)

    @classmethod
    def from_catalog(
        cls, instance_id: str, instance_type: InstanceType, zone: str, capacity_type: str = "on-demand",
        pool: NodePool | None = None, overhead: Overhead | None = None, *,
        labels: Mapping[str, str] | None = None, taints: tuple[Taint, ...] = (), node_name: str | None = None,
    ) -> SimulatedInstance:
        """The node an instance of this type becomes in this pool: labels, taints and resources as planned."""
        pool = pool or NodePool(name="default")
        node_labels = dict(instance_type.labels)
        node_labels.update({L.ZONE: zone, L.CAPACITY_TYPE: capacity_type, L.NODE_POOL: pool.name})
        node_labels.update(pool.labels)
        node_labels.update(labels or {})
        return cls(
            instance_id=instance_id,
            instance_type=instance_type.name,
            zone=zone,
            capacity=node_capacity(instance_type, pool),
            allocatable=allocatable(instance_type, pool, overhead or Overhead()),
            labels=node_labels,
            taints=tuple(pool.taints) + tuple(taints),
            capacity_type=capacity_type,
            architecture=node_labels.get(L.ARCH, "amd64"),
            node_name=node_name,
        )

    def node(self, now: datetime, *, ready: bool = True) -> dict[str, Any]:
        """The Node object its kubelet registers."""
        stamp = format_time(now)
        region = self.zone[:-1] if self.zone[-1:].isalpha() else self.zone
        labels = {L.INSTANCE_TYPE: self.instance_type, L.ZONE: self.zone, REGION: region,
                  L.CAPACITY_TYPE: self.capacity_type, L.ARCH: self.architecture, OS: "linux", HOSTNAME: self.name}
        labels.update(self.labels)
        taints = [t.model_dump() for t in self.taints]
        if not ready:
            taints.append({"key": NOT_READY_TAINT, "effect": "NoSchedule"})
        allocatable = self.allocatable if self.allocatable is not None else self.capacity
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.name, "labels": labels,
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                         "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            "spec": {"providerID": self.provider_id, **({"taints": taints} if taints else {})},
            "status": {
                "capacity": _quantities(self.capacity),
                "allocatable": _quantities(allocatable),
                "conditions": _node_conditions(stamp, ready),
                "addresses": [{"type": "InternalIP", "address": self.private_ip},
                              {"type": "InternalDNS", "address": self.name},
                              {"type": "Hostname", "address": self.name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": self.instance_id.replace("-", ""), "systemUUID": self.instance_id,
                             "bootID": self.instance_id, "kernelVersion": "6.1.0-amzn2023",
                             "osImage": "Amazon Linux 2023", "containerRuntimeVersion": "containerd://1.7.22",
                             "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": KUBELET_VERSION,
                             "operatingSystem": "linux", "architecture": self.architecture},
            },
        }


def _quantities(resources: Mapping[str, int]) -> dict[str, str]:
    return {name: format_quantity(name, value) for name, value in resources.items()}


def _node_conditions(stamp: str, ready: bool) -> list[dict[str, str]]:
    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}

    return [
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        condition("Ready", "True", "KubeletReady", "kubelet is posting ready status") if ready else
        condition("Ready", "False", "KubeletNotReady", "container runtime network not ready"),
    ]


def node_ready(node: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or ())


class Kubelets:
    """The kubelets of every simulated instance. Thread-safe; `reconcile` does the work when called."""

    def __init__(self, api: ApiServer, clock: Clock, boot_delay: timedelta = timedelta(0)) -> None:
        self._api = api
        self._clock = clock
        self.boot_delay = boot_delay
        self._lock = threading.Lock()
        self._booting: dict[str, tuple[SimulatedInstance, datetime]] = {}
        self._joined: dict[str, SimulatedInstance] = {}

    def add(self, instance: SimulatedInstance, boot_delay: timedelta | None = None) -> None:
        """The instance is running; its Node registers once `boot_delay` (default: the kubelets') has passed."""
        delay = self.boot_delay if boot_delay is None else boot_delay
        with self._lock:
            if instance.instance_id in self._joined or instance.instance_id in self._booting:
                return
            self._booting[instance.instance_id] = (instance, self._clock.now() + delay)

    def remove(self, instance_id: str) -> bool:
        """The instance is gone: its Node (if it joined) and the pods bound to it are deleted. False if unknown."""
        with self._lock:
            booting = self._booting.pop(instance_id, None)
            joined = self._joined.pop(instance_id, None)
        if joined is not None:
            self._delete_node(joined.name)
        return booting is not None or joined is not None

    def instances(self) -> dict[str, str]:
        """Instance id → node name, for every instance known (booting or joined)."""
        with self._lock:
            return {i: inst.name for i, (inst, _) in self._booting.items()} | {
                i: inst.name for i, inst in self._joined.items()}

    def joined(self, instance_id: str) -> bool:
        with self._lock:
            return instance_id in self._joined

    def next_due(self) -> datetime | None:
        with self._lock:
            return min((due for _, due in self._booting.values()), default=None)

    def reconcile(self) -> None:
        self.register_due()
        self.start_pods()

    def register_due(self) -> list[str]:
        """Register every instance whose boot delay has passed; returns the node names registered."""
        now = self._clock.now()
        with self._lock:
            due = [inst for inst, at in self._booting.values() if at <= now]
            for inst in due:
                del self._booting[inst.instance_id]
                self._joined[inst.instance_id] = inst
        registered = []
        for inst in due:
            try:
                self._api.create(NODES, "", inst.node(now))
            except ApiError as error:
                if error.code != 409:
                    raise
                self._api.update(NODES, "", inst.name, _replace_status(inst.node(now)), "status")
            registered.append(inst.name)
        return registered

    def start_pods(self) -> int:
        """Run every pod bound to a Ready node and not yet running; returns how many started."""
        store = self._api.store
        now = format_time(self._clock.now())
        with store.lock:
            ready = {n["metadata"]["name"]: n for n in store.objects(NODES) if node_ready(n)}
            starting = [
                (p["metadata"]["namespace"], p["metadata"]["name"], ready[p["spec"]["nodeName"]])
                for p in store.objects(PODS)
                if (p.get("spec") or {}).get("nodeName") in ready
                and (p.get("status") or {}).get("phase", "Pending") == "Pending"
                and not p["metadata"].get("deletionTimestamp")
            ]
            for namespace, name, node in starting:
                store.update(PODS, namespace, name, partial(_running, node=node, now=now))
        return len(starting)

    def _delete_node(self, name: str) -> None:
        """The API server's pod garbage collection takes the node's pods with it."""
        try:
            self._api.delete(NODES, "", name)
        except ApiError as error:
            if error.code != 404:
                raise


def _replace_status(node: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": node["metadata"]["name"]}, "status": node["status"]}


def _container_id(pod_ip: str, name: str) -> str:
    return "containerd://" + hashlib.sha256(f"{pod_ip}/{name}".encode()).hexdigest()


def _running(pod: dict[str, Any], node: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The status a kubelet reports once the pod's containers run."""
    host_ip = next((a["address"] for a in (node.get("status") or {}).get("addresses") or ()
                    if a.get("type") == "InternalIP"), "10.0.0.1")
    digest = hashlib.sha256(pod["metadata"]["uid"].encode()).digest()
    pod_ip = f"10.{64 + digest[0] % 64}.{digest[1]}.{digest[2] % 254 + 1}"
    conditions = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or ()}
    for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled"):
        if kind == "PodScheduled" and kind in conditions:
            continue
        conditions[kind] = {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
    containers = (pod.get("spec") or {}).get("containers") or ()
    pod["status"] = {
        **(pod.get("status") or {}),
        "phase": "Running",
        "conditions": list(conditions.values()),
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
        "startTime": now,
        "containerStatuses": [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0,
             "started": True, "containerID": _container_id(pod_ip, c["name"]),
             "state": {"running": {"startedAt": now}}}
            for c in containers
        ],
    }
    return pod

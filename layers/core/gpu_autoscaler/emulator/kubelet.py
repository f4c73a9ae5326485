"""Simulated kubelets: an instance becomes a Node with what its user data says, and runs the pods bound to it.

`SimulatedInstance` is what an EC2 instance looks like to Kubernetes: its Node's name, providerID
(`aws:///<zone>/<instance-id>`), labels, taints, resources, and the physical GPUs the NVIDIA device plugin
will find. `SimulatedInstance.from_user_data` builds it as a real node's bootstrap does, from nothing but the
machine (EC2's description of the instance type, `machines.Machine`) and the user data the instance was
launched with (`kubelet_user_data`): the labels, taints, max pods and reservations found there, the labels
the kubelet sets itself (hostname, arch, os), and capacity/allocatable computed as the kubelet does — capacity
less kube-reserved, system-reserved and the hard eviction thresholds (kubernetes.io, "Reserve Compute Resources
for System Daemons"), with the EKS AMIs' defaults where the user data sets none (nodeadm / Bottlerocket:
kube-reserved memory 11 MiB × max pods + 255 MiB, the CPU ladder of `machines.reserved_cpu_millicores`, 1 Gi
ephemeral storage; max pods from the ENI formula). Ephemeral-storage capacity is the filesystem the OS made on the
kubelet's volume, not the volume (`filesystems`). GPUs are not the kubelet's to advertise: the device plugin
adds them once it runs.

A node is registered before it can take pods, as on EKS:

- The EKS AMIs run the kubelet with `--cloud-provider=external` and set its providerID themselves (nodeadm,
  awslabs/amazon-eks-ami `nodeadm/internal/kubelet/config.go` `withCloudProvider`: "provider ID needs to be
  specified when the cloud provider is external"; Bottlerocket's `settings.kubernetes.cloud-provider` is
  `external` too). Such a kubelet registers its Node with the taint
  `node.cloudprovider.kubernetes.io/uninitialized=true:NoSchedule` (k8s.io/cloud-provider `api`,
  `TaintExternalCloudProvider`: "sets this taint on a node to mark it as unusable, when kubelet is started with
  the "external" cloud provider, until a controller from the cloud-controller-manager intitializes this node,
  and then removes the taint"), and without the labels the cloud provider knows: instance type, zone and region
  are the cloud controller manager's to set when it initializes the node (kubernetes.io, "Well-Known Labels,
  Annotations and Taints": `topology.kubernetes.io/zone` — "the kubelet or the external cloud-controller-manager
  populates the label with the information from the cloud provider"). `cloud_controller` does that part.
- The Node registers NotReady (`KubeletNotReady`: "container runtime network not ready" until the VPC CNI's
  aws-node pod runs) with the node lifecycle controller's `node.kubernetes.io/not-ready:NoSchedule` taint
  (kubernetes.io, "Taints and Tolerations", "Taint Nodes by Condition"); the kubelet reports Ready `ready_delay`
  after registering, and the taint goes with it. The EBS CSI node plugin's topology label comes then too (its
  DaemonSet pod registers the driver with the running kubelet).

Tests may also build a `SimulatedInstance` directly with the resources they want (GPUs included, as if the
device plugin had already registered).

`Kubelets` keeps the instances: `add` one (it registers after its boot delay), `remove` one (its Node and the
pods bound to it go, as the pod garbage collector removes pods of a deleted node), and `reconcile` to
register the nodes that are due, report Ready the ones whose network is up, and start bound pods: phase
Running, Ready, as a kubelet reports them. Pods on any node with a Ready condition are started, so a test may
also create Nodes through the API.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.filesystems import kubelet_filesystem_bytes
from gpu_autoscaler.emulator.kube_objects import NODES, PODS, ApiError, format_quantity, format_time, remove_taints
from gpu_autoscaler.emulator.kubelet_user_data import (
    BootstrapError,
    DevicePluginSettings,
    KubeletSettings,
    read_user_data,
)
from gpu_autoscaler.emulator.machines import GIB, HUGE_PAGE, Gpu, Machine, eni_max_pods, reserved_cpu_millicores
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_apiserver import ApiServer

__all__ = ["HOSTNAME", "NODE_READY_DELAY_SECONDS", "NOT_READY_TAINT", "UNINITIALIZED_TAINT", "BootstrapError",
           "Kubelets", "SimulatedInstance", "cloud_labels", "node_name_for", "provider_id", "region_of"]

log = logging.getLogger(__name__)

HOSTNAME = "kubernetes.io/hostname"
ARCH = "kubernetes.io/arch"
OS = "kubernetes.io/os"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
BETA_ARCH = "beta.kubernetes.io/arch"
BETA_OS = "beta.kubernetes.io/os"
"""Deprecated, and still registered by every kubelet beside the stable keys (kubernetes pkg/kubelet/
kubelet_node_status.go `initialNode`: `kubeletapis.LabelOS`, `kubeletapis.LabelArch`)."""
BETA_INSTANCE_TYPE = "beta.kubernetes.io/instance-type"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
BETA_REGION = "failure-domain.beta.kubernetes.io/region"
"""Deprecated, and still set by the cloud node controller beside the stable keys (k8s.io/cloud-provider
controllers/node/node_controller.go: "Adding node label from cloud provider" for both of each)."""
EBS_CSI_ZONE = "topology.ebs.csi.aws.com/zone"
"""The EBS CSI driver's topology key: its node plugin reports the zone under it in NodeGetInfo, and the kubelet
labels the Node with the topology its CSI drivers report (Kubernetes CSI docs, "CSI Topology Feature";
kubernetes-sigs/aws-ebs-csi-driver, pull 1931's discussion of its topology keys). The PVs it provisions
require it in their node affinity, so kube-scheduler's VolumeBinding places their pods by it."""
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"
"""The taint a kubelet with `--cloud-provider=external` registers its Node with (value `true`, NoSchedule), until
the cloud controller manager has initialized the node (k8s.io/cloud-provider `api.TaintExternalCloudProvider`)."""
NODE_READY_DELAY_SECONDS = 5.0
"""From the Node's registration to its kubelet reporting Ready: the VPC CNI's aws-node pod starts and the container
runtime's network is ready."""
KUBELET_VERSION = "v1.31.0-eks-local"
EVICTION_HARD = {"memory.available": "100Mi", "nodefs.available": "10%"}
"""The kubelet's default hard eviction thresholds that bear on allocatable (KubeletConfiguration defaults)."""


def region_of(zone: str) -> str:
    return zone[:-1] if zone[-1:].isalpha() else zone


def cloud_labels(instance_type: str, zone: str) -> dict[str, str]:
    """The labels the cloud controller manager's node controller sets when it initializes a node, from the cloud's
    description of its instance: instance type, zone and region, each under its stable and its deprecated key
    (k8s.io/cloud-provider, node controller)."""
    region = region_of(zone)
    return {INSTANCE_TYPE: instance_type, ZONE: zone, REGION: region,
            BETA_INSTANCE_TYPE: instance_type, BETA_ZONE: zone, BETA_REGION: region}


def provider_id(zone: str, instance_id: str) -> str:
    return f"aws:///{zone}/{instance_id}"


def _private_ip(instance_id: str) -> str:
    digest = hashlib.sha256(instance_id.encode()).digest()
    return f"10.{digest[0] % 64}.{digest[1]}.{digest[2] % 254 + 1}"


def node_name_for(instance_id: str, zone: str) -> str:
    """The private DNS name EKS nodes are called by (`ip-10-0-1-23.ec2.internal` in us-east-1)."""
    region = region_of(zone)
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
    gpu: Gpu | None = None
    """The physical GPUs the NVIDIA device plugin finds (None: none, or already in `capacity`)."""
    device_plugin: DevicePluginSettings | None = None
    """The device plugin's settings from the user data (Bottlerocket); None: from its ConfigMap."""
    efa_devices: int = 0
    """The EFA devices the EFA device plugin finds (the machine's)."""
    os_image: str = "Amazon Linux 2023"

    @property
    def name(self) -> str:
        return self.node_name or node_name_for(self.instance_id, self.zone)

    @property
    def provider_id(self) -> str:
        return provider_id(self.zone, self.instance_id)

    @property
    def private_ip(self) -> str:
        return _private_ip(self.instance_id)

    def ready_labels(self) -> dict[str, str]:
        """Labels that come once the node runs pods: the EBS CSI driver's topology, which the kubelet writes when the
        driver's node plugin (a DaemonSet pod; the emulator's cluster has the driver: it serves its volumes)
        registers with it, reporting the zone it read from instance metadata."""
        return {EBS_CSI_ZONE: self.zone}

    @classmethod
    def from_user_data(
        cls, instance_id: str, machine: Machine, zone: str, user_data: str, *, capacity_type: str = "on-demand",
        node_name: str | None = None,
    ) -> SimulatedInstance:
        """The node this machine's kubelet registers, configured by nothing but its user data.

        Raises `BootstrapError` when the kubelet would not start (unreadable user data, a refused label)."""
        settings = read_user_data(user_data)
        capacity, allocatable = node_resources(machine, settings)
        taints = tuple(Taint(key=t["key"], value=t.get("value", ""), effect=t["effect"])
                       for t in settings.taints)
        return cls(
            instance_id=instance_id, instance_type=machine.instance_type, zone=zone, capacity=capacity,
            allocatable=allocatable, labels=dict(settings.labels), taints=taints, capacity_type=capacity_type,
            architecture=machine.arch_label, node_name=node_name,
            gpu=machine.gpu if machine.gpu and machine.gpu.manufacturer.upper() == "NVIDIA" else None,
            device_plugin=settings.device_plugin, efa_devices=machine.efa_devices,
            os_image="Bottlerocket OS" if settings.os_family == "Bottlerocket" else "Amazon Linux 2023",
        )

    def node(self, now: datetime, *, ready: bool = False, initialized: bool = False) -> dict[str, Any]:
        """The Node object its kubelet registers: NotReady (with the node lifecycle controller's not-ready taint),
        with the external cloud provider's uninitialized taint and without the labels the cloud controller manager
        sets (see the module). `ready`, `initialized`: as it is once the kubelet reported Ready, once the cloud
        controller manager initialized it."""
        stamp = format_time(now)
        # What the kubelet sets itself (hostname, os, arch), then what the user data's --node-labels say.
        labels = {ARCH: self.architecture, OS: "linux", BETA_ARCH: self.architecture, BETA_OS: "linux",
                  HOSTNAME: self.name}
        if ready:
            labels.update(self.ready_labels())
        if initialized:
            labels.update(cloud_labels(self.instance_type, self.zone))
        labels.update(self.labels)
        taints = [t.model_dump() for t in self.taints]
        if not initialized:
            taints.append({"key": UNINITIALIZED_TAINT, "value": "true", "effect": "NoSchedule"})
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
                             "osImage": self.os_image, "containerRuntimeVersion": "containerd://1.7.22",
                             "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": KUBELET_VERSION,
                             "operatingSystem": "linux", "architecture": self.architecture},
            },
        }


def node_resources(machine: Machine, settings: KubeletSettings) -> tuple[Resources, Resources]:
    """(capacity, allocatable) as the kubelet computes them for this machine and these settings. Pre-allocated huge
    pages are capacity of their own (`hugepages-2Mi`) and come out of allocatable memory: "for every huge page
    reservation, we need to remove it from allocatable memory" (kubernetes pkg/kubelet/nodestatus/setters.go,
    MachineInfo)."""
    max_pods = settings.max_pods if settings.max_pods is not None else eni_max_pods(machine)
    storage = kubelet_filesystem_bytes(settings.os_family, machine.kubelet_volume_gib(settings.os_family) * GIB)
    huge_pages = machine.huge_pages(settings.os_family) * HUGE_PAGE
    capacity = Resources({"cpu": machine.vcpus * 1000, "memory": machine.memory_bytes(),
                          "ephemeral-storage": storage, "pods": max_pods,
                          **({"hugepages-2Mi": huge_pages} if huge_pages else {})})
    kube_reserved = settings.kube_reserved
    if kube_reserved is None:
        kube_reserved = {"cpu": f"{reserved_cpu_millicores(machine.vcpus)}m",
                         "memory": f"{11 * max_pods + 255}Mi", "ephemeral-storage": "1Gi"}
    eviction = settings.eviction_hard if settings.eviction_hard is not None else EVICTION_HARD
    reserved = (Resources.from_quantities(kube_reserved) + Resources.from_quantities(settings.system_reserved)
                + _eviction(eviction, capacity) + Resources({"memory": huge_pages}))
    left = capacity - reserved
    return capacity, Resources({name: max(left.get(name, 0), 0) for name in capacity})


def _eviction(thresholds: Mapping[str, str], capacity: Resources) -> Resources:
    """Hard eviction thresholds as reservations: `memory.available` and `nodefs.available` (quantity or %)."""
    out = {}
    for signal, resource in (("memory.available", "memory"), ("nodefs.available", "ephemeral-storage")):
        value = thresholds.get(signal)
        if not value:
            continue
        if value.endswith("%"):
            out[resource] = math.ceil(capacity.get(resource, 0) * float(value[:-1]) / 100)
        else:
            out[resource] = Resources.from_quantities({resource: value}).get(resource, 0)
    return Resources(out)


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

    def __init__(self, api: ApiServer, clock: Clock, boot_delay: timedelta = timedelta(0),
                 container_stop_time: timedelta = timedelta(0), ready_delay: timedelta = timedelta(0)) -> None:
        """`container_stop_time`: how long a pod's containers take to exit after SIGTERM (capped by its grace
        period); zero — they exit at once — unless a test wants to watch pods terminating. `ready_delay`: from
        registering the Node to reporting it Ready (the container runtime's network — the VPC CNI — coming up)."""
        self._api = api
        self._clock = clock
        self.boot_delay = boot_delay
        self.ready_delay = ready_delay
        self._not_ready: dict[str, datetime] = {}
        """Joined instance id → when its kubelet reports the Node Ready."""
        self.container_stop_time = container_stop_time
        self._lock = threading.Lock()
        self._booting: dict[str, tuple[SimulatedInstance, datetime]] = {}
        self._joined: dict[str, SimulatedInstance] = {}
        self._registered_at: dict[str, datetime] = {}
        self._failed: dict[str, str] = {}
        self.admission: list[Callable[[Mapping[str, Any], str], str | None]] = []
        """Checks a pod must pass to start on a node (the device plugin's Allocate): None, or why not."""

    def fail(self, instance_id: str, reason: str) -> None:
        """The instance's kubelet could not start (its bootstrap refused the user data): no Node ever appears."""
        log.warning("instance %s never joins: %s", instance_id, reason)
        with self._lock:
            self._failed[instance_id] = reason

    def failures(self) -> dict[str, str]:
        """Instance id → why its node never joined."""
        with self._lock:
            return dict(self._failed)

    def running(self) -> list[tuple[SimulatedInstance, datetime]]:
        """Every joined instance and when its Node registered (the device plugin starts from then)."""
        with self._lock:
            return [(inst, self._registered_at[i]) for i, inst in self._joined.items()]

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
            self._registered_at.pop(instance_id, None)
            self._not_ready.pop(instance_id, None)
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
            return min([*(due for _, due in self._booting.values()), *self._not_ready.values()], default=None)

    def reconcile(self) -> None:
        self.register_due()
        self.report_ready()
        self.start_pods()
        self.stop_pods()

    def stop_pods(self) -> int:
        """End every terminating pod on a Ready node whose containers have exited (its grace period at most):
        the kubelet then deletes it for good (`gracePeriodSeconds=0`). Returns how many it ended."""
        store = self._api.store
        now = self._clock.now()
        with store.lock:
            ready = {n["metadata"]["name"] for n in store.objects(NODES) if node_ready(n)}
            done = []
            for pod in store.objects(PODS):
                metadata = pod["metadata"]
                if not metadata.get("deletionTimestamp") or (pod.get("spec") or {}).get("nodeName") not in ready:
                    continue
                grace = timedelta(seconds=int(metadata.get("deletionGracePeriodSeconds") or 0))
                requested = _parse_time(metadata["deletionTimestamp"]) - grace
                if now >= requested + min(grace, self.container_stop_time) and (
                        metadata.get("deletionGracePeriodSeconds") or 0) > 0:
                    done.append((metadata["namespace"], metadata["name"]))
        for namespace, name in done:
            try:
                self._api.delete(PODS, namespace, name, {"gracePeriodSeconds": 0})
            except ApiError as error:
                if error.code != 404:
                    raise
        return len(done)

    def register_due(self) -> list[str]:
        """Register every instance whose boot delay has passed, NotReady and uninitialized (see the module);
        returns the node names registered."""
        now = self._clock.now()
        with self._lock:
            due = [inst for inst, at in self._booting.values() if at <= now]
            for inst in due:
                del self._booting[inst.instance_id]
                self._joined[inst.instance_id] = inst
                self._registered_at[inst.instance_id] = now
                self._not_ready[inst.instance_id] = now + self.ready_delay
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

    def report_ready(self) -> list[str]:
        """Every registered node whose kubelet is ready by now reports Ready: its Ready condition turns True and the
        node lifecycle controller takes its not-ready taint off. Returns the node names."""
        now = self._clock.now()
        with self._lock:
            due = [self._joined[i] for i, at in self._not_ready.items() if at <= now and i in self._joined]
            for inst in due:
                del self._not_ready[inst.instance_id]
        reported = []
        for inst in due:
            try:
                self._api.store.update(NODES, "", inst.name, partial(_report_ready, instance=inst, now=now))
            except ApiError as error:
                if error.code != 404:
                    raise
                continue
            reported.append(inst.name)
        return reported

    def start_pods(self) -> int:
        """Run every pod bound to a Ready node and not yet running (or fail it when admission refuses it);
        returns how many started."""
        store = self._api.store
        now = format_time(self._clock.now())
        with store.lock:
            ready = {n["metadata"]["name"]: n for n in store.objects(NODES) if node_ready(n)}
            starting = [
                (p["metadata"]["namespace"], p["metadata"]["name"], ready[p["spec"]["nodeName"]], p)
                for p in store.objects(PODS)
                if (p.get("spec") or {}).get("nodeName") in ready
                and (p.get("status") or {}).get("phase", "Pending") == "Pending"
                and not p["metadata"].get("deletionTimestamp")
            ]
            started = 0
            for namespace, name, node, pod in starting:
                refused = next((r for r in (check(pod, node["metadata"]["name"]) for check in self.admission) if r),
                               None)
                if refused:
                    store.update(PODS, namespace, name, partial(_refused, message=refused))
                    continue
                store.update(PODS, namespace, name, partial(_running, node=node, now=now))
                started += 1
        return started

    def _delete_node(self, name: str) -> None:
        """The API server's pod garbage collection takes the node's pods with it."""
        try:
            self._api.delete(NODES, "", name)
        except ApiError as error:
            if error.code != 404:
                raise


def _parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _report_ready(node: dict[str, Any], instance: SimulatedInstance, now: datetime) -> dict[str, Any]:
    stamp = format_time(now)
    status = node.setdefault("status", {})
    status["conditions"] = [c for c in status.get("conditions") or () if c.get("type") != "Ready"] + [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
         "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]
    metadata = node["metadata"]
    metadata["labels"] = {**(metadata.get("labels") or {}), **instance.ready_labels()}
    remove_taints(node, lambda taint: taint.get("key") == NOT_READY_TAINT)
    return node


def _replace_status(node: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": node["metadata"]["name"]}, "status": node["status"]}


def _refused(pod: dict[str, Any], message: str) -> dict[str, Any]:
    """The kubelet's admission failure: the pod never runs (kubelet `UnexpectedAdmissionError`)."""
    pod["status"] = {**(pod.get("status") or {}), "phase": "Failed", "reason": "UnexpectedAdmissionError",
                     "message": f"Pod was rejected: {message}"}
    return pod


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

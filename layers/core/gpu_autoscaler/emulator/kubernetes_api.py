"""The local Kubernetes API: a real HTTP API server in-process, simulated kubelets, device plugin and scheduler.

No real API server runs on these machines, so tests, the emulator and the demo talk to this one through the
real `kubernetes` client (or kubectl, via the kubeconfig it writes). It serves what capacity management
uses, with the semantics clients depend on:

- core/v1 `nodes`, `pods` (with `status`, `binding` and `eviction`), `namespaces`, `events`, `configmaps`; apps/v1
  `daemonsets`; policy/v1 `poddisruptionbudgets`; scheduling.x-k8s.io/v1alpha1 `podgroups` (coscheduling);
  core/v1 `persistentvolumes`, `persistentvolumeclaims` and storage.k8s.io/v1 `volumeattachments`, kept by an
  attach/detach controller (`kube_storage`);
- get, list (label and field selectors — `spec.nodeName`, `status.phase`… — `limit`/`continue`), create,
  update, patch (JSON patch, merge patch, strategic merge patch), delete with preconditions, garbage
  collection through ownerReferences;
- watches from a resourceVersion, with bookmarks, and 410 Gone once the version is compacted
  (`expire_watches()` forces it, ending every open watch with an ERROR 410 event);
- outages: `begin_outage("unavailable" | "refused")` answers every request 503 ServiceUnavailable (or refuses
  connections) and pauses the controllers until `end_outage()`, which by default compacts the watch history
  (a watch from before the outage gets 410 Gone, as from a restarted API server);
- evictions (policy/v1) that honour PodDisruptionBudgets: 429 TooManyRequests with the API server's Status;
- `/version`, `/api`, `/apis` discovery, `/healthz`;
- authentication and authorization as on EKS (`kube_authn`, `kube_rbac`): its admin token (`system:masters`),
  ServiceAccount tokens it issues (`service_account_token`), and EKS tokens verified as aws-iam-authenticator
  verifies them (replayed against the emulated STS, `sts_endpoint`) and mapped through the cluster's access
  entries; then RBAC over the ClusterRoles, Roles and bindings it stores: the bootstrap roles, and the project's
  shipped manifests (`agent/deploy`: namespace, the agent's ServiceAccount, its and the functions' RBAC), applied
  when the cluster is made, as a user applies them. 401 Unauthorized and 403 Forbidden as the API server answers;
- what kubectl needs beyond that: Table output (`kubectl get` columns, `-w`) and OpenAPI v3 documents
  (`kubectl create/apply` validate on the server), so `kubectl --kubeconfig <kubeconfig_path>` works.

Use::

    with LocalKubernetes(boot_delay=timedelta(seconds=1)) as kube:   # starts on 127.0.0.1, a free port
        core = kubernetes.client.CoreV1Api(kube.client())
        kube.add_instance(SimulatedInstance.from_user_data("i-0abc", machine, "us-east-1a", user_data))
        ...                                                   # the node registers after the boot delay,
        kube.remove_instance("i-0abc")                        # pods are bound by the background scheduler

`kube.url`, `kube.kubeconfig_path` and `kube.token` are for other processes (kubectl, the agent). With
`run_controllers=False` nothing happens in the background: call `reconcile()` (register due nodes, run the
device plugin and the DaemonSet controller, schedule, start bound pods, end terminating ones, refresh PDB
status) when the test wants it to happen —
with a `FixedClock`, boot delays pass when the clock is advanced. `restart()` drops every connection and
listens again on the same port with the same objects, as an API server restart looks to clients.

`KubeletNodeSide` plugs the kubelets into the emulator's instance watcher: an EC2 instance that boots
becomes the node its machine (EC2's DescribeInstanceTypes) and its user data (DescribeInstanceAttribute) make
it — or never joins, when its kubelet refuses that user data — and leaves when it is gone. A Node registers
NotReady and uninitialized, as on EKS (`kubelet`): its kubelet reports it Ready `ready_delay` after registering,
the cloud controller manager (`cloud_controller`) initializes it from EC2's description of the instance
`cloud_controller_delay` after, and the NVIDIA device plugin (`device_plugin`) advertises its GPUs once the GPU
Operator's pods may run there, and no sooner than `device_plugin_delay` after the Node registered; the EFA device
plugin (`efa_device_plugin`) likewise advertises the EFAs EC2 launched the instance with.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import tempfile
import threading
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client as k8s

import gpu_autoscaler
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler.emulator.cloud_controller import CloudControllerManager
from gpu_autoscaler.emulator.daemonsets import DaemonSets
from gpu_autoscaler.emulator.device_plugin import NvidiaDevicePlugin
from gpu_autoscaler.emulator.efa_device_plugin import EfaDevicePlugin
from gpu_autoscaler.emulator.kube_apiserver import ApiServer
from gpu_autoscaler.emulator.kube_authn import Authenticator, UserInfo
from gpu_autoscaler.emulator.kube_http import ApiHttpServer
from gpu_autoscaler.emulator.kube_objects import RESOURCES, SERVICEACCOUNTS
from gpu_autoscaler.emulator.kube_rbac import Authorizer, bootstrap_policy
from gpu_autoscaler.emulator.kube_scheduler import Scheduler
from gpu_autoscaler.emulator.kube_storage import AttachDetach
from gpu_autoscaler.emulator.kube_store import Store
from gpu_autoscaler.emulator.kube_tls import ServingCertificate, serving_certificate
from gpu_autoscaler.emulator.kubelet import BootstrapError, Kubelets, SimulatedInstance
from gpu_autoscaler.emulator.machines import describe_machine
from gpu_autoscaler.emulator.node_lifecycle import NodeLifecycle

if TYPE_CHECKING:
    from types import TracebackType

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_scheduler import ScheduleResult
    from gpu_autoscaler.emulator.kube_store import StoreEvent

__all__ = ["NODE_MONITOR_GRACE", "KubeletNodeSide", "LocalKubernetes", "SimulatedInstance"]

NODE_MONITOR_GRACE = timedelta(seconds=40)
"""kube-controller-manager's `--node-monitor-grace-period` default (Kubernetes docs, kube-controller-manager
reference): how long a Node's kubelet may post no status before its conditions turn Unknown."""

log = logging.getLogger(__name__)


class LocalKubernetes:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock | None = None,
        cluster_name: str = "local",
        token: str | None = None,
        sts_endpoint: str | None = None,
        boot_delay: timedelta = timedelta(0),
        device_plugin_delay: timedelta = timedelta(0),
        ready_delay: timedelta = timedelta(0),
        cloud_controller_delay: timedelta = timedelta(0),
        run_controllers: bool = True,
        reconcile_interval: float = 0.05,
        bookmark_interval: float = 5.0,
        history: int = 10_000,
        kubeconfig_dir: str | Path | None = None,
        node_monitor_grace: timedelta = NODE_MONITOR_GRACE,
    ) -> None:
        """`token`: the admin's bearer token (random when None); `sts_endpoint`: the emulated STS EKS tokens are
        replayed against (the embedded AWS's URL; settable later, `authenticator.sts_endpoint`).
        `ready_delay`, `cloud_controller_delay`: from a Node's registration to its kubelet reporting Ready, to the
        cloud controller manager initializing it (zero: in the controllers' pass that registers it, still NotReady
        and uninitialized at first)."""
        self.clock = clock or SystemClock()
        self.cluster_name = cluster_name
        self.token = token or secrets.token_urlsafe(24)
        self.store = Store(self.clock, history=history)
        self.api = ApiServer(self.store)
        self.authenticator = Authenticator(cluster_name, self.clock, self.token, sts_endpoint=sts_endpoint)
        self.authorizer = Authorizer(self.api)
        for resource, obj in bootstrap_policy():
            self.api.create(resource, "", obj)
        apply_shipped_access(self.api)
        self.kubelets = Kubelets(self.api, self.clock, boot_delay, ready_delay=ready_delay)
        self.cloud_controller = CloudControllerManager(self.api, self.clock, self.kubelets,
                                                       delay=cloud_controller_delay)
        self.device_plugin = NvidiaDevicePlugin(self.api, self.clock, self.kubelets, delay=device_plugin_delay)
        self.efa_device_plugin = EfaDevicePlugin(self.api, self.clock, self.kubelets, delay=device_plugin_delay)
        self.scheduler = Scheduler(self.api, self.clock)
        self.daemonsets = DaemonSets(self.api)
        self.volumes = AttachDetach(self.api, self.clock)
        self.node_lifecycle = NodeLifecycle(self.store, self.clock, node_monitor_grace)
        self._host = host
        self._port = port
        self._run_controllers = run_controllers
        self._interval = reconcile_interval
        self._bookmark_interval = bookmark_interval
        self._server: ApiHttpServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._controller_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._paused = threading.Event()
        """Set during an outage: the controllers do nothing."""
        self._dirty = threading.Event()
        self._reconcile_lock = threading.Lock()
        self._kubeconfig_dir = Path(kubeconfig_dir) if kubeconfig_dir else None
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        self._kubeconfig: Path | None = None
        self._certificate: ServingCertificate | None = None
        self.store.subscribe(self._on_change)

    # Lifecycle

    def start(self) -> LocalKubernetes:
        if self._server is not None:
            raise RuntimeError("the local Kubernetes API is already started")
        self.store.reopen()
        if self._certificate is None:
            self._certificate = serving_certificate(self._state_directory(), self._host)
        self._server = ApiHttpServer((self._host, self._port), self.api,
                                     authenticate=self.authenticator.authenticate,
                                     authorize=self.authorizer.authorize, bookmark_interval=self._bookmark_interval,
                                     tls=self._certificate.context)
        self._port = self._server.server_address[1]
        self._serve_thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                              name="local-kube-api", daemon=True)
        self._serve_thread.start()
        self._write_kubeconfig()
        if self._run_controllers and self._controller_thread is None:
            self._stop.clear()
            self._controller_thread = threading.Thread(target=self._control_loop, name="local-kube-controllers",
                                                       daemon=True)
            self._controller_thread.start()
        log.info("local Kubernetes API at %s (kubeconfig %s)", self.url, self._kubeconfig)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._close_server()
        if self._controller_thread is not None:
            self._controller_thread.join(timeout=5)
            self._controller_thread = None
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    def begin_outage(self, mode: str = "unavailable") -> None:
        """The API server goes away until `end_outage`: `unavailable` answers every request 503
        ServiceUnavailable (`kube_http`: a load balancer in front of a control plane with no healthy
        instance); `refused` stops listening, so connections are refused. Either way every open connection
        (watches included) is dropped, and the controllers stop: a kubelet or scheduler cannot reach the API
        either, so nothing registers, binds or finishes terminating until it is back."""
        if mode not in ("unavailable", "refused"):
            raise ValueError(f"outage mode must be 'unavailable' or 'refused', not {mode!r}")
        self._paused.set()
        with self._reconcile_lock:  # a pass under way finishes first
            pass
        if mode == "refused":
            self._close_server()
            return
        if self._server is None:
            raise RuntimeError("the local Kubernetes API is not started")
        self._server.unavailable = True
        self._server.close_connections()

    def end_outage(self, *, compacted: bool = True) -> None:
        """The API server is back, on the same port with every object. `compacted`: its watch history starts
        now, so a watch from a version before the outage is answered 410 Gone and the client must list again
        — what a restarted kube-apiserver's watch cache does (it is filled from a fresh list), and what etcd's
        compaction (every 5 minutes by default) does to an outage that outlasts it (kubernetes.io, "Kubernetes
        API Concepts", "Efficient detection of changes": clients must handle 410 Gone by listing again)."""
        if compacted:
            self.store.expire()
        if self._server is None:
            self.store.reopen()
            self.start()
        else:
            self._server.unavailable = False
        self._paused.clear()
        self._dirty.set()

    @property
    def in_outage(self) -> bool:
        return self._paused.is_set()

    def restart(self) -> None:
        """Drop every connection and listen again on the same port, keeping every object (a server restart)."""
        self._close_server()
        self.store.reopen()
        self.start()

    def _close_server(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self.store.close()
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._serve_thread is not None:
            self._serve_thread.join(timeout=5)
            self._serve_thread = None

    def __enter__(self) -> LocalKubernetes:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # What it hands out

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    @property
    def kubeconfig_path(self) -> Path:
        if self._kubeconfig is None:
            raise RuntimeError("the local Kubernetes API is not started")
        return self._kubeconfig

    def configuration(self, token: str | None = None) -> k8s.Configuration:
        configuration = k8s.Configuration()
        configuration.host = self.url
        configuration.api_key["BearerToken"] = token or self.token
        configuration.api_key_prefix["BearerToken"] = "Bearer"
        return configuration

    def client(self, token: str | None = None) -> k8s.ApiClient:
        """A new ApiClient for this server, authenticated with its token (or the one given)."""
        return k8s.ApiClient(self.configuration(token))

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token for an existing ServiceAccount (404 NotFound otherwise), as a pod of that account gets in
        its projected token volume (TokenRequest)."""
        self.api.get(SERVICEACCOUNTS, namespace, name)
        return self.authenticator.issue_service_account_token(namespace, name)

    def user_token(self, name: str, groups: tuple[str, ...]) -> str:
        """A bearer token for a user in `groups`, as kube-apiserver's static token file gives one: how a test acts as
        a group (the functions' `gpu-autoscaler-functions`) without an AWS account to sign an EKS token."""
        return self.authenticator.issue_static_token(UserInfo(name, groups))

    # Instances

    def add_instance(self, instance: SimulatedInstance, boot_delay: timedelta | None = None) -> None:
        """A running instance whose kubelet registers its Node after `boot_delay` (default: the server's)."""
        self.kubelets.add(instance, boot_delay)
        self._dirty.set()

    def remove_instance(self, instance_id: str) -> bool:
        """The instance terminated: its Node and the pods bound to it are deleted (the cloud controller manager
        deletes the Node of an instance that no longer exists; PodGC its pods). False if it was unknown."""
        name = self.kubelets.instances().get(instance_id)
        if name is not None:
            self.node_lifecycle.forget(name)
        removed = self.kubelets.remove(instance_id)
        self._dirty.set()
        return removed

    def stop_instance(self, instance_id: str) -> bool:
        """The instance stopped: its kubelet posts no more status; its Node stays (`node_lifecycle` says what
        the control plane does to it). False if its Node never joined."""
        if not self.kubelets.joined(instance_id):
            return False
        self.node_lifecycle.stopped(self.kubelets.instances()[instance_id])
        self._dirty.set()
        return True

    def restart_instance(self, instance_id: str) -> bool:
        """A stopped instance runs again: its kubelet posts its status again. False if it was not stopped."""
        name = self.kubelets.instances().get(instance_id)
        started = name is not None and self.node_lifecycle.started(name)
        self._dirty.set()
        return started

    # Control

    def reconcile(self) -> ScheduleResult:
        """One pass of every controller; returns what the scheduler did."""
        with self._reconcile_lock:
            self.kubelets.register_due()
            self.kubelets.report_ready()
            self.cloud_controller.reconcile()
            self.node_lifecycle.reconcile()
            self.device_plugin.reconcile()
            self.efa_device_plugin.reconcile()
            self.daemonsets.reconcile()
            result = self.scheduler.schedule()
            self.kubelets.start_pods()
            self.kubelets.stop_pods()
            self.volumes.reconcile()
            self.api.refresh_budgets()
            return result

    def schedule(self) -> ScheduleResult:
        """A scheduling pass alone (then the kubelets start what was bound)."""
        with self._reconcile_lock:
            result = self.scheduler.schedule()
            self.kubelets.start_pods()
            return result

    def expire_watches(self) -> None:
        """As if etcd compacted now: every open watch ends with ERROR 410, every older version is too old."""
        self.store.expire()

    def objects(self, plural: str) -> list[dict[str, Any]]:
        """Every stored object of one resource (`pods`, `nodes`…), as the API would send it."""
        return self.store.snapshot()[plural]

    def _on_change(self, event: StoreEvent) -> None:
        self._dirty.set()

    def _control_loop(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait(self._wait_time())
            if self._stop.is_set():
                return
            self._dirty.clear()
            if self._paused.is_set():
                self._stop.wait(self._interval)
                continue
            try:
                self.reconcile()
            except Exception:  # a controller bug must not stop the cluster; it is logged with its trace
                log.exception("local Kubernetes controllers failed; retrying")
                self._stop.wait(0.5)
            self._stop.wait(self._interval)

    def _wait_time(self) -> float:
        due = min((d for d in (self.kubelets.next_due(), self.cloud_controller.next_due(),
                                self.device_plugin.next_due(), self.efa_device_plugin.next_due()) if d is not None),
                  default=None)
        if due is None:
            return 1.0
        return min(max((due - self.clock.now()).total_seconds(), 0.0), 1.0)

    # Access

    def _state_directory(self) -> Path:
        """Where the kubeconfig and the serving certificate go: the one given, else a temporary directory."""
        if self._kubeconfig_dir is None and self._tempdir is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="gpu-autoscaler-kube-")
        directory = self._kubeconfig_dir or Path(self._tempdir.name)  # type: ignore[union-attr]
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _write_kubeconfig(self) -> None:
        """The admin's kubeconfig, for kubectl: HTTPS under the cluster's CA, as client-go sends a token over TLS
        only (`kube_tls`)."""
        assert self._certificate is not None
        path = self._state_directory() / "kubeconfig"
        user = f"{self.cluster_name}-admin"
        cluster = {"server": f"https://{self._host}:{self._port}",
                   "certificate-authority-data": base64.b64encode(self._certificate.ca_pem).decode()}
        document = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": self.cluster_name, "cluster": cluster}],
            "users": [{"name": user, "user": {"token": self.token}}],
            "contexts": [{"name": self.cluster_name,
                          "context": {"cluster": self.cluster_name, "user": user, "namespace": "default"}}],
            "current-context": self.cluster_name,
        }
        path.write_text(json.dumps(document, indent=2))  # JSON is YAML: kubectl and the client both read it
        path.chmod(0o600)
        self._kubeconfig = path


SHIPPED_ACCESS = ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "functions-rbac.yaml")
"""What of `agent/deploy` (its kustomization's resources) says who may do what: applied to every local cluster. The
Deployment is not: the emulator runs the agent in-process (`emulator.session`)."""


def apply_shipped_access(api: ApiServer) -> None:
    """Create the objects of the project's shipped manifests (`SHIPPED_ACCESS`), as `kubectl apply` by the cluster's
    admin creates them: the RBAC the functions and the agent get on a real cluster is the RBAC they get here."""
    directory = Path(gpu_autoscaler.__file__).resolve().parents[3] / "agent" / "deploy"
    kinds = {(r.api_version, r.kind): r for r in RESOURCES}
    for name in SHIPPED_ACCESS:
        for document in yaml.safe_load_all((directory / name).read_text()):
            if not document:
                continue
            resource = kinds[document["apiVersion"], document["kind"]]
            api.create(resource, document["metadata"].get("namespace", "") if resource.namespaced else "", document)


class KubeletNodeSide:
    """The emulator's `NodeSide`: a booted EC2 instance becomes the Node its machine and user data make it.

    Takes any object with the instance watcher's `LaunchedInstance` fields (instance_id, zone, capacity_type,
    private_dns_name) and asks EC2 (moto, through `ec2`) what the machine is and which user data it was
    launched with, as the instance itself would read them from its metadata. Nothing comes from the
    project's configuration or catalog.
    """

    def __init__(self, kube: LocalKubernetes, ec2: Any) -> None:
        self._kube = kube
        self._ec2 = ec2
        kube.cloud_controller.describe = self.describe

    def describe(self, instance_id: str) -> tuple[str, str] | None:
        """What the cloud controller manager reads of an instance: (type, availability zone) from EC2's
        DescribeInstances, or None when EC2 does not know it."""
        try:
            answer = self._ec2.describe_instances(InstanceIds=[instance_id])
        except Exception as error:  # InvalidInstanceID.NotFound, or EC2 unreachable: looked at again later
            log.info("cloud controller manager: DescribeInstances %s failed: %s", instance_id, error)
            return None
        for reservation in answer.get("Reservations") or ():
            for instance in reservation.get("Instances") or ():
                if instance.get("InstanceId") == instance_id:
                    return instance["InstanceType"], instance["Placement"]["AvailabilityZone"]
        return None

    def boot(self, instance: Any) -> None:
        if self._kube.restart_instance(instance.instance_id):
            return  # a stopped instance started again: the same kubelet, the same Node
        try:
            simulated = self.simulated(instance)
        except BootstrapError as error:
            self._kube.kubelets.fail(instance.instance_id, str(error))
            return
        self._kube.add_instance(simulated, boot_delay=timedelta(0))

    def simulated(self, instance: Any) -> SimulatedInstance:
        """The node this instance registers (`BootstrapError` when its kubelet would not start)."""
        machine, _ = describe_machine(self._ec2, instance.instance_id)
        answer = self._ec2.describe_instance_attribute(InstanceId=instance.instance_id, Attribute="userData")
        encoded = (answer.get("UserData") or {}).get("Value") or ""
        try:
            user_data = base64.b64decode(encoded).decode() if encoded else ""
        except (ValueError, UnicodeDecodeError):
            raise BootstrapError("user data is not base64-encoded text") from None
        return SimulatedInstance.from_user_data(
            instance.instance_id, machine, instance.zone, user_data, capacity_type=instance.capacity_type,
            node_name=instance.private_dns_name or None)

    def stop(self, instance: Any) -> None:
        self._kube.stop_instance(instance.instance_id)

    def shutdown(self, instance: Any) -> None:
        self._kube.remove_instance(instance.instance_id)

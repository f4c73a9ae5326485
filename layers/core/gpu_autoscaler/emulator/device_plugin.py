"""A simulated NVIDIA device plugin (with the GPU Operator's MIG manager): what a GPU node advertises.

Written from NVIDIA/k8s-device-plugin's README ("Shared Access to GPUs", "Multiple Config Files",
"Updating Per-Node Configuration With a Node Label", MIG strategies) and NVIDIA/mig-parted's default
configuration, never from the project's packer:

- The kubelet registers a node without GPUs; the plugin, once it runs (`delay` after the Node registered, and not
  before the node is Ready: its pod uses the pod network, and the kubelet starts no such pod while the container
  runtime's network is not ready — "network is not ready: container runtime network not ready"), advertises them
  in the node's capacity and allocatable, and removes the startup taints it is configured with (a node that is
  Ready is not yet initialized until then).
- It runs only where the GPU Operator's DaemonSets may run: the node's NoSchedule and NoExecute taints must be
  tolerated (Kubernetes docs, "DaemonSet" — "Taints and tolerations": daemon pods get only the not-ready,
  unreachable, pressure and unschedulable tolerations on top of their own) by the operand DaemonSets (device plugin,
  GPU Feature Discovery, MIG manager: the operator gives them `daemonsets.tolerations` of its Helm values,
  controllers/object_controls.go applyCommonDaemonsetConfig) and by the NFD worker, whose PCI labels tell the
  operator the node has a GPU (`node-feature-discovery.worker.tolerations`). The values are those the project ships
  (`agent/deploy/gpu-operator/values.yaml`), over the chart's defaults (deployments/gpu-operator/values.yaml):
  `nvidia.com/gpu:NoSchedule` alone. A node it cannot run on advertises no GPUs and gets no GPU labels; once
  running it stays (a NoSchedule taint added later does not evict a daemon pod). Bottlerocket's plugin is a host
  service, not a DaemonSet: it runs whatever the taints, and before the node is Ready.
- Its configuration is a ConfigMap in the cluster (the GPU Operator's `devicePlugin.config.name`), one plugin
  config file per key. The node label `nvidia.com/device-plugin.config` names the key to use; without it, the
  deployment's default key (`devicePlugin.config.default`); with no default, the one key if there is only one.
  A label naming a key that does not exist stops the plugin (its config-manager fails): nothing is advertised.
  Without the ConfigMap at all, the plugin runs with its built-in defaults (whole GPUs, MIG strategy none).
- A config file: `flags.migStrategy` (`none`, `single`, `mixed`) and `sharing.timeSlicing`: `resources`
  (name, replicas — at least 2, or the config is invalid and the plugin does not start: api/config/v1/replicas.go
  "number of replicas must be >= 2" —, optional rename), `renameByDefault` (a shared resource is advertised as
  `<name>.shared`),
  `failRequestsGreaterThanOne` (kept for what a pod may ask; advertising is unchanged).
- MIG: the MIG manager partitions every GPU as the label `nvidia.com/mig.config` names an entry of
  mig-parted's default config (`all-1g.10gb`, `all-1g.10gb.me`, `all-disabled`…), by GPU model and memory,
  and reports `nvidia.com/mig.config.state` (`success`, or `failed` when the GPU has no such layout). Then the
  strategy decides the names: `single` advertises the slices as `nvidia.com/gpu`, `mixed` as
  `nvidia.com/mig-<profile>` with `+` turned into `.` (`1g.10gb+me` is `nvidia.com/mig-1g.10gb.me`), `none`
  ignores MIG devices (a MIG-enabled GPU is not a full GPU: nothing).
- Bottlerocket configures the plugin from its own settings instead (`settings.kubelet-device-plugins.nvidia`:
  `device-sharing-strategy = "time-slicing"` with `time-slicing.replicas`, `rename-by-default` and
  `fail-requests-greater-than-one` — both true unless set —, or `device-partitioning-strategy = "mig"` with
  `mig.profile` per GPU, `a100.40gb = "1g.5gb"`, advertised with the `single` MIG strategy).
- `failRequestsGreaterThanOne`: the kubelet's admission of a pod asking for more than one of a shared
  resource fails (phase Failed, reason `UnexpectedAdmissionError`), as the plugin's Allocate refuses it.

It also writes the GPU Feature Discovery labels pods select on (`nvidia.com/gpu.count`, `.product`,
`.replicas`, `.memory`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

import gpu_autoscaler
from gpu_autoscaler.emulator.daemonsets import eligible
from gpu_autoscaler.emulator.kube_objects import CONFIGMAPS, NODES, format_quantity
from gpu_autoscaler.emulator.kube_scheduler import pod_requests
from gpu_autoscaler.emulator.kubelet import node_ready

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_apiserver import ApiServer
    from gpu_autoscaler.emulator.kubelet import Kubelets, SimulatedInstance
    from gpu_autoscaler.emulator.machines import Gpu

__all__ = [
    "CONFIG_LABEL",
    "DEVICE_PLUGIN_DELAY_SECONDS",
    "MIG_CONFIG_LABEL",
    "DevicePluginConfig",
    "NvidiaDevicePlugin",
    "OperandTolerations",
    "mig_layout",
    "shipped_config_map",
    "shipped_operator_values",
    "shipped_plugin_manifests",
]

log = logging.getLogger(__name__)

GPU = "nvidia.com/gpu"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
DEVICE_PLUGIN_DELAY_SECONDS = 10.0
"""From a Ready node to GPUs in its allocatable: the plugin's pod starts, validates the driver, registers."""
_GFD_LABELS = ("nvidia.com/gpu.count", "nvidia.com/gpu.product", "nvidia.com/gpu.replicas", "nvidia.com/gpu.memory")

# mig-parted's default config (deployments/systemd/config-default.yaml): for each GPU (model, nominal GiB),
# the MIG devices one GPU holds under `all-<profile>`. The GPUs are those EC2 instance types carry.
_MIG_PARTED: dict[tuple[str, int], dict[str, int]] = {
    ("A100", 40): {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
    ("A100", 80): {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1,
                   "7g.80gb": 1},
    ("H100", 80): {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1,
                   "7g.80gb": 1},
    ("H200", 141): {"1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1,
                    "7g.141gb": 1},
    ("B200", 180): {"1g.23gb": 7, "1g.23gb+me": 1, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1,
                    "7g.180gb": 1},
}


def _shipped(name: str) -> list[dict[str, Any]]:
    path = Path(gpu_autoscaler.__file__).resolve().parents[3] / "agent" / "deploy" / "gpu-operator" / name
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def shipped_plugin_manifests() -> list[dict[str, Any]]:
    """What the project ships for its users to apply before the operator (`agent/deploy/gpu-operator/
    nvidia-device-plugin-config.yaml`): the operator's Namespace, then the plugin ConfigMap, in the order
    `kubectl apply -f` creates them."""
    return _shipped("nvidia-device-plugin-config.yaml")


def shipped_config_map() -> dict[str, Any]:
    """The plugin ConfigMap the project ships for its users (`agent/deploy/gpu-operator/`), as they apply it."""
    return next(d for d in shipped_plugin_manifests() if d["kind"] == "ConfigMap")


def shipped_operator_values() -> dict[str, Any]:
    """The GPU Operator Helm values the project ships for its users (`agent/deploy/gpu-operator/values.yaml`)."""
    [values] = _shipped("values.yaml")
    return values


_CHART_OPERAND_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)
"""gpu-operator deployments/gpu-operator/values.yaml `daemonsets.tolerations` (and each operand's own manifest,
assets/state-device-plugin/0500_daemonset.yaml, which an empty list leaves in place)."""
_CHART_NFD_WORKER_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "node-role.kubernetes.io/control-plane", "operator": "Equal", "value": "", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)
"""gpu-operator deployments/gpu-operator/values.yaml `node-feature-discovery.worker.tolerations`."""


@dataclass(frozen=True)
class OperandTolerations:
    """Tolerations of the GPU Operator's pods a node's GPUs wait for: the operand DaemonSets' and the NFD worker's."""

    operands: tuple[Mapping[str, Any], ...] = _CHART_OPERAND_TOLERATIONS
    nfd_worker: tuple[Mapping[str, Any], ...] = _CHART_NFD_WORKER_TOLERATIONS

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> OperandTolerations:
        """As Helm merges the user's values over the chart's: a list given replaces the chart's whole. The operator
        applies `daemonsets.tolerations` only when non-empty (object_controls.go), so an empty one keeps the
        operands' own."""
        operands = (values.get("daemonsets") or {}).get("tolerations") or _CHART_OPERAND_TOLERATIONS
        worker = (values.get("node-feature-discovery") or {}).get("worker") or {}
        nfd = (worker["tolerations"] or ()) if "tolerations" in worker else _CHART_NFD_WORKER_TOLERATIONS
        return cls(operands=tuple(operands), nfd_worker=tuple(nfd))

    def run_on(self, node: Mapping[str, Any]) -> bool:
        """Whether the DaemonSet controller places both the NFD worker and the operands on `node`."""
        return all(eligible({"spec": {"tolerations": list(t)}}, node) for t in (self.nfd_worker, self.operands))


def _mig_gpu(gpu: Gpu) -> tuple[str, int] | None:
    """The mig-parted entry of a GPU: same model, nominal memory within 10 % of what EC2 reports."""
    for model, gib in _MIG_PARTED:
        if gpu.name.upper() == model and abs(gpu.memory_mib - gib * 1024) <= 0.1 * gib * 1024:
            return model, gib
    return None


def mig_layout(gpu: Gpu, config_name: str) -> dict[str, int] | None:
    """MIG devices per GPU that mig-parted makes of `all-<profile>` on this GPU; {} for `all-disabled`;
    None when the config does not exist for this GPU (the MIG manager fails)."""
    if config_name == "all-disabled":
        return {}
    if not config_name.startswith("all-"):
        return None
    key = _mig_gpu(gpu)
    if key is None:
        return None
    profile = config_name.removeprefix("all-")
    profile = profile[: -len(".me")] + "+me" if profile.endswith(".me") else profile
    count = _MIG_PARTED[key].get(profile)
    return {profile: count} if count else None


def _mixed_resource(profile: str) -> str:
    """The `mixed` strategy's name of a MIG device: k8s-device-plugin internal/rm/rm.go, AddDefaultResourcesToConfig,
    `strings.ReplaceAll("mig-"+p.String(), "+", ".")` in the `nvidia.com` domain (`mig-1g.10gb.me`)."""
    return "nvidia.com/" + ("mig-" + profile).replace("+", ".")


def _replicas(value: object) -> int:
    """A time-sliced resource's replicas as the plugin reads them (api/config/v1/replicas.go, ReplicatedResource
    UnmarshalJSON): an integer, at least 2."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"replicas {value!r} is not an integer")
    if value < 2:
        raise ValueError("number of replicas must be >= 2")
    return value


@dataclass(frozen=True)
class DevicePluginConfig:
    """One plugin config file (`version: v1`)."""

    mig_strategy: str = "none"
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    replicas: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    """Time-sliced resource → (replicas, rename)."""

    @classmethod
    def parse(cls, text: str) -> DevicePluginConfig:
        document = yaml.safe_load(text) or {}
        if document.get("version") != "v1":
            raise ValueError(f"unsupported config version {document.get('version')!r}")
        flags = document.get("flags") or {}
        strategy = flags.get("migStrategy", "none")
        if strategy not in ("none", "single", "mixed"):
            raise ValueError(f"unknown migStrategy {strategy!r}")
        slicing = (document.get("sharing") or {}).get("timeSlicing") or {}
        replicas = {}
        for resource in slicing.get("resources") or ():
            if "replicas" not in resource:
                raise ValueError("no replicas specified")
            replicas[str(resource["name"])] = (_replicas(resource["replicas"]), resource.get("rename"))
        return cls(mig_strategy=strategy, rename_by_default=bool(slicing.get("renameByDefault", False)),
                   fail_requests_greater_than_one=bool(slicing.get("failRequestsGreaterThanOne", False)),
                   replicas=replicas)


class NvidiaDevicePlugin:
    """The device plugin DaemonSet of every GPU node; `reconcile` advertises what is due."""

    def __init__(
        self, api: ApiServer, clock: Clock, kubelets: Kubelets, *, delay: timedelta = timedelta(0),
        config_map: tuple[str, str] = ("gpu-operator", "nvidia-device-plugin-config"),
        default_config: str | None = "default", startup_taints: tuple[str, ...] = (),
        tolerations: OperandTolerations | None = None,
    ) -> None:
        """`config_map`: (namespace, name) of the plugin's configs; `default_config`: the key used when the node
        has no config label; `startup_taints`: taint keys the plugin's readiness removes; `tolerations`: the GPU
        Operator's, from the values the project ships when not given."""
        self._api = api
        self._clock = clock
        self._kubelets = kubelets
        self.delay = delay
        self.config_map = config_map
        self.default_config = default_config
        self.startup_taints = startup_taints
        self.tolerations = tolerations or OperandTolerations.from_values(shipped_operator_values())
        self._lock = threading.Lock()
        self._started: set[str] = set()
        self._untolerated: set[str] = set()
        """Nodes due whose taints keep the operator's pods off: waiting for a change of the Node, not for time."""
        self._one_each: dict[str, set[str]] = {}
        """Node → shared resources of which a container may get only one (`failRequestsGreaterThanOne`)."""
        kubelets.admission.append(self.admit)

    def admit(self, pod: Mapping[str, Any], node_name: str) -> str | None:
        """The plugin's Allocate as the kubelet's admission sees it: None, or why the pod cannot start."""
        with self._lock:
            limited = self._one_each.get(node_name, set())
        if not limited:
            return None
        requests = pod_requests(pod)
        for resource in sorted(limited):
            if requests.get(resource, 0) > 1:
                return (f"Allocate failed due to rpc error: code = Unknown desc = request for '{resource}: "
                        f"{requests[resource]}' too large: maximum request size for shared resources is 1")
        return None

    def next_due(self) -> datetime | None:
        with self._lock:
            settled = self._started | self._untolerated
        return min((at + self.delay for inst, at in self._kubelets.running()
                    if inst.gpu is not None and inst.name not in settled), default=None)

    def reconcile(self) -> list[str]:
        """Advertise on every GPU node whose plugin runs by now; returns the nodes whose resources changed."""
        now = self._clock.now()
        changed = []
        for instance, registered in self._kubelets.running():
            if instance.gpu is None or now < registered + self.delay:
                continue
            if not self._runs_on(instance):
                continue
            with self._lock:
                self._started.add(instance.name)
            if self._advertise(instance):
                changed.append(instance.name)
        return changed

    def _runs_on(self, instance: SimulatedInstance) -> bool:
        """Whether the plugin runs on the node: already started, a Bottlerocket host service, or the node is Ready and
        the GPU Operator's pods tolerate its taints now."""
        with self._lock:
            if instance.name in self._started:
                return True
        if instance.device_plugin is not None:
            return True
        node = self._api.store.find(NODES, "", instance.name)
        runs = node is not None and node_ready(node) and self.tolerations.run_on(node)
        with self._lock:
            (self._started if runs else self._untolerated).add(instance.name)
            if runs:
                self._untolerated.discard(instance.name)
        if not runs:
            log.debug("device plugin: %s is not Ready, or the GPU Operator's DaemonSets do not tolerate its taints",
                      instance.name)
        return runs

    # What one node advertises

    def _advertise(self, instance: SimulatedInstance) -> bool:
        store = self._api.store
        with store.lock:
            node = store.find(NODES, "", instance.name)
            if node is None:
                return False
            labels = dict(node["metadata"].get("labels") or {})
            resources, extra_labels, one_each = self._resources(instance, labels)
            with self._lock:
                self._one_each[instance.name] = one_each

            def change(current: dict[str, Any]) -> dict[str, Any]:
                status = current.setdefault("status", {})
                for key in ("capacity", "allocatable"):
                    values = {k: v for k, v in (status.get(key) or {}).items() if not k.startswith("nvidia.com/")}
                    values.update({name: format_quantity(name, count) for name, count in resources.items()})
                    status[key] = values
                metadata = current["metadata"]
                kept = {k: v for k, v in (metadata.get("labels") or {}).items()
                        if k not in _GFD_LABELS and k != MIG_STATE_LABEL}
                metadata["labels"] = {**kept, **extra_labels}
                spec = current.setdefault("spec", {})
                if spec.get("taints"):
                    spec["taints"] = [t for t in spec["taints"] if t.get("key") not in self.startup_taints]
                    if not spec["taints"]:
                        del spec["taints"]
                return current

            before = node.get("status", {}).get("allocatable")
            after = store.update(NODES, "", instance.name, change)
            return before != after.get("status", {}).get("allocatable")

    def _resources(self, instance: SimulatedInstance, labels: dict[str, str],
                   ) -> tuple[dict[str, int], dict[str, str], set[str]]:
        gpu = instance.gpu
        assert gpu is not None
        out_labels = {"nvidia.com/gpu.count": str(gpu.count), "nvidia.com/gpu.product": gpu.name.replace(" ", "-"),
                      "nvidia.com/gpu.memory": str(gpu.memory_mib)}
        if instance.device_plugin is not None:
            try:
                config, layout = self._bottlerocket(instance)
            except ValueError as error:
                log.warning("device plugin: Bottlerocket's config is invalid (%s); the plugin does not start", error)
                return {}, out_labels, set()
        else:
            found = self._config(labels)
            if found is None:
                return {}, out_labels, set()
            config = found
            layout = None
            if labels.get(MIG_CONFIG_LABEL):
                layout = mig_layout(gpu, labels[MIG_CONFIG_LABEL])
                out_labels[MIG_STATE_LABEL] = "success" if layout is not None else "failed"
                if layout is None:
                    log.warning("MIG manager: no config %r for %s", labels[MIG_CONFIG_LABEL], gpu.name)
        advertised: dict[str, int] = {}
        if layout:
            if config.mig_strategy == "single":
                advertised[GPU] = gpu.count * sum(layout.values())
            elif config.mig_strategy == "mixed":
                for profile, count in layout.items():
                    advertised[_mixed_resource(profile)] = gpu.count * count
        else:
            advertised[GPU] = gpu.count
        out: dict[str, int] = {}
        one_each: set[str] = set()
        for name, count in advertised.items():
            replicas, rename = config.replicas.get(name, (1, None))
            if replicas > 1:
                name = rename or (f"{name}.shared" if config.rename_by_default else name)
                out_labels["nvidia.com/gpu.replicas"] = str(replicas)
                out_labels["nvidia.com/gpu.product"] += "-SHARED"
                if config.fail_requests_greater_than_one:
                    one_each.add(name)
            out[name] = count * replicas
        return out, out_labels, one_each

    def _config(self, labels: dict[str, str]) -> DevicePluginConfig | None:
        namespace, name = self.config_map
        config_map = self._api.store.find(CONFIGMAPS, namespace, name)
        if config_map is None:
            return DevicePluginConfig()  # deployed without a config: the plugin's defaults
        data = config_map.get("data") or {}
        key = labels.get(CONFIG_LABEL) or self.default_config
        if key is None or (key not in data and CONFIG_LABEL not in labels and len(data) == 1):
            key = next(iter(data), None)  # the "single" fallback strategy
        if key not in data:
            log.warning("device plugin: no config %r in ConfigMap %s/%s; the plugin does not start",
                        key, namespace, name)
            return None
        try:
            return DevicePluginConfig.parse(data[key])
        except (ValueError, KeyError, TypeError, yaml.YAMLError) as error:
            log.warning("device plugin: config %r is invalid (%s); the plugin does not start", key, error)
            return None

    @staticmethod
    def _bottlerocket(instance: SimulatedInstance) -> tuple[DevicePluginConfig, dict[str, int] | None]:
        """Bottlerocket's plugin config (bottlerocket-core-kit `nvidia-k8s-device-plugin-conf.in`: MIG means the
        `single` strategy) and its MIG manager (`nvidia-migmanager`: a known GPU is named `a100.40gb`,
        `a100.80gb`, `h100.80gb`, `h200.141gb` or `b200.180gb`; the value is a profile or a number of slices;
        a GPU with no entry gets one slice). The settings become the plugin's config file, which the plugin reads
        as any other: ValueError where it would refuse it (time-slicing replicas below 2)."""
        settings = instance.device_plugin
        gpu = instance.gpu
        assert settings is not None and gpu is not None
        layout = None
        if settings.partitioning_strategy == "mig":
            known = _mig_gpu(gpu)
            if known is not None:
                wanted = settings.mig_profiles.get(f"{known[0].lower()}.{known[1]}gb", "1")
                profiles = _MIG_PARTED[known]
                if wanted.isdigit():
                    matching = [p for p, n in profiles.items() if n == int(wanted) and "+" not in p]
                    wanted = max(matching, key=lambda p: int(p.split("g.", 1)[0]), default=wanted)
                layout = mig_layout(gpu, "all-" + wanted.replace("+", "."))
        replicas: dict[str, tuple[int, str | None]] = {}
        if settings.sharing_strategy == "time-slicing":
            replicas[GPU] = (_replicas(settings.replicas), None)
        strategy = "single" if settings.partitioning_strategy == "mig" else "none"
        return DevicePluginConfig(mig_strategy=strategy, rename_by_default=settings.rename_by_default,
                                  fail_requests_greater_than_one=settings.fail_requests_greater_than_one,
                                  replicas=replicas), layout

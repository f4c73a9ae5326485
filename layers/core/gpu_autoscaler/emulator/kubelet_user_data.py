"""What a node's bootstrap reads from its EC2 user data: the kubelet's labels, taints and settings.

Written from the two formats' documentation, not from the code that renders them:

- AL2023 (awslabs/amazon-eks-ami, nodeadm, "NodeConfig" API reference `node.eks.aws/v1alpha1`): the user
  data is a MIME multipart document; every part of type `application/node.eks.aws` is a YAML `NodeConfig`,
  and nodeadm merges them in order. `spec.kubelet.config` is merged into the KubeletConfiguration
  (`maxPods`, `kubeReserved`, `systemReserved`, `evictionHard`, `registerWithTaints`…), `spec.kubelet.flags`
  are passed to the kubelet as command-line flags (`--node-labels=k=v,…`, `--register-with-taints=k=v:E,…`,
  `--max-pods`). A part of another type (a shell script) is run by cloud-init and ignored here.
- Bottlerocket (bottlerocket.dev, "settings.kubernetes" and "settings.kubelet-device-plugins"): TOML whose
  `settings.kubernetes.node-labels` table holds the labels, `node-taints` maps a key to `value:Effect`
  strings, `max-pods`, `kube-reserved`, `system-reserved`, `eviction-hard` and the NVIDIA device plugin's
  `settings.kubelet-device-plugins.nvidia.*` settings.

The kubelet registers the Node with what it reads, and refuses to start with labels the NodeRestriction
admission plugin forbids it (kubernetes.io docs, "Using Node Authorization" / "NodeRestriction", and the
kubelet's `--node-labels` help): in the `kubernetes.io` and `k8s.io` namespaces only the `kubelet.kubernetes.io`
and `node.kubernetes.io` prefixes and the listed well-known labels. It refuses as well labels and taints that are
not Kubernetes syntax (kubernetes `cmd/kubelet/app/options/options.go` `ValidateKubeletFlags`: "invalid node
labels"; `pkg/util/taints` `ParseTaints` behind `--register-with-taints`: "invalid taint key/value", "duplicated
taints with the same key and effect"), with apimachinery's `IsQualifiedName` and `IsValidLabelValue`
(`k8s.io/apimachinery/pkg/util/validation/validation.go`). Bottlerocket's settings model refuses the same
(`KubernetesLabelKey`, `KubernetesLabelValue`), and the API server would refuse such a Node at registration.
"""

from __future__ import annotations

import email
import email.policy
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = ["BootstrapError", "DevicePluginSettings", "KubeletSettings", "kubelet_may_register", "read_user_data"]

_NODEADM_TYPE = "application/node.eks.aws"
_WELL_KNOWN_ALLOWED = frozenset({
    "kubernetes.io/hostname", "kubernetes.io/arch", "kubernetes.io/os",
    "beta.kubernetes.io/instance-type", "beta.kubernetes.io/arch", "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region", "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region", "topology.kubernetes.io/zone", "node.kubernetes.io/instance-type",
})
"""The kubelet's `--node-labels` help: the only `kubernetes.io`/`k8s.io` keys it may set outside its own prefixes."""
_ALLOWED_PREFIXES = ("kubelet.kubernetes.io", "node.kubernetes.io")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
"""apimachinery `qualifiedNameFmt`; a label value is the same, or empty (`labelValueFmt`)."""
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class BootstrapError(ValueError):
    """The node cannot join: unreadable user data, or settings the kubelet refuses (it exits, no Node appears)."""


@dataclass(frozen=True)
class DevicePluginSettings:
    """Bottlerocket's `settings.kubelet-device-plugins.nvidia`: the plugin is configured by the OS, not a ConfigMap."""

    sharing_strategy: str = "none"
    """`device-sharing-strategy`: `none`, `time-slicing` or `mps`."""
    replicas: int = 2
    rename_by_default: bool = True
    fail_requests_greater_than_one: bool = True
    partitioning_strategy: str = "none"
    """`device-partitioning-strategy`: `none` or `mig`."""
    mig_profiles: dict[str, str] = field(default_factory=dict)
    """`mig.profile`: GPU (`a100.40gb`) → the profile its GPUs are partitioned into."""


@dataclass(frozen=True)
class KubeletSettings:
    """What the kubelet runs with on this node, as found in the user data."""

    os_family: str
    """`AL2023` or `Bottlerocket`."""
    cluster_name: str = ""
    api_server: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()
    max_pods: int | None = None
    kube_reserved: dict[str, str] | None = None
    system_reserved: dict[str, str] = field(default_factory=dict)
    eviction_hard: dict[str, str] | None = None
    device_plugin: DevicePluginSettings | None = None
    """Only Bottlerocket configures the device plugin from user data."""


def kubelet_may_register(key: str) -> bool:
    """NodeRestriction: may a kubelet register its Node with this label key?"""
    prefix, _, _ = key.rpartition("/")
    if not any(prefix == ns or prefix.endswith("." + ns) for ns in ("kubernetes.io", "k8s.io")):
        return True
    return key in _WELL_KNOWN_ALLOWED or any(prefix == p or prefix.endswith("." + p) for p in _ALLOWED_PREFIXES)


def read_user_data(user_data: str) -> KubeletSettings:
    """The kubelet settings a node boots with; `BootstrapError` when it could not join with them."""
    text = user_data.lstrip()
    if text.startswith("MIME-Version") or text.lower().startswith("content-type"):
        settings = _nodeadm(text)
    elif text.startswith("[settings"):
        settings = _bottlerocket(text)
    else:
        raise BootstrapError("user data is neither a nodeadm MIME document nor Bottlerocket TOML settings")
    refused = sorted(k for k in settings.labels if not kubelet_may_register(k))
    if refused:
        raise BootstrapError(
            f"unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: {refused}; "
            "--node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix "
            f"({', '.join(_ALLOWED_PREFIXES)}) or be in the specifically allowed set")
    invalid = [f"'{k}' - {', '.join(errors)}" for k, v in settings.labels.items()
               if (errors := _qualified_name_errors(k) + _label_value_errors(v))]
    if invalid:
        raise BootstrapError(f"invalid node labels: {'; '.join(invalid)}")
    _check_taints(settings.taints)
    return settings


def _qualified_name_errors(name: str) -> list[str]:
    """apimachinery `validation.IsQualifiedName`: `[prefix/]name`, prefix a DNS-1123 subdomain (≤ 253)."""
    parts = name.split("/")
    if len(parts) == 1:
        prefix, short = "", parts[0]
    elif len(parts) == 2:
        prefix, short = parts
        if not prefix:
            return ["prefix part must be non-empty"]
        if len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix):
            return ["prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                    "'-' or '.', and must start and end with an alphanumeric character"]
    else:
        return ["a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                "with an alphanumeric character with an optional DNS subdomain prefix and '/'"]
    if not short:
        return ["name part must be non-empty"]
    errors = ["name part must be no more than 63 characters"] if len(short) > 63 else []
    if not _QUALIFIED_NAME_PART.match(short):
        errors.append("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                      "with an alphanumeric character")
    return errors


def _label_value_errors(value: str) -> list[str]:
    """apimachinery `validation.IsValidLabelValue`."""
    errors = ["must be no more than 63 characters"] if len(value) > 63 else []
    if value and not _QUALIFIED_NAME_PART.match(value):
        errors.append("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                      "and must start and end with an alphanumeric character")
    return errors


def _check_taints(taints: tuple[dict[str, str], ...]) -> None:
    """kubernetes `pkg/util/taints` `ParseTaints`/`parseTaint`, as `--register-with-taints` runs them."""
    seen: set[tuple[str, str]] = set()
    for taint in taints:
        key, value, effect = taint["key"], taint.get("value", ""), taint["effect"]
        if errors := _qualified_name_errors(key):
            raise BootstrapError(f"invalid taint key: {key}, {'; '.join(errors)}")
        if value and (errors := _label_value_errors(value)):
            raise BootstrapError(f"invalid taint value: {value}, {'; '.join(errors)}")
        if (key, effect) in seen:
            raise BootstrapError(f"duplicated taints with the same key and effect: {key}={value}:{effect}")
        seen.add((key, effect))


# AL2023: nodeadm


def _nodeadm(text: str) -> KubeletSettings:
    message = email.message_from_string(text, policy=email.policy.default)
    documents: list[dict[str, Any]] = []
    for part in message.walk():
        if part.get_content_type() != _NODEADM_TYPE:
            continue
        payload = part.get_payload(decode=True)
        body = payload.decode() if isinstance(payload, bytes) else str(part.get_payload())
        try:
            documents += [d for d in yaml.safe_load_all(body) if isinstance(d, dict)]
        except yaml.YAMLError as error:
            raise BootstrapError(f"nodeadm: the NodeConfig is not valid YAML: {error}") from None
    configs = [d for d in documents if d.get("kind") == "NodeConfig"]
    if not configs:
        raise BootstrapError("nodeadm: no NodeConfig in the user data (a part of type application/node.eks.aws)")
    cluster: dict[str, Any] = {}
    config: dict[str, Any] = {}
    flags: list[str] = []
    for document in configs:  # nodeadm merges the NodeConfigs it finds, in order
        spec = document.get("spec") or {}
        cluster.update(spec.get("cluster") or {})
        kubelet = spec.get("kubelet") or {}
        config.update(kubelet.get("config") or {})
        flags += [str(f) for f in kubelet.get("flags") or ()]
    if not cluster.get("name") or not cluster.get("apiServerEndpoint"):
        raise BootstrapError("nodeadm: spec.cluster.name and spec.cluster.apiServerEndpoint are required")
    labels: dict[str, str] = {}
    taints: list[dict[str, str]] = [_taint_object(t) for t in config.get("registerWithTaints") or ()]
    max_pods = config.get("maxPods")
    for flag in flags:
        name, _, value = flag.partition("=")
        if name == "--node-labels":
            labels.update(_pairs(value))
        elif name == "--register-with-taints":
            taints += [_taint_flag(t) for t in value.split(",") if t]
        elif name == "--max-pods":
            max_pods = value
    return KubeletSettings(
        os_family="AL2023", cluster_name=str(cluster["name"]), api_server=str(cluster["apiServerEndpoint"]),
        labels=labels, taints=tuple(taints), max_pods=_int(max_pods, "maxPods"),
        kube_reserved=_strings(config.get("kubeReserved")),
        system_reserved=_strings(config.get("systemReserved")) or {},
        eviction_hard=_strings(config.get("evictionHard")),
    )


def _pairs(value: str) -> dict[str, str]:
    out = {}
    for pair in value.split(","):
        if not pair:
            continue
        key, sep, label = pair.partition("=")
        if not sep:
            raise BootstrapError(f"--node-labels: {pair!r} is not key=value")
        out[key] = label
    return out


def _taint_flag(text: str) -> dict[str, str]:
    """`key=value:Effect` or `key:Effect`, as `--register-with-taints` takes them."""
    rest, sep, effect = text.rpartition(":")
    if not sep or effect not in _EFFECTS:
        raise BootstrapError(f"--register-with-taints: invalid taint spec {text!r}")
    key, _, value = rest.partition("=")
    return {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}


def _taint_object(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict) or not raw.get("key") or raw.get("effect") not in _EFFECTS:
        raise BootstrapError(f"registerWithTaints: invalid taint {raw!r}")
    return {k: str(v) for k, v in raw.items() if k in ("key", "value", "effect") and v}


# Bottlerocket


def _bottlerocket(text: str) -> KubeletSettings:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise BootstrapError(f"bottlerocket: the settings are not valid TOML: {error}") from None
    settings = document.get("settings") or {}
    kubernetes = settings.get("kubernetes") or {}
    if not kubernetes.get("cluster-name") or not kubernetes.get("api-server"):
        raise BootstrapError("bottlerocket: settings.kubernetes.cluster-name and api-server are required")
    taints = []
    for key, values in (kubernetes.get("node-taints") or {}).items():
        for entry in values if isinstance(values, list) else [values]:
            value, sep, effect = str(entry).rpartition(":")
            if not sep or effect not in _EFFECTS:
                raise BootstrapError(f"bottlerocket: node-taints.{key}: invalid taint {entry!r}")
            taints.append({"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect})
    return KubeletSettings(
        os_family="Bottlerocket", cluster_name=str(kubernetes["cluster-name"]),
        api_server=str(kubernetes["api-server"]),
        labels={str(k): str(v) for k, v in (kubernetes.get("node-labels") or {}).items()}, taints=tuple(taints),
        max_pods=_int(kubernetes.get("max-pods"), "max-pods"), kube_reserved=_strings(kubernetes.get("kube-reserved")),
        system_reserved=_strings(kubernetes.get("system-reserved")) or {},
        eviction_hard=_strings(kubernetes.get("eviction-hard")),
        device_plugin=_bottlerocket_device_plugin((settings.get("kubelet-device-plugins") or {}).get("nvidia") or {}),
    )


def _bottlerocket_device_plugin(nvidia: dict[str, Any]) -> DevicePluginSettings:
    """With Bottlerocket's own defaults (bottlerocket-core-kit, `nvidia-k8s-device-plugin-conf.in`): a time-sliced
    GPU is renamed `nvidia.com/gpu.shared` and a request for more than one fails unless the settings say otherwise;
    two replicas when none are given."""
    slicing = nvidia.get("time-slicing") or {}
    return DevicePluginSettings(
        sharing_strategy=str(nvidia.get("device-sharing-strategy", "none")),
        replicas=_int(slicing.get("replicas"), "time-slicing.replicas") or 2,
        rename_by_default=bool(slicing.get("rename-by-default", True)),
        fail_requests_greater_than_one=bool(slicing.get("fail-requests-greater-than-one", True)),
        partitioning_strategy=str(nvidia.get("device-partitioning-strategy", "none")),
        mig_profiles={str(k): str(v) for k, v in ((nvidia.get("mig") or {}).get("profile") or {}).items()},
    )


def _int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BootstrapError(f"{name}: {value!r} is not an integer") from None


def _strings(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BootstrapError(f"expected a map of quantities, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}

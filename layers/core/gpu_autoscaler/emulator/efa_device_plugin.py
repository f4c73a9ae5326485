"""A simulated AWS EFA Kubernetes device plugin: the `vpc.amazonaws.com/efa` an EFA node advertises.

Written from the EKS User Guide (ml/node-efa.adoc: "The EFA Kubernetes device plugin detects and advertises EFA
interfaces as allocatable resources to Kubernetes. An application can consume the extended resource type
`vpc.amazonaws.com/efa`") and the eks-charts chart that installs it (stable/aws-efa-k8s-device-plugin), never from
the project's packer:

- It advertises one `vpc.amazonaws.com/efa` per EFA device of the instance: the interfaces of type `efa` or
  `efa-only` EC2 launched it with (DescribeInstances, `machines.Machine.efa_devices`). A node without one advertises
  nothing.
- It is a DaemonSet, so it runs only where its pod may: the chart's pod template tolerates `CriticalAddonsOnly` and
  whatever its values' `tolerations` add (`[]` by default), the DaemonSet controller adds the not-ready,
  unreachable, pressure and unschedulable tolerations (`daemonsets.eligible`), and the node's other NoSchedule and
  NoExecute taints keep it off. Its pod starts once the node is Ready and registers `delay` after the Node did; once
  running it stays (a taint added later does not evict a daemon pod). Its node affinity (the chart's
  `supportedInstanceLabels`, "EFA supported instances") admits the types that can have EFAs at all, which are the
  only ones it would find any on. The values are those the project ships for its users
  (`agent/deploy/efa-device-plugin/values.yaml`), over the chart's defaults.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

import gpu_autoscaler
from gpu_autoscaler.emulator.daemonsets import eligible
from gpu_autoscaler.emulator.kube_objects import NODES, format_quantity
from gpu_autoscaler.emulator.kubelet import node_ready

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.emulator.kube_apiserver import ApiServer
    from gpu_autoscaler.emulator.kubelet import Kubelets, SimulatedInstance

__all__ = ["EFA", "EfaDevicePlugin", "chart_tolerations", "shipped_values"]

log = logging.getLogger(__name__)

EFA = "vpc.amazonaws.com/efa"
_TEMPLATE_TOLERATIONS: tuple[dict[str, str], ...] = ({"key": "CriticalAddonsOnly", "operator": "Exists"},)
"""The chart's templates/daemonset.yaml: these, then `.Values.tolerations`."""


def shipped_values() -> dict[str, Any]:
    """The chart's Helm values the project ships for its users (`agent/deploy/efa-device-plugin/values.yaml`)."""
    deploy = Path(gpu_autoscaler.__file__).resolve().parents[3] / "agent" / "deploy"
    path = deploy / "efa-device-plugin" / "values.yaml"
    values: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    return values


def chart_tolerations(values: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """The plugin pods' tolerations for these Helm values (a list given replaces the chart's `[]` whole)."""
    return (*_TEMPLATE_TOLERATIONS, *(values.get("tolerations") or ()))


class EfaDevicePlugin:
    """The EFA device plugin DaemonSet; `reconcile` advertises what is due."""

    def __init__(self, api: ApiServer, clock: Clock, kubelets: Kubelets, *, delay: timedelta = timedelta(0),
                 values: Mapping[str, Any] | None = None) -> None:
        """`values`: the Helm values the chart was installed with; the ones the project ships when not given."""
        self._api = api
        self._clock = clock
        self._kubelets = kubelets
        self.delay = delay
        self.tolerations = chart_tolerations(shipped_values() if values is None else values)
        self._lock = threading.Lock()
        self._started: set[str] = set()
        self._untolerated: set[str] = set()
        """Nodes due whose taints keep the plugin's pod off: waiting for a change of the Node, not for time."""

    def next_due(self) -> datetime | None:
        with self._lock:
            settled = self._started | self._untolerated
        return min((at + self.delay for inst, at in self._kubelets.running()
                    if inst.efa_devices and inst.name not in settled), default=None)

    def reconcile(self) -> list[str]:
        """Advertise on every EFA node whose plugin runs by now; returns the nodes whose resources changed."""
        now = self._clock.now()
        changed = []
        for instance, registered in self._kubelets.running():
            if not instance.efa_devices or now < registered + self.delay or not self._runs_on(instance):
                continue
            if self._advertise(instance):
                changed.append(instance.name)
        return changed

    def _runs_on(self, instance: SimulatedInstance) -> bool:
        with self._lock:
            if instance.name in self._started:
                return True
        node = self._api.store.find(NODES, "", instance.name)
        runs = node is not None and node_ready(node) and eligible(
            {"spec": {"tolerations": list(self.tolerations)}}, node)
        with self._lock:
            (self._started if runs else self._untolerated).add(instance.name)
            if runs:
                self._untolerated.discard(instance.name)
        if not runs:
            log.debug("EFA device plugin: %s is not Ready, or its pod does not tolerate the node's taints",
                      instance.name)
        return runs

    def _advertise(self, instance: SimulatedInstance) -> bool:
        quantity = format_quantity(EFA, instance.efa_devices)

        def change(current: dict[str, Any]) -> dict[str, Any]:
            status = current.setdefault("status", {})
            for key in ("capacity", "allocatable"):
                status[key] = {**(status.get(key) or {}), EFA: quantity}
            return current

        store = self._api.store
        with store.lock:
            node = store.find(NODES, "", instance.name)
            if node is None or (node.get("status") or {}).get("allocatable", {}).get(EFA) == quantity:
                return False
            store.update(NODES, "", instance.name, change)
            return True

"""Where the agent's own pod lands, as shipped (kustomize Deployment and Helm chart), scheduled by the emulator's
kube-scheduler among a GPU node gpu-autoscaler launched, a system node and a Windows node.

The agent must stay off the nodes gpu-autoscaler launches: a pool's taints default to none, so such a node can be
untainted, and kube-scheduler's default scoring (NodeResourcesFit, LeastAllocated) prefers the emptiest, largest
node: a freshly launched GPU node. There the agent keeps the node from ever being empty (consolidation counts every
pod but DaemonSet and mirror pods), and each consolidation of the node evicts it.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from kubernetes import client

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.config import NodePool
from gpu_autoscaler.domain.user_data import node_setup
from gpu_autoscaler.emulator.kubelet import SimulatedInstance
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler.models.taints import Taint
from tests import kube_reads
from tests.conftest import ROOT
from tests.unit.agent.chart_render import Renderer

if TYPE_CHECKING:
    from collections.abc import Iterator

DEPLOY = ROOT / "agent" / "deploy"
CHART = DEPLOY / "chart"
GPU_NODE, SYSTEM_NODE, WINDOWS_NODE = "gpu-node", "system-node", "windows-node"


def _kustomize_pod_spec() -> dict[str, Any]:
    deployment = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def _chart_pod_spec(**overrides: Any) -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values.update(clusterName="ml-prod", queueUrl="https://sqs.us-east-1.amazonaws.com/1/q.fifo", **overrides)
    rendered = Renderer(CHART, copy.deepcopy(values)).render(CHART / "templates" / "deployment.yaml")
    spec: dict[str, Any] = next(d for d in yaml.safe_load_all(rendered) if d)["spec"]["template"]["spec"]
    return spec


SHIPPED = {"kustomize": _kustomize_pod_spec, "chart": _chart_pod_spec}


def _instance(name: str, *, cpu: str, memory: str, labels: dict[str, str], taints: tuple[Taint, ...] = (),
              gpus: int = 0) -> SimulatedInstance:
    quantities = {"cpu": cpu, "memory": memory, "pods": "58"}
    if gpus:
        quantities["nvidia.com/gpu"] = str(gpus)
    return SimulatedInstance(instance_id=f"i-{name}", instance_type="g5.12xlarge" if gpus else "m6i.large",
                             zone="us-east-1a", capacity=Resources.from_quantities(quantities), labels=labels,
                             taints=taints, node_name=name)


def _our_gpu_node() -> SimulatedInstance:
    """A node of a pool with no taints (the default), labelled as the fleet's user data registers it."""
    setup = node_setup(NodePool(name="gpu"), "on-demand", instance_type="g5.12xlarge")
    return _instance(GPU_NODE, cpu="48", memory="192Gi", gpus=4, labels=dict(setup.labels), taints=setup.taints)


def _system_node() -> SimulatedInstance:
    """A system node group's node, tainted as EKS Auto Mode's `system` pool is (CriticalAddonsOnly:NoSchedule)."""
    return _instance(SYSTEM_NODE, cpu="2", memory="8Gi", labels={"eks.amazonaws.com/nodegroup": "system"},
                     taints=(Taint(key="CriticalAddonsOnly", value="true", effect="NoSchedule"),))


def _windows_node() -> SimulatedInstance:
    return _instance(WINDOWS_NODE, cpu="16", memory="64Gi", labels={L.OS: "windows"})


@pytest.fixture
def kube() -> Iterator[LocalKubernetes]:
    clock = FixedClock(datetime(2026, 11, 29, 10, 0, tzinfo=UTC))
    with LocalKubernetes(clock=clock, run_controllers=False, boot_delay=timedelta(0)) as local:
        yield local


def _place(kube: LocalKubernetes, spec: dict[str, Any], *instances: SimulatedInstance) -> str | None:
    """The node the agent's pod is bound to (None: left pending)."""
    for instance in instances:
        kube.add_instance(instance)
    kube.reconcile()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-autoscaler-agent", "namespace": "default"},
           "spec": spec}
    with kube.client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod("default", client.V1Pod.model_validate(pod))
        kube.reconcile()
        return kube_reads.pod_spec(core.read_namespaced_pod("gpu-autoscaler-agent", "default")).node_name


@pytest.mark.parametrize("shipped", SHIPPED)
def test_the_agent_runs_on_a_tainted_system_node_not_on_a_gpu_node_gpu_autoscaler_launched(
    kube: LocalKubernetes, shipped: str,
) -> None:
    assert _place(kube, SHIPPED[shipped](), _our_gpu_node(), _system_node(), _windows_node()) == SYSTEM_NODE


@pytest.mark.parametrize("node", [_our_gpu_node, _windows_node])
@pytest.mark.parametrize("shipped", SHIPPED)
def test_the_agent_waits_rather_than_take_a_gpu_node_gpu_autoscaler_launched_or_a_windows_node(
    kube: LocalKubernetes, shipped: str, node: Any,
) -> None:
    """A Linux image never starts on a Windows node; EKS's Windows guide has Linux pods select `kubernetes.io/os:
    linux` in mixed clusters (EKS User Guide, clusters/windows-support.adoc), and EKS Windows nodes are untainted."""
    assert _place(kube, SHIPPED[shipped](), node()) is None


def _karpenter_system_node() -> SimulatedInstance:
    """A node of a Karpenter NodePool of the cluster's own (EKS Auto Mode's `system` pool is one): labelled
    `karpenter.sh/nodepool` as Karpenter labels its nodes, tainted CriticalAddonsOnly as Auto Mode's are."""
    return _instance(SYSTEM_NODE, cpu="2", memory="8Gi", labels={L.NODE_POOL: "system"},
                     taints=(Taint(key="CriticalAddonsOnly", value="true", effect="NoSchedule"),))


@pytest.mark.parametrize("shipped", SHIPPED)
def test_the_agent_runs_on_a_karpenter_system_node(kube: LocalKubernetes, shipped: str) -> None:
    """Only the nodes gpu-autoscaler launched are refused (their label `gpu-autoscaler/node-pool`, which every one
    carries), not every node a Karpenter NodePool made: on a cluster whose system nodes are Karpenter's (EKS Auto
    Mode) the agent refused them all (`karpenter.sh/nodepool DoesNotExist`) and stayed Pending."""
    assert _place(kube, SHIPPED[shipped](), _our_gpu_node(), _karpenter_system_node()) == SYSTEM_NODE


def test_the_charts_placement_is_the_users_to_change(kube: LocalKubernetes) -> None:
    """A cluster that wants the agent elsewhere sets `affinity` (here: none, and it may take our GPU node)."""
    spec = _chart_pod_spec(affinity={})
    assert _place(kube, spec, _our_gpu_node()) == GPU_NODE

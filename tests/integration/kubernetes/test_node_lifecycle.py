"""A stopped instance's Node stays, NotReady and tainted; only a terminated one's is deleted.

k8s.io/cloud-provider's node lifecycle controller: "If deleted, it deletes the node resource. If shutdown it applies
a shutdown taint" — and cloud-provider-aws says an instance no longer exists only when it is terminated
(`InstanceExistsByProviderID`), and is shut down when stopped (`InstanceShutdownByProviderID`). The stopped
instance's kubelet posts no status: kube-controller-manager's node lifecycle controller marks the Node's
conditions Unknown once `--node-monitor-grace-period` has passed and taints it unreachable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from tests.integration.kubernetes.conftest import make_instance

if TYPE_CHECKING:
    from collections.abc import Iterator

GRACE = timedelta(seconds=5)
SHUTDOWN = {"key": "node.cloudprovider.kubernetes.io/shutdown", "effect": "NoSchedule"}


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(datetime(2026, 11, 22, 10, 0, tzinfo=UTC))


@pytest.fixture
def kube(clock: FixedClock) -> Iterator[LocalKubernetes]:
    with LocalKubernetes(clock=clock, run_controllers=False, node_monitor_grace=GRACE) as local:
        local.add_instance(make_instance())
        local.reconcile()
        yield local


def node(kube: LocalKubernetes) -> dict[str, Any] | None:
    return next(iter(kube.objects("nodes")), None)


def ready(found: dict[str, Any]) -> str:
    return next(c["status"] for c in found["status"]["conditions"] if c["type"] == "Ready")


def taints(found: dict[str, Any]) -> list[dict[str, str]]:
    return [{"key": t["key"], "effect": t["effect"]} for t in found["spec"].get("taints") or ()]


def test_a_stopped_instances_node_stays_and_turns_unknown_and_tainted_after_the_grace(
        kube: LocalKubernetes, clock: FixedClock) -> None:
    assert kube.stop_instance("i-0aaa")
    kube.reconcile()
    found = node(kube)
    assert found is not None and ready(found) == "True"  # within the grace: nobody noticed yet
    clock.advance(GRACE)
    kube.reconcile()
    found = node(kube)
    assert found is not None and ready(found) == "Unknown"
    assert SHUTDOWN in taints(found)
    assert {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"} in taints(found)


def test_a_stopped_instance_started_again_is_ready_and_untainted(kube: LocalKubernetes, clock: FixedClock) -> None:
    kube.stop_instance("i-0aaa")
    clock.advance(GRACE)
    kube.reconcile()
    assert kube.restart_instance("i-0aaa")
    kube.reconcile()
    found = node(kube)
    assert found is not None and ready(found) == "True"
    assert [t for t in taints(found) if "unreachable" in t["key"] or "shutdown" in t["key"]] == []


def test_only_a_terminated_instances_node_is_deleted(kube: LocalKubernetes, clock: FixedClock) -> None:
    kube.stop_instance("i-0aaa")
    clock.advance(GRACE)
    kube.reconcile()
    assert kube.remove_instance("i-0aaa")
    assert node(kube) is None

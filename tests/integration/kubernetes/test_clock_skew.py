"""The API server's clock two minutes off the Lambdas' (issue 19, scenario 8): timestamps the API server writes
(`deletionTimestamp`, `creationTimestamp`, a pod's start) are compared with the drain's and consolidation's own
clock. The adapter reads the server's clock from the `Date` header of its answers and hands the domain those
timestamps on the caller's clock, so a pod still in its grace period is never taken for one stuck terminating
(which would let its node be terminated under it), nor a node made younger or older than it is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.drain import DrainAction, plan_drain
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from gpu_autoscaler.models.messages import DrainRequest
from tests.integration.kubernetes.conftest import functions_client, make_instance, make_pod, node_names

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


class _Ahead:
    """The caller's clock: the server's plus `skew` (a skew of −2 min: the server is two minutes ahead)."""

    def __init__(self, server: FixedClock, skew: timedelta) -> None:
        self.server, self.skew = server, skew

    def now(self) -> datetime:
        return self.server.now() + self.skew


@pytest.mark.parametrize("skew", [timedelta(minutes=2), timedelta(minutes=-2)])
def test_a_pod_in_its_grace_period_is_waited_for_and_ages_are_on_the_caller_s_clock(skew: timedelta) -> None:
    server_clock = FixedClock(NOW)
    local = _Ahead(server_clock, skew)
    with LocalKubernetes(cluster_name="ml-prod", clock=server_clock, run_controllers=False) as kube, \
            kube.client() as api:
        core, cluster = client.CoreV1Api(api), KubernetesCluster(functions_client(kube), clock=local)
        kube.add_instance(make_instance())
        kube.reconcile()
        node = node_names(core)[0]
        core.create_namespaced_pod("default", client.V1Pod.model_validate(make_pod("slow", node_name=node)))
        kube.reconcile()  # its kubelet starts it
        core.delete_namespaced_pod("slow", "default", grace_period_seconds=30)  # terminating for 30 s
        server_clock.advance(timedelta(seconds=5))

        [listed_node] = cluster.list_nodes()
        [pod] = cluster.list_pods(node)
        now = local.now()
        request = DrainRequest(cluster="ml-prod", node_name=node, reason="consolidation", deadline=now)
        step = plan_drain(request, listed_node, [pod], now)
        assert step.action is not DrainAction.FINISH, f"the node would go with its pod still terminating: {step}"
        assert pod.deletion_timestamp is not None
        assert abs(pod.deletion_timestamp - (now + timedelta(seconds=25))) <= timedelta(seconds=2)
        assert listed_node.created_at is not None
        assert abs((now - listed_node.created_at) - timedelta(seconds=5)) <= timedelta(seconds=2)

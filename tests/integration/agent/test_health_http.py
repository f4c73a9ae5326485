"""The agent's probes and metrics over HTTP, served as the agent starts the server (on every address of the pod)."""

from __future__ import annotations

import errno
import socket
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler_agent import health
from gpu_autoscaler_agent.health import HealthServer, Metrics

if TYPE_CHECKING:
    from collections.abc import Iterator


class Switches:
    healthy = True
    ready = False


@pytest.fixture
def served() -> Iterator[tuple[str, Switches, Metrics]]:
    switches, metrics = Switches(), Metrics()
    server = HealthServer(metrics, lambda: switches.healthy, lambda: switches.ready, port=0)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", switches, metrics
    finally:
        server.stop()


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_probes_follow_the_agent_state(served: tuple[str, Switches, Metrics]) -> None:
    base, switches, _ = served
    assert (status(base + "/healthz"), status(base + "/readyz")) == (200, 503)
    switches.ready = True
    switches.healthy = False
    assert (status(base + "/healthz"), status(base + "/readyz")) == (503, 200)
    assert status(base + "/nope") == 404


def test_metrics_are_scraped_as_prometheus_text(served: tuple[str, Switches, Metrics]) -> None:
    base, _, metrics = served
    metrics.inc("pods_sent_total", 2)
    with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "gpu_autoscaler_agent_pods_sent_total 2" in response.read().decode()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 on this machine")
@pytest.mark.parametrize("address", ["127.0.0.1", "[::1]"])
def test_the_probes_answer_on_the_pods_ipv4_and_ipv6_addresses(address: str) -> None:
    """On an EKS IPv6 cluster a pod has only an IPv6 address in `status.podIP` (EKS User Guide, IPv6 networking:
    "Pods and services are only assigned an IPv6 address"), and the kubelet's httpGet probes connect to the pod IP
    (HTTPGetAction.host "defaults to the pod IP"); on an IPv4 cluster, to its IPv4 address."""
    server = HealthServer(Metrics(), healthy=lambda: True, ready=lambda: True, port=0)
    server.start()
    try:
        assert status(f"http://{address}:{server.port}/healthz") == 200
    finally:
        server.stop()


def test_without_ipv6_the_probes_answer_on_ipv4(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel booted with `ipv6.disable=1` refuses IPv6 sockets (EAFNOSUPPORT): the agent listens on IPv4 alone."""

    def refuse(self: object) -> None:
        raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")

    monkeypatch.setattr(health._DualStackServer, "server_bind", refuse)
    server = HealthServer(Metrics(), healthy=lambda: True, ready=lambda: True, port=0)
    server.start()
    try:
        assert status(f"http://127.0.0.1:{server.port}/healthz") == 200
    finally:
        server.stop()


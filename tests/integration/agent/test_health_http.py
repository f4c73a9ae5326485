from __future__ import annotations

import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler_agent.health import HealthServer, Metrics

if TYPE_CHECKING:
    from collections.abc import Iterator


class Switches:
    healthy = True
    ready = False


@pytest.fixture
def served() -> Iterator[tuple[str, Switches, Metrics]]:
    switches, metrics = Switches(), Metrics()
    server = HealthServer(metrics, lambda: switches.healthy, lambda: switches.ready, port=0, host="127.0.0.1")
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

"""Probes and Prometheus metrics over plain HTTP (the standard library is enough for three paths).

/healthz answers whether the agent's loops are alive and turning (liveness: restart it if not);
/readyz whether the first list of pods is done (it has a complete view to report from);
/metrics the counters in Prometheus' text exposition format.

The server listens on every address of the pod, IPv6 and IPv4 alike: on an EKS IPv6 cluster the pod has only an
IPv6 address (EKS User Guide, IPv6 networking: "Pods and services are only assigned an IPv6 address"; the host-local
IPv4 address is for egress and "is not reported to the Kubernetes control plane"), and the kubelet's probes connect
to the pod IP (HTTPGetAction.host: "defaults to the pod IP"). A server bound to 0.0.0.0 alone was never reached
there, and its startup probe restarted the agent over and over.
"""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["HealthServer", "Metrics"]

log = logging.getLogger(__name__)

PREFIX = "gpu_autoscaler_agent_"

# name -> (type, help)
_FAMILIES = {
    "pods_seen_total": ("counter", "Pod objects observed from lists and watch events."),
    "pods_pending": ("gauge", "Pods currently unschedulable and reportable (GPU)."),
    "pods_invalid_total": ("counter", "Reportable pods that could not be turned into a valid document entry."),
    "pods_failed_total": ("counter", "Reportable pods skipped for now: a call to the API server failed (by reason)."),
    "pods_sent_total": ("counter", "Pod reports delivered to the queue (a pod counts once per message)."),
    "pods_dropped_total": ("counter", "Pod reports SQS refused by content (the pod is reported again next resync)."),
    "messages_sent_total": ("counter", "Messages accepted by the queue."),
    "send_failures_total": ("counter", "SendMessage attempts that failed (each is retried)."),
    "lag_seconds": ("gauge", "Age of the oldest pod report not yet accepted by the queue (0 when none waits)."),
    "report_latency_seconds": ("summary", "Time from a pod report being queued to its message being accepted."),
    "send_latency_seconds": ("summary", "Duration of each accepted SendMessage call (the queue's round trip)."),
    "resyncs_total": ("counter", "Periodic resyncs (every pending pod reported again)."),
    "relists_total": ("counter", "Full lists of pods (at start, and after a watch expired)."),
    "watch_restarts_total": ("counter", "Watches re-opened, by reason."),
}


class Metrics:
    """Thread-safe counters, gauges and summaries (sum and count), optionally labelled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values[(name, tuple(sorted(labels.items())))] = value

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            for suffix, amount in (("_sum", value), ("_count", 1.0)):
                key = (name + suffix, ())
                self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._values.get((name, tuple(sorted(labels.items()))), 0.0)

    def total(self, name: str) -> float:
        """Summed over every label set."""
        with self._lock:
            return sum(v for (n, _), v in self._values.items() if n == name)

    def render(self) -> str:
        with self._lock:
            values = dict(self._values)
        lines: list[str] = []
        for family, (kind, help_text) in _FAMILIES.items():
            lines.append(f"# HELP {PREFIX}{family} {help_text}")
            lines.append(f"# TYPE {PREFIX}{family} {kind}")
            names = (family + "_sum", family + "_count") if kind == "summary" else (family,)
            samples = [(n, labels, v) for (n, labels), v in sorted(values.items()) if n in names]
            if not samples and kind != "summary":
                samples = [(family, (), 0.0)]
            for name, labels, value in samples:
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(f"{PREFIX}{name}{{{label_text}}} {value:g}" if label_text else f"{PREFIX}{name} {value:g}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _DualStackServer(ThreadingHTTPServer):
    """An IPv6 socket that also takes IPv4 connections (as IPv4-mapped addresses), as the standard library's
    `python -m http.server` does (its DualStackServer): IPV6_V6ONLY off, whatever the host's default
    (net.ipv6.bindv6only)."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _listen(port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """On every address of the pod ("::", dual-stack), or on IPv4 alone where IPv6 is unavailable (a kernel booted
    with `ipv6.disable=1` refuses IPv6 sockets). A port in use fails on IPv4 too, with the same error."""
    try:
        return _DualStackServer(("::", port), handler)
    except OSError as error:
        log.warning("health: cannot listen on IPv6 (%s); listening on IPv4 only", error)
        return ThreadingHTTPServer(("0.0.0.0", port), handler)  # noqa: S104 - the kubelet probes the pod IP


class HealthServer:
    """Serves the probes and metrics on its own thread until stopped."""

    def __init__(
        self,
        metrics: Metrics,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        port: int = 8080,
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, str, str]]] = {
            "/healthz": lambda: _probe(healthy()),
            "/readyz": lambda: _probe(ready()),
            "/metrics": lambda: (200, "text/plain; version=0.0.4; charset=utf-8", metrics.render()),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
                route = routes.get(self.path.split("?", 1)[0])
                status, content_type, text = route() if route else (404, "text/plain", "not found\n")
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base signature
                log.debug("health: " + format, *args)

        self._server = _listen(port, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="agent-health", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _probe(ok: bool) -> tuple[int, str, str]:
    return (200, "text/plain", "ok\n") if ok else (503, "text/plain", "not ok\n")

"""The agent: a watcher thread, a dispatcher thread and the health server, started and stopped together.

In a cluster, `__main__` builds it from the environment. In-process (the emulator, the tests) it takes an
API client and an SQS client directly, and either runs continuously (`start`/`stop`) or is stepped
(`run_once`: list, report whatever is due, deliver, return).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from kubernetes import client
from kubernetes import config as kube_config

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.clock import SystemClock
from gpu_autoscaler_agent.claims import KubernetesClaims
from gpu_autoscaler_agent.dispatcher import Dispatcher
from gpu_autoscaler_agent.gangs import GangHold
from gpu_autoscaler_agent.health import HealthServer, Metrics
from gpu_autoscaler_agent.placement import KubernetesPlacement
from gpu_autoscaler_agent.podgroups import KubernetesPodGroups
from gpu_autoscaler_agent.selection import PodSelector
from gpu_autoscaler_agent.sender import Backoff, QueueSender
from gpu_autoscaler_agent.watcher import PodWatcher

if TYPE_CHECKING:
    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler_agent.settings import AgentSettings

__all__ = ["Agent", "kubernetes_api_client"]

log = logging.getLogger(__name__)

_STALL = timedelta(seconds=60)
"""The dispatcher ticks at least twice a second; a minute without a tick means it is stuck."""


def kubernetes_api_client(settings: AgentSettings) -> client.ApiClient:
    """An explicit URL taking no credentials (`kubectl proxy`, which adds its own), else the pod's service account,
    else the kubeconfig. An API server that authenticates (any real one, and the emulator's) treats a request
    without credentials as `system:anonymous` and refuses it."""
    if settings.kube_url:
        configuration = client.Configuration()
        configuration.host = settings.kube_url
        return client.ApiClient(configuration)
    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()
    return client.ApiClient()


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        api_client: client.ApiClient | None = None,
        sqs_client: Any = None,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        send_backoff: Backoff | None = None,
        watch_backoff: Backoff | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        api = api_client or kubernetes_api_client(settings)
        sqs = sqs_client or AwsClients(settings.region, settings.endpoint_url).client("sqs")
        self.dispatcher = Dispatcher(
            settings.cluster,
            QueueSender(sqs, settings.queue_url, settings.cluster),
            self.clock,
            self.metrics,
            resync=timedelta(seconds=settings.resync_seconds),
            max_bytes=settings.max_message_bytes,
            max_delay=timedelta(seconds=settings.max_delay_seconds),
            backoff=send_backoff,
        )
        self.watcher = PodWatcher(
            api,
            self.dispatcher,
            PodSelector(settings.gpu_taint_keys),
            KubernetesPodGroups(api, self.clock, ttl=timedelta(seconds=min(30.0, settings.resync_seconds))),
            self.metrics,
            field_selector=settings.field_selector,
            watch_timeout=settings.watch_timeout_seconds,
            backoff=watch_backoff,
            gangs=GangHold(api, self.metrics),
            placement=KubernetesPlacement(api, self.clock),
            claims=KubernetesClaims(api, self.clock),
        )
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._health: HealthServer | None = None

    # -- continuous -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._threads:
            raise RuntimeError("agent already started")
        self._stop.clear()
        if self.settings.health_port is not None:
            self._health = HealthServer(self.metrics, self.healthy, self.ready, port=self.settings.health_port)
            self._health.start()
        self._threads = [
            threading.Thread(target=self.watcher.run, args=(self._stop,), name="agent-watcher", daemon=True),
            threading.Thread(target=self.dispatcher.run, args=(self._stop,), name="agent-dispatcher", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        log.info("agent started for cluster %s, queue %s", self.settings.cluster, self.settings.queue_url)

    def stop(self, grace: float = 5.0) -> None:
        """Stop watching, then spend up to `grace` seconds delivering what is queued. What is still
        undelivered after that is found again by the next start's list (at least once, across restarts)."""
        self._stop.set()
        self.watcher.stop()
        self.dispatcher.wake()
        for thread in self._threads:
            thread.join(timeout=grace)
        stuck = any(t.is_alive() for t in self._threads)
        self._threads = []
        if not stuck:  # the dispatcher's state is its thread's alone while that thread runs
            self._deliver(grace)
        if self._health is not None:
            self._health.stop()
            self._health = None
        log.info("agent stopped; %d pod reports undelivered", self.dispatcher.undelivered)

    def __enter__(self) -> Agent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_until_ready(self, timeout: float = 10.0) -> bool:
        return self.watcher.synced.wait(timeout)

    # -- stepped --------------------------------------------------------------------------------------

    def run_once(self, timeout: float = 10.0) -> int:
        """List the pods, report what is due (new or changed pods, everything at a new resync window), and
        deliver it, retrying until `timeout`. Returns how many pods are pending."""
        self.watcher.sync()
        self.dispatcher.tick()
        self._deliver(timeout)
        return len(self.dispatcher.pending)

    def _deliver(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self.dispatcher.flush()
        while self.dispatcher.undelivered and time.monotonic() < deadline:
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))
            self.dispatcher.flush()

    # -- probes ---------------------------------------------------------------------------------------

    def healthy(self) -> bool:
        alive = bool(self._threads) and all(t.is_alive() for t in self._threads)
        return alive and self.clock.now() - self.dispatcher.heartbeat < _STALL

    def ready(self) -> bool:
        """The first list of pods is done, and the queue takes the agent's reports: an agent the queue refuses (a
        wrong queue URL, no identity with the stack's policy) reports nothing, and shows it as not Ready."""
        return self.watcher.synced.is_set() and self.dispatcher.refused_by_queue is None

    @property
    def health_port(self) -> int | None:
        return self._health.port if self._health is not None else None

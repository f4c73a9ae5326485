"""The whole emulator in one object: embedded AWS, local Kubernetes API, the pipeline runtime and the agent.

`gpu-autoscaler emulator` runs one until Ctrl-C; the demo and the end-to-end tests run one for a story.
Started in dependency order — the Kubernetes API (the RBAC of the shipped manifests applied, with the NVIDIA device
plugin's ConfigMap the project ships, as an operator applies it, and the plugin placed as the GPU Operator values
the project ships place it), AWS and its resources (a role per function, and the access entries that let the
Kubernetes callers' roles into the cluster), the node side (a kubelet reads its instance's user data and machine
from EC2), the pollers, schedules and instance watcher, and last the agent, which watches the Kubernetes API as its
ServiceAccount and sends pending GPU pods to the pending-pods queue as it does in a cluster.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
from gpu_autoscaler.emulator.aws import TEST_CREDENTIALS, EmbeddedAws
from gpu_autoscaler.emulator.cloud_controller import CLOUD_CONTROLLER_DELAY_SECONDS
from gpu_autoscaler.emulator.device_plugin import DEVICE_PLUGIN_DELAY_SECONDS, shipped_plugin_manifests
from gpu_autoscaler.emulator.instances import BOOT_DELAY_SECONDS
from gpu_autoscaler.emulator.kube_objects import CONFIGMAPS, NAMESPACES
from gpu_autoscaler.emulator.kubelet import NODE_READY_DELAY_SECONDS
from gpu_autoscaler.emulator.kubernetes_api import NODE_MONITOR_GRACE, KubeletNodeSide, LocalKubernetes
from gpu_autoscaler.emulator.runtime import PipelineRuntime

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path
    from types import TracebackType
    from typing import TextIO

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler_agent.agent import Agent

__all__ = ["AGENT_NAMESPACE", "AGENT_SERVICE_ACCOUNT", "EmulatorSession"]

AGENT_NAMESPACE = "gpu-autoscaler"
AGENT_SERVICE_ACCOUNT = "gpu-autoscaler-agent"
"""Where the shipped manifests run the agent (agent/deploy/serviceaccount.yaml, deployment.yaml)."""

log = logging.getLogger(__name__)


class EmulatorSession:
    def __init__(
        self,
        config: Config,
        *,
        port: int = 0,
        kube_port: int = 0,
        speed: float = 1.0,
        boot_delay: float = BOOT_DELAY_SECONDS,
        visibility_timeout: int | None = None,
        state_dir: Path | None = None,
        log_stream: TextIO | None = None,
        agent: bool = True,
        agent_resync_seconds: float = 60.0,
        functions_dir: Path | None = None,
        poll_wait_seconds: int = 2,
        function_timeouts: Mapping[str, int] | None = None,
    ) -> None:
        """`boot_delay`: seconds of emulated time from launch to the Node's registration (divided by `speed`, as
        are the kubelet's, the cloud controller manager's and the device plugin's delays after it: the Node is Ready,
        initialized and has its GPUs allocatable seconds later, as on EKS).
        `visibility_timeout` overrides the queues' (a quicker retry of failed messages), `function_timeouts`
        some functions' timeouts (keep each below its queue's visibility); `state_dir` holds the kubeconfig
        (a temporary directory when None)."""
        self.speed = speed
        self.kube = LocalKubernetes(port=kube_port, cluster_name=config.cluster_name, kubeconfig_dir=state_dir,
                                    device_plugin_delay=timedelta(seconds=DEVICE_PLUGIN_DELAY_SECONDS / speed),
                                    ready_delay=timedelta(seconds=NODE_READY_DELAY_SECONDS / speed),
                                    cloud_controller_delay=timedelta(seconds=CLOUD_CONTROLLER_DELAY_SECONDS / speed),
                                    node_monitor_grace=NODE_MONITOR_GRACE / speed)
        self.user_config = config
        self.config = config
        """The configuration the functions read: the user's, with `kubernetes.endpoint` the local API's (set on
        start, when its port is known), as the network ids map onto the emulator's own."""
        self._port = port
        self._visibility_timeout = visibility_timeout
        self._aws: EmbeddedAws | None = None
        self._boot_delay = boot_delay
        self._log_stream = log_stream
        self._with_agent = agent
        self._agent_resync = agent_resync_seconds
        self._functions_dir = functions_dir
        self._poll_wait = poll_wait_seconds
        self._function_timeouts = dict(function_timeouts or {})
        self.runtime: PipelineRuntime | None = None
        self.catalog: Catalog | None = None
        """Instance types and prices, for reports."""
        self.agent: Agent | None = None
        self.started_at: float | None = None

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> EmulatorSession:
        began = time.monotonic()
        try:
            self.kube.start()
            for document in shipped_plugin_manifests():  # applied by the cluster's operator, as the README says
                resource = {"Namespace": NAMESPACES, "ConfigMap": CONFIGMAPS}[document["kind"]]
                self.kube.api.create(resource, document["metadata"].get("namespace", ""), document)
            access = self.user_config.kubernetes.model_copy(update={"endpoint": self.kube.url,
                                                                    "certificate_authority": None})
            self.config = self.user_config.model_copy(update={"kubernetes": access})
            self._aws = EmbeddedAws(self.config, port=self._port, visibility_timeout=self._visibility_timeout)
            self._aws.start()
            self.kube.authenticator.sts_endpoint = self.aws.endpoint_url  # where EKS tokens are replayed
            # moto has no Pricing API: the catalog's bundled price snapshot answers, as it does in the functions.
            self.catalog = Ec2CatalogSource.from_config(self.aws.clients, self.config, use_pricing_api=False).catalog()
            self.runtime = PipelineRuntime(
                self.aws, nodes=KubeletNodeSide(self.kube, self.aws.clients.client("ec2")), speed=self.speed,
                boot_delay=self._boot_delay, functions_dir=self._functions_dir, log_stream=self._log_stream,
                poll_wait_seconds=self._poll_wait, function_timeouts=self._function_timeouts,
            ).start()
            if self._with_agent:
                self.agent = self._start_agent()
        except BaseException:
            self.stop()
            raise
        self.started_at = time.monotonic()
        log.info("emulator started in %.1f s", self.started_at - began)
        return self

    def _start_agent(self) -> Agent:
        from gpu_autoscaler_agent.agent import Agent
        from gpu_autoscaler_agent.settings import AgentSettings

        settings = AgentSettings(
            cluster=self.config.cluster_name, queue_url=self.aws.queue_url("pending-pods"),
            region=self.config.region, endpoint_url=self.aws.endpoint_url, kube_url=self.kube.url,
            health_port=None, resync_seconds=self._agent_resync,
        )
        # The agent runs as its ServiceAccount (agent/deploy), with the token its pod would be given, so RBAC allows
        # it what the shipped ClusterRole allows and nothing more.
        token = self.kube.service_account_token(AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT)
        agent = Agent(settings, api_client=self.kube.client(token), sqs_client=self.aws.clients.client("sqs"))
        agent.start()
        if not agent.wait_until_ready(timeout=10):
            log.warning("the agent has not listed the pods within 10 s; it keeps trying")
        return agent

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop(grace=2.0)
            self.agent = None
        if self.runtime is not None:
            self.runtime.stop()
        self.kube.stop()
        if self._aws is not None:
            self._aws.stop()

    def __enter__(self) -> EmulatorSession:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- what it hands out ---------------------------------------------------------------------------------

    @property
    def aws(self) -> EmbeddedAws:
        if self._aws is None:
            raise RuntimeError("the emulator is not started")
        return self._aws

    @property
    def pipeline(self) -> PipelineRuntime:
        if self.runtime is None:
            raise RuntimeError("the emulator is not started")
        return self.runtime

    def endpoints(self) -> dict[str, Any]:
        """Everything an outside client needs: AWS (endpoint, credentials, queues…) and Kubernetes."""
        runtime = self.pipeline
        return {
            **self.aws.endpoints(),
            "credentials": dict(TEST_CREDENTIALS),
            "kubernetesUrl": self.kube.url,
            "kubeconfig": str(self.kube.kubeconfig_path),
            "kubernetesToken": self.kube.token,
            "functions": self.pipeline.host.available(),
            "functionsMissing": runtime.missing,
            "schedules": {
                name: (t.isoformat() if t is not None else None) for name, t in runtime.scheduler.next_times().items()
            },
            "speed": self.speed,
            "bootDelaySeconds": self._boot_delay / self.speed,
            "agent": self.agent is not None,
        }

    def boot_delay(self) -> timedelta:
        return timedelta(seconds=self._boot_delay / self.speed)

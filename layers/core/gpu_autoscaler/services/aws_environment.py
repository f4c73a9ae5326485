"""What every function builds from its Lambda environment: one place, so the six factories differ only in
which of these pieces they hand their service.

Everything is built on first use and kept for the execution environment's life: a function that never
drains never makes a drain-queue client, and the packer that three functions share for replacements and
warm capacity is one object with one solver cache.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.adapters.aws.configuration import fetch_config
from gpu_autoscaler.clock import Clock, SystemClock
from gpu_autoscaler.errors import GpuAutoscalerError

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource
    from gpu_autoscaler.adapters.aws.drain_queue import SqsDrainQueue
    from gpu_autoscaler.adapters.aws.launch_queue import SqsLaunchQueue
    from gpu_autoscaler.adapters.aws.service_quotas import ServiceQuotasSource
    from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.pod_events import EventRecorder
    from gpu_autoscaler.ports import ClusterAPI
    from gpu_autoscaler.services.fleet import FleetService
    from gpu_autoscaler.services.packer import PackerService
    from gpu_autoscaler.services.tick_lease import TickLease
    from gpu_autoscaler.settings import FunctionSettings

__all__ = ["AwsEnvironment", "Deferred"]


class Deferred:
    """Stands in for a piece of the environment until it is used: the first attribute asked of it (a method
    call) builds the piece, and every later one goes to it. A function whose first duty is urgent builds the
    rest after it: the interruption function cordons a node before the packer, the fleet and the drain queue
    (and their boto3 clients, each a service model to load) exist."""

    def __init__(self, build: Callable[[], object]) -> None:
        self._build = build
        self._built: object | None = None

    def __getattr__(self, name: str) -> Any:
        if self._built is None:
            self._built = self._build()
        return getattr(self._built, name)


class AwsEnvironment:
    def __init__(self, settings: FunctionSettings, clock: Clock | None = None, *,
                 clients: AwsClients | None = None) -> None:
        """`clients`: the handler's own, when it makes clients outside the service too (idempotency), so each
        service's model is loaded once per execution environment."""
        self.settings = settings
        self.clock = clock or SystemClock()
        self.clients = clients or AwsClients(settings.region, settings.endpoint_url)

    @cached_property
    def config(self) -> Config:
        """Read at cold start by every factory: an invalid configuration fails there, naming the field."""
        return fetch_config(self.clients, self.settings)

    @cached_property
    def store(self) -> DynamoStateStore:
        from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore

        return DynamoStateStore(self.clients.client("dynamodb"), self.settings.table_name, self.config.cluster_name,
                                clock=self.clock)

    @cached_property
    def catalog(self) -> Ec2CatalogSource:
        from gpu_autoscaler.adapters.aws.catalog import Ec2CatalogSource

        return Ec2CatalogSource.from_config(self.clients, self.config, clock=self.clock)

    @cached_property
    def quotas(self) -> ServiceQuotasSource:
        from gpu_autoscaler.adapters.aws.service_quotas import ServiceQuotasSource

        return ServiceQuotasSource(self.clients.client("service-quotas"), self.config.vcpu_quotas,
                                   cloudwatch_client=self.clients.client("cloudwatch"), clock=self.clock)

    @cached_property
    def launch_queue(self) -> SqsLaunchQueue:
        from gpu_autoscaler.adapters.aws.launch_queue import SqsLaunchQueue

        if not self.settings.launch_queue_url:
            raise GpuAutoscalerError("LAUNCH_QUEUE_URL is not set: this function has nowhere to send launch requests")
        return SqsLaunchQueue(self.clients.client("sqs"), self.settings.launch_queue_url)

    @cached_property
    def drain_queue(self) -> SqsDrainQueue:
        from gpu_autoscaler.adapters.aws.drain_queue import SqsDrainQueue

        if not self.settings.drain_queue_url:
            raise GpuAutoscalerError("DRAIN_QUEUE_URL is not set: this function has nowhere to send drains")
        return SqsDrainQueue(self.clients.client("sqs"), self.settings.drain_queue_url)

    @cached_property
    def packer(self) -> PackerService:
        """The packer's own service: it builds and caches the solver over the current catalog, so prewarm,
        interruption replacements and consolidation plan with one copy of that logic."""
        from gpu_autoscaler.services.packer import PackerService

        return PackerService(self.config, self.store, self.catalog, self.launch_queue, clock=self.clock,
                             quotas=self.quotas, events=self.pod_events)

    @cached_property
    def pod_events(self) -> EventRecorder:
        """Events on the pods the packer decides for, posted through the EKS token as the other functions reach
        the API; connected on the first event."""
        from gpu_autoscaler.adapters.aws.eks_token import eks_api_client
        from gpu_autoscaler.adapters.kubernetes.events import KubernetesEventRecorder

        return KubernetesEventRecorder(lambda: eks_api_client(self.config, self.clients, self.clock), clock=self.clock)

    @cached_property
    def terminations(self) -> FleetService:
        """The fleet's termination path without a launch template: for the functions that only end claims."""
        from gpu_autoscaler.adapters.aws.fleet import Ec2Compute
        from gpu_autoscaler.services.fleet import FleetService

        return FleetService(self.config, self.store, Ec2Compute(self.clients.client("ec2"), self.config.cluster_name),
                            clock=self.clock)

    @cached_property
    def cluster(self) -> ClusterAPI:
        """The Kubernetes API with an EKS token, connected only when first used (most notices are not ours)."""
        from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
        from gpu_autoscaler.adapters.kubernetes.lazy import LazyCluster

        return LazyCluster(lambda: KubernetesCluster.for_eks(self.config, self.clients, self.clock))

    def tick_lease(self, function: str) -> TickLease:
        """The scheduled function's lease, an item of the state table beside the cluster's claims."""
        from gpu_autoscaler.adapters.aws.tick_leases import DynamoTickLeases
        from gpu_autoscaler.services.tick_lease import TickLease

        leases = DynamoTickLeases(self.clients.client("dynamodb"), self.settings.table_name, self.config.cluster_name)
        return TickLease(leases, function, self.clock)

"""The six Lambda functions, made in one loop from a small table of what differs between them.

Each gets its own role holding only the capabilities its spec lists, its own log group with a retention,
active tracing, the shared layer and the same environment contract (`gpu_autoscaler.settings`). With
`network.functions`, the Kubernetes API's clients run in the cluster's VPC (`FunctionPlacement`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from cdk_nag import NagSuppressions, RegexAppliesTo
from constructs import Construct

from gpu_autoscaler.config import config_digest
from gpu_autoscaler.naming import FUNCTIONS
from gpu_autoscaler.wiring import APPLICATION_LOG_LEVEL, FUNCTION_WIRING
from infra.permissions import Capability, Ec2Permissions, Wildcard
from infra.queues import WorkQueue

if TYPE_CHECKING:
    from aws_cdk import aws_dynamodb as dynamodb
    from aws_cdk import aws_ssm as ssm

    from gpu_autoscaler.config import Config, FunctionNetwork
    from gpu_autoscaler.naming import ResourceNames
    from gpu_autoscaler.wiring import FunctionWiring
    from infra.queues import WorkQueues

__all__ = [
    "ARCHITECTURE",
    "FUNCTION_SPECS",
    "HANDLER",
    "LOG_RETENTION",
    "RUNTIME",
    "FunctionPlacement",
    "FunctionSpec",
    "Functions",
]

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS_DIR = ROOT / "functions"

RUNTIME = lambda_.Runtime.PYTHON_3_14
"""The newest Python runtime aws-cdk-lib offers; the layer's wheels are installed for the same version."""
ARCHITECTURE = lambda_.Architecture.ARM_64
"""Graviton: cheaper per GB-second than x86, and every dependency ships manylinux aarch64 wheels."""
HANDLER = "handler.handler"
LOG_RETENTION = logs.RetentionDays.ONE_MONTH

_ALWAYS = frozenset({Capability.READ_EC2})


@dataclass(frozen=True)
class FunctionSpec:
    """A function's wiring (`gpu_autoscaler.wiring`, shared with the emulator) plus what only the stack needs."""

    wiring: FunctionWiring
    capabilities: frozenset[Capability]
    description: str = ""

    @property
    def name(self) -> str:
        return self.wiring.name

    @property
    def timeout_seconds(self) -> int:
        return self.wiring.timeout_seconds

    @property
    def memory_mb(self) -> int:
        return self.wiring.memory_mb

    @property
    def trigger(self) -> WorkQueue | None:
        """The queue feeding it, or None for the two functions EventBridge Scheduler invokes."""
        return WorkQueue(self.wiring.queue) if self.wiring.queue is not None else None

    @property
    def batch_size(self) -> int:
        return self.wiring.batch_size

    @property
    def batching_window_seconds(self) -> int:
        return self.wiring.batching_window_seconds

    @property
    def max_concurrency(self) -> int | None:
        return self.wiring.max_concurrency

    @property
    def recursive(self) -> bool:
        return self.wiring.recursive


FUNCTION_SPECS: tuple[FunctionSpec, ...] = (
    FunctionSpec(
        FUNCTION_WIRING["packer"],
        # KUBERNETES: it posts Events on the pods it decides for (see README, "Why is my pod pending").
        capabilities=frozenset({Capability.SEND_LAUNCH, Capability.READ_PRICES, Capability.KUBERNETES}),
        description="Pack pending GPU pods onto in-flight claims and new NodeClaims",
    ),
    FunctionSpec(
        FUNCTION_WIRING["fleet"],
        capabilities=frozenset({Capability.SEND_LAUNCH, Capability.READ_PRICES, Capability.LAUNCH,
                                Capability.OWNED_INSTANCES, Capability.TAG_CLAIMS}),
        description="Launch NodeClaims with EC2 CreateFleet (instant) and terminate owned instances",
    ),
    FunctionSpec(
        FUNCTION_WIRING["interruption"],
        capabilities=frozenset({Capability.SEND_LAUNCH, Capability.SEND_DRAIN, Capability.READ_PRICES,
                                Capability.OWNED_INSTANCES, Capability.KUBERNETES}),
        description="Act on Spot warnings, rebalance, state changes and scheduled events",
    ),
    FunctionSpec(
        FUNCTION_WIRING["drain"],
        capabilities=frozenset({Capability.SEND_DRAIN, Capability.OWNED_INSTANCES, Capability.KUBERNETES}),
        description="Cordon and evict, continue across invocations, terminate when empty",
    ),
    FunctionSpec(
        FUNCTION_WIRING["prewarm"],
        # No KUBERNETES: it plans warm claims and sends launch requests, and makes no Kubernetes request.
        capabilities=frozenset({Capability.SEND_LAUNCH, Capability.READ_PRICES}),
        description="Warm capacity for scaling windows and the demand forecast",
    ),
    FunctionSpec(
        FUNCTION_WIRING["consolidate"],
        capabilities=frozenset({Capability.SEND_LAUNCH, Capability.SEND_DRAIN, Capability.READ_PRICES,
                                Capability.OWNED_INSTANCES, Capability.KUBERNETES}),
        description="Reconcile registrations; drain empty and underused nodes within budgets",
    ),
)  # fmt: skip

if tuple(spec.name for spec in FUNCTION_SPECS) != FUNCTIONS:
    raise RuntimeError("FUNCTION_SPECS must list exactly gpu_autoscaler.naming.FUNCTIONS, in order")


class FunctionPlacement(Construct):
    """The configured VPC, subnets and security groups, imported by id, for the functions that call the Kubernetes
    API: a private-only endpoint is reached from within the cluster's VPC (EKS User Guide, cluster-endpoint.adoc:
    "All traffic to your cluster API server must come from within your cluster's VPC or a connected network").

    The groups are imported immutable: they are the user's, and the stack adds no rule to them. Each role placed
    gets the network interface actions Lambda creates and deletes the function's interfaces with (Lambda Developer
    Guide, configuration-vpc.html, "Required IAM permissions"): the roles are the stack's own, so CDK attaches no
    AWSLambdaVPCAccessExecutionRole, and an inline statement keeps every role free of managed policies."""

    ENI_ACTIONS = ("ec2:AssignPrivateIpAddresses", "ec2:CreateNetworkInterface", "ec2:DeleteNetworkInterface",
                   "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets", "ec2:UnassignPrivateIpAddresses")

    def __init__(self, scope: Construct, construct_id: str, *, network: FunctionNetwork) -> None:
        super().__init__(scope, construct_id)
        # Only the id is read: the subnets are selected by id below, so the zones (which CDK wants non-empty) are
        # the stack's unresolved ones, used by nothing.
        self.vpc = ec2.Vpc.from_vpc_attributes(self, "Vpc", vpc_id=network.vpc_id,
                                               availability_zones=Stack.of(self).availability_zones)
        self.subnets = ec2.SubnetSelection(
            subnets=[ec2.Subnet.from_subnet_id(self, f"Subnet{i}", subnet) for i, subnet in enumerate(network.subnets)])
        self.security_groups = [ec2.SecurityGroup.from_security_group_id(self, f"SecurityGroup{i}", group,
                                                                         mutable=False)
                                for i, group in enumerate(network.security_groups)]

    def statement(self) -> iam.PolicyStatement:
        """On `*`: the Describe actions have no resource-level permission, and the guide warns that a function whose
        role names no resource for DeleteNetworkInterface "may not be able to access the VPC"."""
        return iam.PolicyStatement(sid="LambdaVpcNetworkInterfaces", actions=list(self.ENI_ACTIONS), resources=["*"])


class Functions(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: Config,
        names: ResourceNames,
        layer: lambda_.ILayerVersion,
        queues: WorkQueues,
        table: dynamodb.ITable,
        parameter: ssm.IStringParameter,
        launch_template_id: str,
        launch_templates: dict[str, dict[str, str]],
        placement_groups: dict[str, str] | None = None,
    ) -> None:
        """`launch_templates`: template key → `{"id", "version"}` (`NodeLaunchTemplate.launch_templates`)."""
        super().__init__(scope, construct_id)
        self._names = names
        self._layer = layer
        self._queues = queues
        self._table = table
        self._parameter = parameter
        self._config_digest = config_digest(config.to_json())
        self._launch_template_id = launch_template_id
        self._launch_templates = launch_templates
        self._placement_groups = placement_groups or {}
        self._ec2 = Ec2Permissions(Stack.of(self), config,
                                   launch_template_ids=[t["id"] for t in self._launch_templates.values()],
                                   placement_groups=list(self._placement_groups.values()))
        network = config.network.functions
        self.placement = FunctionPlacement(self, "Placement", network=network) if network is not None else None
        self.functions: dict[str, lambda_.Function] = {}
        self.roles: dict[str, iam.Role] = {}
        for spec in FUNCTION_SPECS:
            self._create(spec)

    def environment(self, spec: FunctionSpec) -> dict[str, str]:
        """The variables `gpu_autoscaler.settings.FunctionSettings` reads, plus Powertools' own, plus OpenBLAS held
        to one thread: numpy loads it with a worker per core that spins for ~100 ms of CPU waiting for work the
        functions never give it (the packer's matrix products are small, integer ones never reach BLAS) — CPU
        taken from the cold start it happens in (importing the packer's handler: ~610 → ~510 ms of CPU, medians
        of four). And Tracer records no function's return value: it adds each traced method's return to its X-Ray
        subsegment, and the packer's names every unschedulable pod with its reason, so a large burst's subsegment
        passes what one UDP datagram to the X-Ray daemon holds (65,507 bytes; aws-xray-sdk's `UDPEmitter` logs the
        failure and drops it: the trace of the invocation one most wants is lost) and puts pod names in traces;
        the same summaries are in the function's log.

        `CONFIG_DIGEST`: a function reads the parameter once per execution environment, and a warm one lives for
        hours ("Lambda terminates execution environments every few hours", Lambda Developer Guide,
        lambda-runtime-environment.html). A deploy that changed the configuration alone changed only the
        parameter, so warm functions ran the old one beside cold starts running the new; with its digest here each
        function changes too, and Lambda runs the invocations after an update with the new configuration
        (UpdateFunctionConfiguration: "the function is processing events with the new configuration")."""
        env = {
            "CONFIG_PARAMETER": self._parameter.parameter_name,
            "CONFIG_DIGEST": self._config_digest,
            "TABLE_NAME": self._table.table_name,
            "LAUNCH_QUEUE_URL": self._queues.queues[WorkQueue.LAUNCH].queue_url,
            "DRAIN_QUEUE_URL": self._queues.queues[WorkQueue.DRAIN].queue_url,
            "POWERTOOLS_SERVICE_NAME": spec.name,
            "POWERTOOLS_METRICS_NAMESPACE": self._names.metrics_namespace,
            "OPENBLAS_NUM_THREADS": "1",
            "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
        }
        if spec.trigger is WorkQueue.PENDING_PODS:  # a document that can never parse is dead-lettered at once
            env["PENDING_PODS_DLQ_URL"] = self._queues.dead_letter_queues[WorkQueue.PENDING_PODS].queue_url
        if Capability.LAUNCH in spec.capabilities:
            env["LAUNCH_TEMPLATE_ID"] = self._launch_template_id
            env["LAUNCH_TEMPLATES"] = Stack.of(self).to_json_string(self._launch_templates)
            if self._placement_groups:
                env["PLACEMENT_GROUPS"] = Stack.of(self).to_json_string(self._placement_groups)
        return env

    def _create(self, spec: FunctionSpec) -> None:
        construct = spec.name.title()
        function_name = self._names.function(spec.name)
        code_dir = FUNCTIONS_DIR / spec.name
        if not code_dir.is_dir():
            raise FileNotFoundError(f"{code_dir} is missing: each function's code lives in functions/<name>/")
        log_group = logs.LogGroup(
            self,
            f"{construct}Logs",
            log_group_name=f"/aws/lambda/{function_name}",
            retention=LOG_RETENTION,
            removal_policy=RemovalPolicy.DESTROY,
        )
        role = iam.Role(
            self,
            f"{construct}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"gpu-autoscaler {spec.name} function: only what {spec.name} calls",
        )
        log_group.grant_write(role)
        self._table.grant_read_write_data(role)
        self._parameter.grant_read(role)
        tick = spec.wiring.tick_retry
        placement = self.placement if Capability.KUBERNETES in spec.capabilities else None
        if placement is not None:
            role.add_to_policy(placement.statement())
        function = lambda_.Function(
            self,
            construct,
            function_name=function_name,
            description=spec.description,
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            code=lambda_.Code.from_asset(str(code_dir), exclude=["__pycache__", "*.pyc", ".gitkeep"]),
            handler=HANDLER,
            layers=[self._layer],
            role=role,
            timeout=Duration.seconds(spec.timeout_seconds),
            memory_size=spec.memory_mb,
            tracing=lambda_.Tracing.ACTIVE,
            environment=self.environment(spec),
            log_group=log_group,
            # JSON, so the runtime's root handler writes the services' standard-library records as JSON lines
            # beside Powertools' own; the application level is what the runtime sets the root logger to.
            logging_format=lambda_.LoggingFormat.JSON,
            application_log_level_v2=lambda_.ApplicationLogLevel[APPLICATION_LOG_LEVEL],
            system_log_level_v2=lambda_.SystemLogLevel.WARN,
            recursive_loop=lambda_.RecursiveLoop.ALLOW if spec.recursive else lambda_.RecursiveLoop.TERMINATE,
            # Scheduler invokes asynchronously, so Lambda retries a failed tick (`TickRetry`), drops one past its
            # age, and sends one that still fails to the scheduler DLQ.
            on_failure=destinations.SqsDestination(self._queues.scheduler_dlq) if tick else None,
            retry_attempts=tick.retry_attempts if tick else None,
            max_event_age=Duration.seconds(tick.max_event_age_seconds) if tick else None,
            vpc=placement.vpc if placement else None,
            vpc_subnets=placement.subnets if placement else None,
            security_groups=placement.security_groups if placement else None,
        )
        if spec.trigger is WorkQueue.PENDING_PODS:
            self._queues.dead_letter_queues[WorkQueue.PENDING_PODS].grant_send_messages(role)
        if spec.trigger is not None:
            function.add_event_source(
                sources.SqsEventSource(
                    self._queues.queues[spec.trigger],
                    batch_size=spec.batch_size,
                    max_batching_window=Duration.seconds(spec.batching_window_seconds)
                    if spec.batching_window_seconds else None,
                    report_batch_item_failures=True,
                    max_concurrency=spec.max_concurrency,
                )
            )
        wildcards: list[Wildcard] = []
        for capability in sorted(spec.capabilities | _ALWAYS):
            if capability is Capability.SEND_LAUNCH:
                self._queues.queues[WorkQueue.LAUNCH].grant_send_messages(role)
            elif capability is Capability.SEND_DRAIN:
                self._queues.queues[WorkQueue.DRAIN].grant_send_messages(role)
            else:
                grant = self._ec2.grant(capability)
                for statement in grant.statements:
                    role.add_to_policy(statement)
                wildcards.extend(grant.wildcards)
        self._suppress(role, spec, wildcards, placed=placement is not None)
        self.functions[spec.name] = function
        self.roles[spec.name] = role

    @staticmethod
    def _suppress(role: iam.Role, spec: FunctionSpec, wildcards: list[Wildcard], *, placed: bool) -> None:
        star = ["xray:PutTraceSegments and xray:PutTelemetryRecords (active tracing)"]
        star.append("the EC2 Describe* calls, restricted to the configured region by aws:RequestedRegion")
        if placed:
            star.append("the network interface actions Lambda manages a VPC function's interfaces with (Lambda "
                        "Developer Guide, configuration-vpc.html, Required IAM permissions)")
        if Capability.READ_PRICES in spec.capabilities:
            star.append("pricing:GetProducts, servicequotas:GetAWSDefaultServiceQuota and cloudwatch:GetMetricData")
        suppressions: list[dict[str, Any]] = [
            {
                "id": "AwsSolutions-IAM5",
                "reason": "Resource '*' only for actions that have no resource-level permissions: "
                + "; ".join(star)
                + ".",
                "appliesTo": ["Resource::*"],
            }
        ]
        for wildcard in wildcards:
            suppressions.append(
                {
                    "id": "AwsSolutions-IAM5",
                    "reason": wildcard.reason,
                    "appliesTo": [RegexAppliesTo(regex=wildcard.pattern)],
                }
            )
        NagSuppressions.add_resource_suppressions(role, suppressions, apply_to_children=True)

"""The stack: composes one construct per capability and exports what users and the agent need."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CfnOutput, Duration, Environment, Stack, Tags

from gpu_autoscaler.models.labels import TAG_CLUSTER
from gpu_autoscaler.naming import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, FUNCTIONS_KUBERNETES_GROUP, ResourceNames
from infra.access_entries import FunctionAccessEntries
from infra.agent import AgentAccess
from infra.configuration import ConfigParameter
from infra.events import InterruptionRules
from infra.functions import ARCHITECTURE, FUNCTION_SPECS, RUNTIME, Functions
from infra.layer import CoreLayer
from infra.monitoring import Monitoring
from infra.nodes import NodeLaunchTemplate
from infra.permissions import Capability
from infra.queues import WorkQueue, WorkQueues
from infra.schedules import Schedules
from infra.table import StateTable
from infra.teardown import Teardown

if TYPE_CHECKING:
    from aws_cdk import aws_iam as iam
    from constructs import Construct

    from gpu_autoscaler.config import Config

__all__ = ["GpuAutoscalerStack", "stack_id"]


def stack_id(cluster_name: str) -> str:
    return ResourceNames(cluster_name).stack


class GpuAutoscalerStack(Stack):
    """Everything of one cluster's gpu-autoscaler. Account-agnostic: synth needs no credentials; the region is
    the configuration's, so a deploy lands next to the cluster whatever the caller's default region."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: Config,
        layer_dependencies: bool | None = None,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            env=Environment(region=config.region),
            description=f"gpu-autoscaler for Kubernetes cluster {config.cluster_name}",
        )
        self.config = config
        names = ResourceNames(config.cluster_name)
        Tags.of(self).add(TAG_CLUSTER, config.cluster_name)

        self.table = StateTable(self, "State", names=names).table
        self.parameter = ConfigParameter(self, "Config", config=config, names=names).parameter
        timeouts = {
            spec.trigger: Duration.seconds(spec.timeout_seconds) for spec in FUNCTION_SPECS if spec.trigger is not None
        }
        self.queues = WorkQueues(self, "Queues", names=names, consumer_timeouts=timeouts)
        self.nodes = NodeLaunchTemplate(self, "Nodes", config=config, names=names)
        self.layer = CoreLayer(
            self, "Core", runtime=RUNTIME, architecture=ARCHITECTURE, install_dependencies=layer_dependencies
        )
        self.functions = Functions(
            self,
            "Functions",
            config=config,
            names=names,
            layer=self.layer.layer,
            queues=self.queues,
            table=self.table,
            parameter=self.parameter,
            launch_template_id=self.nodes.launch_template_id,
            launch_templates=self.nodes.launch_templates,
            placement_groups=self.nodes.placement_group_names,
        )
        self.access_entries = FunctionAccessEntries(
            self, "AccessEntries", cluster_name=config.cluster_name, roles=self.kubernetes_roles
        ) if config.kubernetes.eks_access else None
        self.interruption_rules = InterruptionRules(
            self,
            "InterruptionRules",
            cluster_name=config.cluster_name,
            queue=self.queues.queues[WorkQueue.INTERRUPTION],
            dead_letter_queue=self.queues.dead_letter_queues[WorkQueue.INTERRUPTION],
        )
        self.schedules = Schedules(
            self,
            "Schedules",
            names=names,
            windows=list(config.scaling_windows),
            functions=dict(self.functions.functions),
            dead_letter_queue=self.queues.scheduler_dlq,
        )
        # Deleted in reverse dependency order: whatever can launch first, then the hook that ends the instances
        # (`infra.teardown`), then the instance profile, launch templates and placement groups they run on.
        self.teardown = Teardown(self, "Teardown", config=config, layer=self.layer.layer)
        self.teardown.resource.node.add_dependency(self.nodes)
        for launcher in (self.functions, self.interruption_rules, self.schedules):
            launcher.node.add_dependency(self.teardown.resource)
        self.agent = AgentAccess(
            self,
            "Agent",
            queue=self.queues.queues[WorkQueue.PENDING_PODS],
            cluster_name=config.cluster_name,
            associate=config.kubernetes.eks_access,
        )
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            names=names,
            region=config.region,
            functions=self.functions.functions,
            queues={kind.value: queue for kind, queue in self.queues.queues.items()},
            dead_letter_queues=self.queues.all_dead_letter_queues,
        )
        self._outputs()

    @property
    def kubernetes_roles(self) -> dict[str, iam.Role]:
        """The roles of the functions that call the Kubernetes API, by function name."""
        return {spec.name: self.functions.roles[spec.name] for spec in FUNCTION_SPECS
                if Capability.KUBERNETES in spec.capabilities}

    def _outputs(self) -> None:
        for kind, queue in self.queues.queues.items():
            label = "".join(part.title() for part in kind.value.split("-"))
            CfnOutput(self, f"{label}QueueUrl", value=queue.queue_url, description=f"the {kind.value} queue")
        CfnOutput(self, "TableName", value=self.table.table_name)
        CfnOutput(self, "ConfigParameterName", value=self.parameter.parameter_name)
        CfnOutput(
            self,
            "AgentPolicyArn",
            value=self.agent.policy.managed_policy_arn,
            description="attach to the agent's role: send to the pending-pods queue only",
        )
        CfnOutput(
            self,
            "AgentRoleArn",
            value=self.agent.role.role_arn,
            description=f"the agent's EKS Pod Identity role (carries AgentPolicyArn), for {AGENT_NAMESPACE}/"
            f"{AGENT_SERVICE_ACCOUNT}: "
            + ("the stack associates it" if self.agent.association is not None
               else "associate it (aws eks create-pod-identity-association)"),
        )
        CfnOutput(self, "LaunchTemplateId", value=self.nodes.launch_template_id)
        CfnOutput(self, "AlarmTopicArn", value=self.monitoring.topic.topic_arn,
                  description="every alarm publishes here when it fires and clears: subscribe to be told")
        for name, role in self.kubernetes_roles.items():
            CfnOutput(
                self,
                f"{name.title()}RoleArn",
                value=role.role_arn,
                description=f"{name}'s role, in the Kubernetes group {FUNCTIONS_KUBERNETES_GROUP} by the stack's "
                "EKS access entry" if self.access_entries is not None else
                f"{name}'s role: map it to the Kubernetes group {FUNCTIONS_KUBERNETES_GROUP} in aws-auth",
            )

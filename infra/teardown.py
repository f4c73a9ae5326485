"""The stack's deletion hook: a custom resource whose Delete terminates the instances the functions launched, and
holds the stack's deletion until EC2 shows none left (`gpu_autoscaler.services.teardown`).

Ordered by CloudFormation's dependency rule: "Resource A is deleted before resource B" when A depends on B
(DependsOn attribute). The resource depends on the instance profile, the launch templates and the placement
groups, so they are deleted after every instance is gone; and whatever can launch (the functions, their event
source mappings, the EventBridge rules and the Scheduler schedules) depends on it, so it is all deleted first and
nothing launches while the hook ends the instances.

CDK's Provider framework runs it asynchronously: `on_event`, then `is_complete` every `QUERY_INTERVAL` until it
answers true or `TOTAL_TIMEOUT` passes, which fails the deletion. The framework takes up to one hour ("The
maximum timeout is 1 hour (yes, it can exceed the AWS Lambda 15 minutes)", aws-cdk-lib `ProviderProps.
totalTimeout`), as long as a custom resource may take by default (ServiceTimeout, 3600 s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources as cr
from cdk_nag import NagSuppressions, RegexAppliesTo
from constructs import Construct

from gpu_autoscaler.wiring import APPLICATION_LOG_LEVEL
from infra.functions import ARCHITECTURE, FUNCTIONS_DIR, LOG_RETENTION, RUNTIME
from infra.permissions import Ec2Permissions, Wildcard

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config

__all__ = ["HANDLER_TIMEOUT", "QUERY_INTERVAL", "RESOURCE_TYPE", "TOTAL_TIMEOUT", "Teardown"]

RESOURCE_TYPE = "Custom::TerminateInstances"
TOTAL_TIMEOUT = Duration.minutes(30)
"""EC2 ends an instance within minutes once TerminateInstances is called (shutting-down, then terminated); a GPU
instance's shutdown runs its OS and containers' stop first. Half the framework's hour, so a deletion stuck on an
instance fails while one can still look."""
QUERY_INTERVAL = Duration.seconds(15)
HANDLER_TIMEOUT = Duration.minutes(5)
"""One pass: DescribeInstances pages, then TerminateInstances per 1000 ids, each id asked alone (with backoff) if
the call fails for one of them."""


class Teardown(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: Config, layer: lambda_.ILayerVersion) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                             description="gpu-autoscaler teardown: end this cluster's instances when the stack goes")
        grant = Ec2Permissions(stack, config, launch_template_ids=[]).teardown()
        for statement in grant.statements:
            self.role.add_to_policy(statement)
        self.handlers = {name: self._handler(name, layer) for name in ("on_event", "is_complete")}
        framework_logs = logs.LogGroup(self, "FrameworkLogs", retention=LOG_RETENTION,
                                       removal_policy=RemovalPolicy.DESTROY)
        # Two roles, as the framework asks ("please ensure you specify a different IAM Role for
        # 'frameworkCompleteAndTimeoutRole' from 'frameworkOnEventRole'"), each writing to its log group only.
        framework_roles = {
            name: iam.Role(self, f"Framework{name}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                           description=f"gpu-autoscaler teardown: the custom resource framework's {name}")
            for name in ("OnEvent", "CompleteAndTimeout")
        }
        for role in framework_roles.values():
            framework_logs.grant_write(role)
        self.provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=self.handlers["on_event"],
            is_complete_handler=self.handlers["is_complete"],
            total_timeout=TOTAL_TIMEOUT,
            query_interval=QUERY_INTERVAL,
            log_group=framework_logs,
            framework_on_event_role=framework_roles["OnEvent"],
            framework_complete_and_timeout_role=framework_roles["CompleteAndTimeout"],
        )
        self.resource = CustomResource(
            self,
            "Instances",
            service_token=self.provider.service_token,
            resource_type=RESOURCE_TYPE,
            properties={"ClusterName": config.cluster_name},
        )
        self._suppress(grant.wildcards, list(framework_roles.values()))

    def _handler(self, name: str, layer: lambda_.ILayerVersion) -> lambda_.Function:
        construct = "".join(part.title() for part in name.split("_"))
        log_group = logs.LogGroup(self, f"{construct}Logs", retention=LOG_RETENTION,
                                  removal_policy=RemovalPolicy.DESTROY)
        log_group.grant_write(self.role)
        return lambda_.Function(
            self,
            construct,
            description=f"gpu-autoscaler teardown ({name}): terminate this cluster's instances when the stack goes",
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            code=lambda_.Code.from_asset(str(FUNCTIONS_DIR / "teardown"), exclude=["__pycache__", "*.pyc"]),
            handler=f"handler.{name}",
            layers=[layer],
            role=self.role,
            timeout=HANDLER_TIMEOUT,
            memory_size=256,
            log_group=log_group,
            logging_format=lambda_.LoggingFormat.JSON,  # as the functions', so the service's INFO lines are logged
            application_log_level_v2=lambda_.ApplicationLogLevel[APPLICATION_LOG_LEVEL],
            system_log_level_v2=lambda_.SystemLogLevel.WARN,
        )

    def _suppress(self, wildcards: list[Wildcard], framework_roles: list[iam.Role]) -> None:
        NagSuppressions.add_resource_suppressions(self.role, [
            {"id": "AwsSolutions-IAM5", "appliesTo": ["Resource::*"],
             "reason": "ec2:DescribeInstances has no resource-level permissions; it is held to the configured "
                       "region by aws:RequestedRegion."},
            *({"id": "AwsSolutions-IAM5", "reason": w.reason, "appliesTo": [RegexAppliesTo(regex=w.pattern)]}
              for w in wildcards),
        ], apply_to_children=True)
        invoke_versions = {
            "id": "AwsSolutions-IAM5",
            "reason": "CDK's custom resource Provider framework grants lambda:InvokeFunction on its handlers' ARNs "
                      "and their versions and aliases (`<arn>:*`): these functions only, no other.",
            "appliesTo": [RegexAppliesTo(regex=r"/^Resource::<Teardown[A-Za-z0-9]+\.Arn>:\*$/g")],
        }
        for role in framework_roles:
            NagSuppressions.add_resource_suppressions(role, [invoke_versions], apply_to_children=True)
        machine = self.provider.node.find_child("waiter-state-machine")
        NagSuppressions.add_resource_suppressions(machine, [
            invoke_versions,
            {"id": "AwsSolutions-SF1",
             "reason": "The framework's waiter only invokes the is_complete handler every query interval; each "
                       "poll's outcome (instances terminated, waited for) is in that handler's log group."},
            {"id": "AwsSolutions-SF2",
             "reason": "The Provider framework's waiter state machine takes no tracing setting; it holds no "
                       "logic of ours, and each of its steps is a Lambda invocation logged by the handler."},
        ], apply_to_children=True)

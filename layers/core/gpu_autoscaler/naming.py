"""Names of the deployed resources, derived from the cluster name.

The stack, the emulator and `invoke` all derive them here, so a command can find a deployment's
queues, table and parameter from the configuration alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = [
    "AGENT_NAMESPACE", "AGENT_SERVICE_ACCOUNT", "FUNCTIONS", "FUNCTIONS_KUBERNETES_GROUP", "NAME_LIMITS",
    "PARTITION_KEY", "SORT_KEY", "TTL_ATTRIBUTE", "ResourceNames", "fit", "log_service",
]

FUNCTIONS = ("packer", "fleet", "interruption", "drain", "prewarm", "consolidate")

FUNCTIONS_KUBERNETES_GROUP = "gpu-autoscaler-functions"
"""The Kubernetes group the functions that call the Kubernetes API are in: the stack's EKS access entries (or the
user's aws-auth mapping) put their roles in it, and `agent/deploy/functions-rbac.yaml` (the chart's
`functions-rbac.yaml` likewise) binds it. EKS does not check that a binding names an entry's group (EKS User
Guide, grant-k8s-access.adoc), so every place spells it from here or is tested against it."""

AGENT_NAMESPACE = "gpu-autoscaler"
AGENT_SERVICE_ACCOUNT = "gpu-autoscaler-agent"
"""Where the in-cluster agent runs, as both installs make it (agent/deploy's kustomization; the chart, installed
into the namespace the README's `helm install` names): the stack's Pod Identity association and its role's trust
name exactly this service account."""


def log_service(function: str) -> str:
    """The service a function's Powertools Logger logs as: `gpu-autoscaler-fleet`, not `fleet`.

    Powertools' Logger adds a filter to the Lambda runtime's root handler that drops every record whose logger
    name *contains* the service name (`SuppressFilter`, so that its own records are not printed twice). Named
    `fleet`, it dropped every line of `gpu_autoscaler.services.fleet` and `gpu_autoscaler.adapters.aws.fleet`
    ("CreateFleet refused …") before CloudWatch saw it. A hyphen is in no module's name."""
    return f"gpu-autoscaler-{function}"

# The single table's key schema: the stack, the emulator and the state store agree on it here.
PARTITION_KEY = "PK"
SORT_KEY = "SK"
TTL_ATTRIBUTE = "expiresAt"


NAME_LIMITS = {
    "function": 64,
    "queue": 80,
    "schedule_group": 64,
    "rule": 64,
    "role": 64,
    "table": 255,
    "launch_template": 128,
    "instance_profile": 128,
    "alarm": 255,
    "dashboard": 255,
}
"""The length AWS allows each kind of name (Lambda CreateFunction `FunctionName` 64; SQS CreateQueue `QueueName`
80 with the `.fifo` suffix; EventBridge Scheduler CreateScheduleGroup `Name` 64; EventBridge PutRule `Name` 64;
IAM CreateRole `RoleName` 64 and CreateInstanceProfile 128; DynamoDB CreateTable `TableName` 255; EC2
CreateLaunchTemplate `LaunchTemplateName` 128; CloudWatch PutMetricAlarm `AlarmName` 255 and PutDashboard 255),
from each API reference's request parameters."""

DIGEST_LENGTH = 8


def fit(name: str, limit: int, *, keep: str = "") -> str:
    """`name + keep` as it is when it fits in `limit`; otherwise `name` cut, then `-<digest>` and `keep`.

    The digest is of the whole name, so a shortened name is stable across deploys and two clusters whose long
    names share a prefix still get different names. `keep` is what must survive (`-pending-pods-dlq.fifo`, a
    function's own name), so the end of a name stays readable and a FIFO queue keeps its suffix.
    """
    if len(name) + len(keep) <= limit:
        return name + keep
    digest = hashlib.sha256((name + keep).encode()).hexdigest()[:DIGEST_LENGTH]
    room = limit - len(keep) - DIGEST_LENGTH - 1
    if room < 1:
        raise ValueError(f"'{keep}' leaves no room for a name within {limit} characters")
    return f"{name[:room].rstrip('-_')}-{digest}{keep}"


@dataclass(frozen=True)
class ResourceNames:
    """Every physical name of a deployment. A cluster name may have 100 characters (EKS's limit); each name
    here stays within its own AWS limit (`NAME_LIMITS`), unchanged when it already fits."""

    cluster: str

    @property
    def prefix(self) -> str:
        return f"{self.cluster}-gpu-autoscaler"

    def _fit(self, kind: str, suffix: str = "") -> str:
        return fit(self.prefix, NAME_LIMITS[kind], keep=suffix)

    @property
    def stack(self) -> str:
        """The CloudFormation stack (`doctor` reads its outputs after a deploy)."""
        return "GpuAutoscaler-" + self.cluster.replace("_", "-")

    @property
    def table(self) -> str:
        return self._fit("table")

    @property
    def config_parameter(self) -> str:
        """SSM allows 1,011 characters with the ARN: a 100-character cluster name always fits."""
        return f"/gpu-autoscaler/{self.cluster}/config"

    @property
    def pending_pods_queue(self) -> str:
        return self._fit("queue", "-pending-pods.fifo")

    @property
    def pending_pods_dlq(self) -> str:
        return self._fit("queue", "-pending-pods-dlq.fifo")

    @property
    def interruption_queue(self) -> str:
        return self._fit("queue", "-interruption")

    @property
    def launch_queue(self) -> str:
        return self._fit("queue", "-launch")

    @property
    def drain_queue(self) -> str:
        return self._fit("queue", "-drain")

    @property
    def scheduler_dlq(self) -> str:
        return self._fit("queue", "-scheduler-dlq")

    @property
    def launch_template(self) -> str:
        """The nodes' launch template (pinned AMI, instance profile, security groups, IMDSv2)."""
        return self._fit("launch_template", "-node")

    def capacity_launch_template(self, capacity_type: str) -> str:
        """The launch template of one capacity type (`domain.launch_templates`): On-Demand's is `launch_template`."""
        if capacity_type == "on-demand":
            return self.launch_template
        return self._fit("launch_template", f"-node-{capacity_type}")

    def instance_profile(self, region: str) -> str:
        """The instance profile wrapping the configured node role. IAM names are global to the account and EKS
        cluster names unique only per region, so the region is in it: one cluster name in two regions deploys
        twice (Karpenter hashes the region into its instance profiles' names likewise, karpenter-provider-aws
        pkg/apis/v1/ec2nodeclass.go `InstanceProfileName`)."""
        return self._fit("instance_profile", f"-{region}-node")

    @property
    def metrics_namespace(self) -> str:
        """The functions' own metrics, one namespace per cluster, so that two clusters in one account and region
        never add up in one series (a dashboard or alarm of one counting the other's failures). The stack gives
        it to each function as `POWERTOOLS_METRICS_NAMESPACE`."""
        return f"GpuAutoscaler/{self.cluster}"

    @property
    def interruption_dlq(self) -> str:
        return self._fit("queue", "-interruption-dlq")

    @property
    def launch_dlq(self) -> str:
        return self._fit("queue", "-launch-dlq")

    @property
    def drain_dlq(self) -> str:
        return self._fit("queue", "-drain-dlq")

    def function(self, name: str) -> str:
        return self._fit("function", f"-{name}")

    def function_of(self, physical_name: str) -> str | None:
        """The short name (`prewarm`) of one of this deployment's functions from its physical name, else None."""
        return next((name for name in FUNCTIONS if self.function(name) == physical_name), None)

    def rule(self, name: str) -> str:
        """An EventBridge rule (the stack lets CloudFormation name its rules; the emulator names its own)."""
        return self._fit("rule", f"-{name}")

    def role(self, name: str) -> str:
        """An IAM role the emulator creates (the stack lets CloudFormation name its roles)."""
        return self._fit("role", f"-{name}")

    def alarm(self, label: str) -> str:
        return self._fit("alarm", f"-{label}")

    def dashboard(self, region: str) -> str:
        """The region is in it: "All dashboards in your account are global, not region-specific"
        (AWS::CloudWatch::Dashboard)."""
        return self._fit("dashboard", f"-{region}")

    def schedule_group(self) -> str:
        return self._fit("schedule_group")

    def event_bus(self) -> str:
        return "default"

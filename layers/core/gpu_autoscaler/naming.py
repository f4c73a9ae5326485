"""Names of the deployed resources, derived from the cluster name.

The stack, the emulator and `invoke` all derive them here, so a command can find a deployment's
queues, table and parameter from the configuration alone.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FUNCTIONS", "PARTITION_KEY", "SORT_KEY", "TTL_ATTRIBUTE", "ResourceNames"]

FUNCTIONS = ("packer", "fleet", "interruption", "drain", "prewarm", "consolidate")

# The single table's key schema: the stack, the emulator and the state store agree on it here.
PARTITION_KEY = "PK"
SORT_KEY = "SK"
TTL_ATTRIBUTE = "expiresAt"


@dataclass(frozen=True)
class ResourceNames:
    cluster: str

    @property
    def prefix(self) -> str:
        return f"{self.cluster}-gpu-autoscaler"

    @property
    def table(self) -> str:
        return self.prefix

    @property
    def config_parameter(self) -> str:
        return f"/gpu-autoscaler/{self.cluster}/config"

    @property
    def pending_pods_queue(self) -> str:
        return f"{self.prefix}-pending-pods.fifo"

    @property
    def pending_pods_dlq(self) -> str:
        return f"{self.prefix}-pending-pods-dlq.fifo"

    @property
    def interruption_queue(self) -> str:
        return f"{self.prefix}-interruption"

    @property
    def launch_queue(self) -> str:
        return f"{self.prefix}-launch"

    @property
    def drain_queue(self) -> str:
        return f"{self.prefix}-drain"

    @property
    def scheduler_dlq(self) -> str:
        return f"{self.prefix}-scheduler-dlq"

    @property
    def launch_template(self) -> str:
        """The nodes' launch template (pinned AMI, instance profile, security groups, IMDSv2)."""
        return f"{self.prefix}-node"

    def capacity_launch_template(self, capacity_type: str) -> str:
        """The launch template of one capacity type (`domain.launch_templates`): On-Demand's is `launch_template`."""
        return self.launch_template if capacity_type == "on-demand" else f"{self.launch_template}-{capacity_type}"

    @property
    def instance_profile(self) -> str:
        """The instance profile wrapping the configured node role."""
        return f"{self.prefix}-node"

    @property
    def metrics_namespace(self) -> str:
        return "GpuAutoscaler"

    def dlq(self, queue: str) -> str:
        """The dead-letter queue of a standard queue."""
        return f"{queue}-dlq"

    def function(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def schedule_group(self) -> str:
        return self.prefix

    def event_bus(self) -> str:
        return "default"

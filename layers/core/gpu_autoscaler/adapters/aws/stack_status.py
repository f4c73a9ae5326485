"""`StackStatus` over CloudFormation DescribeStacks, asked by the stack's unique id (its ARN), which names this one
stack even once a newer stack of the same name exists ("StackName: The name or the unique stack ID")."""

from __future__ import annotations

from typing import Any

__all__ = ["CloudFormationStackStatus"]


class CloudFormationStackStatus:
    def __init__(self, cloudformation_client: Any) -> None:
        self._cloudformation = cloudformation_client

    def status(self, stack_id: str) -> str:
        [stack] = self._cloudformation.describe_stacks(StackName=stack_id)["Stacks"]
        return str(stack["StackStatus"])

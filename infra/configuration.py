"""The configuration, published where the Lambdas read it: one SSM parameter holding `Config.to_json()`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import aws_ssm as ssm
from constructs import Construct

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.naming import ResourceNames

__all__ = ["ConfigParameter"]


class ConfigParameter(Construct):
    """Advanced tier: a configuration with several pools and windows passes the standard tier's 4 KB."""

    def __init__(self, scope: Construct, construct_id: str, *, config: Config, names: ResourceNames) -> None:
        super().__init__(scope, construct_id)
        self.parameter = ssm.StringParameter(
            self,
            "Parameter",
            parameter_name=names.config_parameter,
            string_value=config.to_json(),
            tier=ssm.ParameterTier.ADVANCED,
            description=f"gpu-autoscaler configuration of cluster {config.cluster_name} (from cdk.json)",
        )

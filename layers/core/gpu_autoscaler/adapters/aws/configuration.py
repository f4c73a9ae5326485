"""The configuration as the Lambdas read it: the JSON the stack writes to one SSM parameter."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gpu_autoscaler.config import parse_config

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.settings import FunctionSettings

__all__ = ["fetch_config"]


def fetch_config(clients: AwsClients, settings: FunctionSettings) -> Config:
    """Read and validate the configuration; an invalid one fails the cold start with the field at fault."""
    raw = clients.client("ssm").get_parameter(Name=settings.config_parameter)["Parameter"]["Value"]
    return parse_config(json.loads(raw))

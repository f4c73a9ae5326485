"""The configuration as the Lambdas read it: the JSON the stack writes to one SSM parameter."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from gpu_autoscaler.config import config_digest, parse_config

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.settings import FunctionSettings

__all__ = ["fetch_config"]

logger = logging.getLogger(__name__)


def fetch_config(clients: AwsClients, settings: FunctionSettings) -> Config:
    """Read and validate the configuration; an invalid one fails the cold start with the field at fault.

    A parameter other than the one the function was deployed with (`CONFIG_DIGEST`) is read, with a warning:
    CloudFormation updates the parameter before the functions that reference it (DependsOn attribute: "Resource B
    is updated before resource A"), so a cold start between the two reads the next deploy's configuration, keys
    a newer version added included: those are ignored, with a warning (`parse_config`'s `unknown_keys`)."""
    raw = clients.client("ssm").get_parameter(Name=settings.config_parameter)["Parameter"]["Value"]
    digest = config_digest(raw)
    if settings.config_digest is not None and digest != settings.config_digest:
        logger.warning("configuration parameter %s has digest %s, this function was deployed with %s: "
                       "a deploy is under way, or the parameter was changed outside the stack",
                       settings.config_parameter, digest, settings.config_digest)
    return parse_config(json.loads(raw), unknown_keys="ignore")
